"""A step's op calls checked by the op itself before any of them runs, so that a step refused for one param group
changes nothing in the others ("a refused call changes nothing", across the calls of a step).

The check of a call is that call with found_inf set: optim_step_ then checks every argument (each tensor's dtype,
shape and device, the state layout, the hyper-parameters) and returns without writing a value (tensors/optim_ops.h).
What it cannot see ahead are values it reads only when it steps (a NaN grad_sumsq of a group that clips without
skipping), which that call still refuses as it comes. The op bumps the version counters of what it would write.

Where a call is refused, its parameters are checked one at a time to name the one the op refuses; the op's message
counts parameters within its call, so its "parameter k" becomes the index in the param group."""
import re
from typing import Dict, List

import torch

_PARAMETER = re.compile(r"\bparameter (\d+)\b")


def _in_group(message: str, indices: List[int]) -> str:
    """The op's message with each "parameter k" (k-th of the call) as the index in the param group."""
    return _PARAMETER.sub(lambda m: f"parameter {indices[int(m.group(1))]}" if int(m.group(1)) < len(indices)
                          else m.group(0), message)


def _skipped_call(opt, group: Dict, device, slots, block, bucket, hyper, grad_scale, row=None) -> None:
    params, grads, state, counters, keys, offsets = bucket[:6]
    if row is not None:  # parameter `row` of the call alone
        k, per = row, len(state) // max(len(params), 1)
        params, grads, state = params[k:k + 1], grads[k:k + 1], state[k * per:(k + 1) * per]
        counters, keys, offsets = counters[k:k + 1], keys[k:k + 1], offsets[k:k + 1]
    clip = group["max_grad_norm"] > 0
    torch.ops.lowbit.optim_step_(
        params, grads, state, counters, torch.zeros(1, dtype=torch.float64, device=device), rule=opt.rule,
        slots=list(slots), block_size=block, offsets=offsets, rng_keys=keys, seed=opt.seed,
        stochastic_round=group["bf16_stochastic_round"], found_inf=torch.ones(1, device=device),
        grad_sumsq=torch.zeros(1, dtype=torch.float64, device=device) if clip else None,
        max_grad_norm=group["max_grad_norm"] if clip else 0.0,
        grad_scale=None if grad_scale is None else grad_scale.reshape(1).to(device, torch.float32), **hyper)


def check_calls(opt, calls: List, grad_scale) -> None:
    """calls: (group index, {(device, slots, block): bucket}) as LowbitOptimizer._build_calls makes them (a bucket:
    params, grads, state, counters, rng keys, offsets, ..., each parameter's index in its group). Raises naming
    the first parameter refused; writes nothing."""
    name = type(opt).__name__
    for gi, buckets in calls:
        group = opt.param_groups[gi]
        hyper = opt.op_hyper_parameters(group)
        for (device, slots, block), bucket in buckets.items():
            try:
                _skipped_call(opt, group, device, slots, block, bucket, hyper, grad_scale)
                continue
            except RuntimeError as e:
                whole = e
            for k, index in enumerate(bucket[-1]):
                try:
                    _skipped_call(opt, group, device, slots, block, bucket, hyper, grad_scale, row=k)
                except RuntimeError as e:
                    p = group["params"][index]
                    raise RuntimeError(f"lowbit.optim.{name}: parameter {index} of group {gi} (shape "
                                       f"{list(p.shape)}, {p.dtype}): {_in_group(str(e), [index])}; "
                                       "no parameter was stepped") from None
            # Every parameter alone passes: the call's parameters together are refused (e.g. shared memory).
            raise RuntimeError(f"lowbit.optim.{name}: param group {gi}: {_in_group(str(whole), bucket[-1])}; "
                               "no parameter was stepped") from None
