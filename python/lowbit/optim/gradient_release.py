"""Gradient release: each parameter steps from a post-accumulate-grad hook as soon as backward() has summed its
gradient, and the gradient is freed at once, so a model never holds all its gradients (optim/gradient_release.h
is the C++ side, with the same rules).

    opt = lowbit.optim.AdamW(model.parameters(), state_format="Q8")
    release = lowbit.optim.GradientRelease(opt)
    for x, y in batches:
        loss_fn(model(x), y).backward()   # steps every parameter; call neither opt.step() nor zero_grad()

Each parameter's result is bit for bit the one opt.step() would give it after the whole backward. What needs
every gradient at once cannot work: max_grad_norm > 0 is refused, and the non-finite check applies per
parameter (a parameter whose gradient holds Inf or NaN is not stepped; skipped_steps() counts one per such
parameter). GradScaler cannot reach the hooks either: use bf16 autocast, or step without release.
"""
from typing import List

import torch

from .optimizer import LowbitOptimizer


class GradientRelease:
    def __init__(self, optimizer: LowbitOptimizer):
        if not isinstance(optimizer, LowbitOptimizer):
            raise TypeError(f"lowbit.optim.GradientRelease: expected a lowbit.optim optimizer, got "
                            f"{type(optimizer).__name__}")
        for gi, group in enumerate(optimizer.param_groups):
            if group["max_grad_norm"] > 0:
                raise ValueError(f"lowbit.optim.GradientRelease: param group {gi} clips to max_grad_norm "
                                 f"{group['max_grad_norm']}, which needs every gradient at once; set it to 0")
        self.optimizer = optimizer
        self.accumulating = False  # True for every micro-batch but the last: gradients add up in .grad
        self.released = 0          # parameters stepped by the hooks so far
        self._handles: List = [p.register_post_accumulate_grad_hook(self._hook)
                               for group in optimizer.param_groups for p in group["params"]]

    def _hook(self, p: torch.Tensor) -> None:
        if self.accumulating:
            return
        self.optimizer.step_parameters([p])
        p.grad = None
        self.released += 1

    def remove(self) -> None:
        """Takes the hooks off: the optimizer steps from step() again."""
        for h in self._handles:
            h.remove()
        self._handles = []
