"""A param group's options checked as the C++ optimizers check them (optim/lowbit_optimizer.cpp check_groups), with
their messages: by the ops wherever an op takes the option, here only for the few no op sees."""
from typing import Dict

import torch

FP8_SECOND_MOMENTS = ("FP8E4M3", "FP8E5M2")


def _finite_non_negative(name, value):
    if not (isinstance(value, (int, float)) and value >= 0 and value != float("inf")):
        raise ValueError(f"{name} must be finite and >= 0, got {value}")


def check_options(opt, group: Dict):
    """Raises naming the first bad option; returns a check of another lr with the rest of the options as they are."""
    ops = torch.ops.lowbit
    # ---- no op sees these (the C++ optimizers check them the same way).
    if not isinstance(group["min_quant_numel"], int) or group["min_quant_numel"] < 0:
        raise ValueError(f"min_quant_numel must be >= 0, got {group['min_quant_numel']}")
    if group["fp8_second_moment"] not in FP8_SECOND_MOMENTS:
        raise ValueError(f"fp8_second_moment must be FP8E4M3 or FP8E5M2, got {group['fp8_second_moment']}")
    if "initial_accumulator_value" in group:
        _finite_non_negative("initial_accumulator_value", group["initial_accumulator_value"])
    # ---- the layout: state_format, master_weight_bits; block_size against the 8-bit format whatever the state
    # format, as the C++ optimizers check it.
    layout_args = (float(group.get("momentum", 0.0)), bool(group.get("centered", False)),
                   bool(group.get("amsgrad", False)), group["fp8_second_moment"], group["master_weight_bits"])
    ops.optim_state_layout(opt.rule, group["state_format"], 0, 0, 0, *layout_args)
    ops.optim_state_layout("AdamW", "Q8", 1, group["block_size"], 0, 0.0, False, False, "FP8E4M3", 0)
    # ---- lr, the hyper-parameters, max_grad_norm, stochastic rounding: a skipped step of one element, kept for
    # the checks of later lrs alone (a scheduler changes nothing else).
    dtype = torch.bfloat16 if group["master_weight_bits"] else torch.float32
    p, grad = torch.zeros(1, dtype=dtype), torch.zeros(1, dtype=dtype)
    st = opt._new_state(p, group)
    found, sumsq = torch.ones(1), torch.zeros(1, dtype=torch.float64)
    hyper = opt.op_hyper_parameters(group)

    def check_lr(lr):
        lr = lr.detach().double().cpu().reshape(1) if isinstance(lr, torch.Tensor) else \
            torch.tensor([lr], dtype=torch.float64)
        ops.optim_step_([p], [grad], st.tensors, [st.counters], lr, rule=opt.rule, slots=st.slots,
                        block_size=st.block_size, found_inf=found, grad_sumsq=sumsq,
                        max_grad_norm=group["max_grad_norm"], stochastic_round=group["bf16_stochastic_round"], **hyper)

    check_lr(group["lr"])
    return check_lr
