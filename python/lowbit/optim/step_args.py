"""Builds the arguments of torch.ops.lowbit.optim_step_ (tensors/optim_ops.h documents the op): the raw
step under the optimizer classes (optimizers.py), for callers that manage state themselves.

    import lowbit
    states = [lowbit.optim.init_state(p, "AdamW", "Q8") for p in params]
    lr = torch.tensor([1e-3], dtype=torch.float64, device=params[0].device)
    lowbit.optim.step(params, [p.grad for p in params], states, lr, rule="AdamW", weight_decay=0.01)

State is laid out exactly as the C++ optimizers lay it out (the op lowbit::optim_state_layout decides),
so the results are theirs bit for bit. Everything that changes per step (the step count in each
state's `counters`, lr) lives in tensors on the parameters' device.
"""
from dataclasses import dataclass, field
from typing import List, Optional

import torch


def hyper_parameters() -> tuple:
    """The op's named hyper-parameters (kernels/common/step_config.h keeps their one table)."""
    return tuple(torch.ops.lowbit.optim_hyper_parameters())


@dataclass
class ParamState:
    """One parameter's optimizer state: slot storages, their tensors, and the step counters."""
    slots: List[str]                 # per slot: "none", "fp32", "bf16", a QuantFormat name or "int16_correction" /
                                     # "int8_correction" (the last slot: a bf16 parameter's master-weight correction)
    tensors: List[torch.Tensor]      # per used slot: values, or codes then absmax
    counters: torch.Tensor           # int64 [2]: steps taken, state blocks that overflowed
    block_size: int
    offset: int = 0                  # element of the whole parameter where this one starts
    rng_key: int = 0                 # stochastic-rounding stream of this parameter

    @property
    def step(self) -> int:
        return int(self.counters[0])


def init_state(param: torch.Tensor, rule: str, state_format: str = "Q8", *, block_size: int = 0,
               min_quant_numel: int = 4096, initial_value: float = 0.0, momentum: float = 0.0,
               centered: bool = False, amsgrad: bool = False, fp8_second_moment: str = "FP8E4M3",
               rng_key: int = 0, master_weight_bits: int = 0,
               values: Optional[List[Optional[torch.Tensor]]] = None,
               whole_numel: Optional[int] = None) -> ParamState:
    """Fresh state for `param`, every slot holding `initial_value` (Adagrad's initial_accumulator_value), or
    values[k] (any float tensor of param's numel, e.g. torch.optim's fp32 state) where given for slot k.
    whole_numel: where `param` is a range of a larger parameter (a shard), that parameter's numel, which decides
    the layout (so sharding never changes it); the state covers param's elements.

    master_weight_bits 32 / 24 (bf16 params): the last slot holds an int16 / int8 correction, zero at first (the
    master equals the parameter)."""
    ops = torch.ops.lowbit
    layout_numel = param.numel() if whole_numel is None else whole_numel
    slots, block = ops.optim_state_layout(rule, state_format, layout_numel, block_size, min_quant_numel, momentum,
                                          centered, amsgrad, fp8_second_moment, master_weight_bits)
    tensors = []
    init = torch.full((param.numel(),), float(initial_value), dtype=torch.float32, device=param.device)
    for k, s in enumerate(slots):
        if s == "none":
            continue
        given = values[k] if values is not None and k < len(values) else None
        if given is not None and given.numel() != param.numel():
            raise ValueError(f"lowbit.optim.init_state: values[{k}] has {given.numel()} elements, "
                             f"the parameter {param.numel()}")
        start = init if given is None else given.detach().to(param.device, torch.float32).reshape(-1)
        if s == "fp32":
            tensors.append(start.clone())
        elif s == "bf16":
            tensors.append(start.to(torch.bfloat16))
        elif s in ("int16_correction", "int8_correction"):
            tensors.append(torch.zeros(param.numel(), device=param.device,
                                       dtype=torch.int16 if s == "int16_correction" else torch.int8))
        else:
            codes, absmax = ops.quantize_blockwise(start, s, block)
            tensors += [codes, absmax]
    counters = torch.zeros(2, dtype=torch.int64, device=param.device)
    return ParamState(list(slots), tensors, counters, int(block), rng_key=rng_key)


def step(params: List[torch.Tensor], grads: List[torch.Tensor], states: List[ParamState], lr: torch.Tensor, *,
         rule: str, seed: int = 0, stochastic_round: bool = False, found_inf: Optional[torch.Tensor] = None,
         grad_sumsq: Optional[torch.Tensor] = None, max_grad_norm: float = 0.0,
         grad_scale: Optional[torch.Tensor] = None, **hyper) -> None:
    """One fused step, in place: one op call per state layout (usually one, two with small tensors in FP32)."""
    known = hyper_parameters()
    unknown = set(hyper) - set(known)
    if unknown:
        raise TypeError(f"lowbit.optim.step: unknown hyper-parameter(s) {sorted(unknown)}; "
                        f"expected some of {known}")
    if not (len(params) == len(grads) == len(states)):
        raise ValueError(f"lowbit.optim.step: {len(params)} params, {len(grads)} grads, {len(states)} states")
    calls = {}
    for p, g, s in zip(params, grads, states):
        call = calls.setdefault((tuple(s.slots), s.block_size), dict(params=[], grads=[], state=[], counters=[],
                                                                     offsets=[], rng_keys=[]))
        call["params"].append(p)
        call["grads"].append(g)
        call["state"] += s.tensors
        call["counters"].append(s.counters)
        call["offsets"].append(s.offset)
        call["rng_keys"].append(s.rng_key)
    for (slots, block), c in calls.items():
        torch.ops.lowbit.optim_step_(c["params"], c["grads"], c["state"], c["counters"], lr, rule=rule,
                                     slots=list(slots), block_size=block, offsets=c["offsets"],
                                     rng_keys=c["rng_keys"], seed=seed, stochastic_round=stochastic_round,
                                     found_inf=found_inf, grad_sumsq=grad_sumsq, max_grad_norm=max_grad_norm,
                                     grad_scale=grad_scale, **hyper)
