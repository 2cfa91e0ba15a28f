"""Steps recorded once and replayed, as the C++ optimizers do (optim/step_graph.h): once a step's inputs repeat
(the same parameters and gradient addresses, options and state), the step's device work (the gradient check and
every op call) is captured as a CUDA graph and from then on replayed with one launch while the inputs stay the
same. Over thousands of small tensors the host's part of a step is then one read of each parameter and its
gradient (torch.classes.lowbit.StepGraphInputs, which holds the parameter list once: handing thousands of tensors to
an op each step would cost more than reading them) instead of building, dispatching and checking the op's arguments.
A replay computes the same bits as the step it replaces: the same kernels on the same addresses, reading lr, the
step counts, the skip flag and GradScaler's tensors where they live on the device.

What a recording cannot see is part of its inputs: every param group's options but lr (a kernel argument, so a
changed beta is a new recording; lr is read from the group's device tensor, written before each replay), whether
GradScaler's tensors are there (their values are copied into the recording's own before each replay), and the
optimizer's state epoch (state made or loaded). Gradients that move every few steps stop the recording after
MAX_DROPPED recordings thrown away, with a warning, as in C++."""
import operator
import warnings
from typing import Callable, Optional

import torch

from . import dtensor_shards

MAX_DROPPED = 8


def same_tensors(a, b) -> bool:
    """Whether two lists hold the very same tensors, in order (identity: a tensor's == compares values)."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


class StepGraph:
    def __init__(self):
        self.enabled = True
        self.replays = 0
        self._graph = None      # torch.cuda.CUDAGraph of the recorded step
        self._recorded = None   # the inputs it was recorded for
        self._last = None       # the last step's inputs, when it ran as it came
        self._amp = None        # (found_inf, scale): the recording's own copies of GradScaler's tensors
        self._dropped = 0
        self._stream = None
        self._inputs = None     # (the parameter list, its StepGraphInputs)
        self.device = None      # the device of the recorded step

    def set_enabled(self, on: bool) -> None:
        self.enabled = bool(on)
        self._dropped = 0
        self.forget()

    def forget(self) -> None:
        self._graph = self._recorded = self._last = self._amp = None

    @staticmethod
    def head(opt, amp_found, amp_scale):
        """The inputs a step sees beside its parameters, or None if a step cannot be recorded: every param group's
        options but lr and params, whether GradScaler's tensors are there, the state epoch. Only CUDA parameters are
        recorded (the first one decides; StepGraphInputs finds no rows for mixed devices), never DTensor ones (their
        step has collectives and host work)."""
        first = next((g["params"][0] for g in opt.param_groups if g["params"]), None)
        if first is None or not first.is_cuda or dtensor_shards.is_dtensor(first):
            return None
        options = []
        for group in opt.param_groups:
            kv = tuple((k, v) for k, v in group.items() if k not in ("params", "lr"))
            if any(isinstance(v, torch.Tensor) for _, v in kv):
                return None  # an option the recording would read once
            options.append(kv)
        return (opt._epoch, tuple(options), amp_found is None, amp_scale is None)

    def look(self, head, groups):
        """(inputs, whether the recorded step does their work): one look of StepGraphInputs at the param groups'
        parameters, which bumps their versions when it does (the replay writes them). inputs None: a step of them
        cannot be recorded. A recording that does not do their work is dropped."""
        recorded = self._recorded[1] if self._graph is not None and self._recorded[0] == head else None
        held = self._inputs
        lists = [group["params"] for group in groups]
        # The groups' lists against copies of them taken when the list held in C++ was made (each list in place:
        # no flattened list built per step).
        if held is None or len(held[0]) != len(lists) or not all(map(same_tensors, held[0], lists)):
            held = self._inputs = ([list(params) for params in lists],
                                   torch.classes.lowbit.StepGraphInputs([p for params in lists for p in params]))
        rows, same = held[1].look(recorded)
        if same:
            return (head, rows), True
        if self._graph is not None:
            self._graph = self._recorded = self._amp = None
            self._dropped += 1
            if self._dropped >= MAX_DROPPED:
                warnings.warn(f"lowbit: stopped recording optimizer steps as CUDA graphs: the gradients' addresses (or "
                              f"the options, or the state) changed after {self._dropped} recordings; steps run as "
                              "they come")
                self.enabled = False
        return ((head, rows) if rows.numel() else None), False

    def repeats(self, now) -> bool:
        last = self._last
        return (self.enabled and last is not None and now is not None and last[0] == now[0]
                and torch.equal(last[1], now[1]))

    def remember(self, now) -> None:
        self._last = now

    def _amp_inputs(self, amp_found, amp_scale, device):
        """The recording's own GradScaler tensors, holding this step's values."""
        if self._amp is None:
            self._amp = (None if amp_found is None else torch.empty(1, dtype=torch.float32, device=device),
                         None if amp_scale is None else torch.empty(1, dtype=torch.float32, device=device))
        found, scale = self._amp
        if found is not None:
            found.copy_(amp_found.reshape(1))
        if scale is not None:
            scale.copy_(amp_scale.reshape(1))
        return found, scale

    def record(self, now, device, amp_found, amp_scale, enqueue: Callable) -> None:
        """Records enqueue(found_inf, scale) as this step's work, then replays it once (capturing runs nothing)."""
        self._amp = None
        found, scale = self._amp_inputs(amp_found, amp_scale, device)
        if self._stream is None or self._stream.device != device:
            # Of the parameters' device: the ops enqueue on that device's current stream, which must be the one
            # captured (on another device's they would run now, and the replays would do nothing).
            self._stream = torch.cuda.Stream(device)
        graph = torch.cuda.CUDAGraph()
        # On a stream of its own (never the default stream), thread-local: other threads' CUDA calls go on.
        with torch.cuda.stream(self._stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                enqueue(found, scale)
            finally:
                graph.capture_end()
        self._graph, self._recorded, self._last, self.device = graph, now, None, device
        graph.replay()
        self.replays += 1

    def replay(self, amp_found, amp_scale, device) -> None:
        self._amp_inputs(amp_found, amp_scale, device)
        self._graph.replay()
        self.replays += 1

    def give_up(self, error: Optional[BaseException]) -> None:
        warnings.warn(f"lowbit: recording a step as a CUDA graph failed, so steps run as they come: {error}")
        self.enabled = False
        self.forget()
