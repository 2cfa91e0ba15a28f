"""python/lowbit/optim/step_args.py: the helper builds torch.ops.lowbit.optim_step_'s arguments; its AdamW Q8 steps
equal the C++ optimizer's bit for bit, and the op traces under torch.compile(fullgraph=True)."""
import pytest
import torch

import lowbit  # conftest.py: the installed package, or python/ with LOWBIT_LIBRARY
from cpp_reference import run_cpp

ops = torch.ops.lowbit


def test_adamw_q8_through_the_helper_equals_the_cpp_optimizer():
    torch.manual_seed(0)
    n = 70001
    p0 = torch.randn(n)
    grads = [torch.randn(n) * 0.1 for _ in range(3)]
    want = run_cpp(dict(rule="AdamW", groups=[dict(lr=1e-2, weight_decay=1e-2, state_format="Q8")], params=[[p0]],
                        grads=[[[g]] for g in grads]))

    p = p0.clone()
    state = lowbit.optim.init_state(p, "AdamW", "Q8")
    assert state.slots == ["Dyn8Signed", "Dyn8Unsigned"] and state.block_size == 256
    lr = torch.tensor([1e-2], dtype=torch.float64)
    for g in grads:
        lowbit.optim.step([p], [g], [state], lr, rule="AdamW", weight_decay=1e-2)
    assert state.step == 3
    assert torch.equal(p, want["params"][0])
    assert len(state.tensors) == len(want["state"][0]) == 4
    for got, exp in zip(state.tensors, want["state"][0]):
        assert torch.equal(got, exp)


def test_layout_follows_the_optimizers_rules():
    small = lowbit.optim.init_state(torch.zeros(100), "AdamW", "Q8")
    assert small.slots == ["fp32", "fp32"]  # below min_quant_numel
    q4 = lowbit.optim.init_state(torch.zeros(5000), "Adam", "Q4", amsgrad=True)
    assert q4.slots == ["DE4Signed", "Linear4Unsigned", "Linear4Unsigned"] and q4.block_size == 128
    rms = lowbit.optim.init_state(torch.zeros(5000), "RMSprop", "FP8", centered=True)
    assert rms.slots == ["FP8E4M3", "none", "FP8E4M3"]
    with pytest.raises(RuntimeError, match="unknown state_format 'Q3'"):
        lowbit.optim.init_state(torch.zeros(10), "AdamW", "Q3")
    with pytest.raises(TypeError, match="unknown hyper-parameter"):
        lowbit.optim.step([], [], [], torch.ones(1, dtype=torch.float64), rule="AdamW", betas=(0.9, 0.99))


def test_hyper_parameters_come_from_the_op_with_the_schema_defaults():
    names = lowbit.optim.hyper_parameters()
    assert names[:4] == ("beta1", "beta2", "beta3", "eps") and "maximize" in names and "lr_decay" in names
    # Each is a keyword argument of the op, with the default the C++ StepConfig has.
    schema = {a.name: a for a in torch.ops.lowbit.optim_step_.default._schema.arguments}
    defaults = {"beta1": 0.9, "beta2": 0.999, "beta3": 0.9999, "eps": 1e-8, "weight_decay": 0.0, "nesterov": False,
                "t_alpha_beta3": 0}
    for name in names:
        assert schema[name].kwarg_only, name
    for name, value in defaults.items():
        assert schema[name].default_value == value, name
    # Out of range: refused by the op with its name and the value, the parameter untouched.
    p = torch.randn(300)
    p0 = p.clone()
    state = lowbit.optim.init_state(p, "AdamW", "Q8")
    lr = torch.tensor([1e-3], dtype=torch.float64)
    for name, bad in (("beta2", 1.0), ("eps", -1e-8), ("weight_decay", float("nan")), ("t_alpha_beta3", -1)):
        with pytest.raises(RuntimeError, match=f"lowbit::optim_step_: {name} must be"):
            lowbit.optim.step([p], [torch.randn(300)], [state], lr, rule="AdamW", **{name: bad})
    assert torch.equal(p, p0) and state.step == 0


def test_bf16_params_with_a_32_bit_master_step_like_fp32_params():
    torch.manual_seed(2)
    n = 9001
    p32 = torch.randn(n)
    p16 = p32.to(torch.bfloat16)
    s32 = lowbit.optim.init_state(p32, "AdamW", "Q8")
    s16 = lowbit.optim.init_state(p16, "AdamW", "Q8", master_weight_bits=32)
    assert s16.slots == ["Dyn8Signed", "Dyn8Unsigned", "none", "int16_correction"]
    # Start both from the bf16 weights (a zero correction); gradients as a bf16 model has them.
    p32 = p16.float()
    lr = torch.tensor([1e-2], dtype=torch.float64)
    for _ in range(3):
        g = torch.randn(n).to(torch.bfloat16)
        lowbit.optim.step([p32], [g.float()], [s32], lr, rule="AdamW", weight_decay=1e-2)
        lowbit.optim.step([p16], [g], [s16], lr, rule="AdamW", weight_decay=1e-2)
    master = ((p16.view(torch.int16).to(torch.int64) & 0xFFFF) * 65536 + s16.tensors[-1].to(torch.int64))
    assert torch.equal(master.to(torch.int32).view(torch.float32), p32)
    with pytest.raises(RuntimeError, match="stochastic_round and a master-weight correction"):
        lowbit.optim.step([p16], [g], [s16], lr, rule="AdamW", stochastic_round=True)


def test_step_op_traces_under_torch_compile_fullgraph():
    torch.manual_seed(1)
    n = 5000
    p0, g = torch.randn(n), torch.randn(n)

    def run(p, state, counters, lr):
        torch.ops.lowbit.optim_step_([p], [g], state, [counters], lr, rule="AdamW",
                                     slots=["Dyn8Signed", "Dyn8Unsigned"], weight_decay=1e-2)
        return p

    results = []
    for fn in (run, torch.compile(run, fullgraph=True, backend="aot_eager")):
        st = lowbit.optim.init_state(p0, "AdamW", "Q8")
        p = p0.clone()
        lr = torch.tensor([1e-3], dtype=torch.float64)
        for _ in range(2):
            fn(p, st.tensors, st.counters, lr)
        results.append((p, st))
    (pa, sa), (pb, sb) = results
    assert torch.equal(pa, pb) and not torch.equal(pa, p0)
    assert sa.step == sb.step == 2
    assert all(torch.equal(x, y) for x, y in zip(sa.tensors, sb.tensors))
