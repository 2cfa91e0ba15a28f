"""Bad input to the optimizer classes is refused as the C++ optimizers refuse it, through the ops' own checks
(their messages name the option or parameter and the value), and a refused call changes nothing."""
import pytest
import torch

import lowbit
from cpp_reference import same_bits, state_list

O = lowbit.optim
NAN, INF = float("nan"), float("inf")

# (class, options, the message's tail): refused at construction.
OPTIONS = [
    (O.AdamW, dict(lr=-1.0), "lowbit::optim_step_: lr must be finite and >= 0, got -1"),
    (O.AdamW, dict(lr=NAN), "lr must be finite and >= 0, got nan"),
    (O.Adam, dict(betas=(0.9, 1.0)), "beta2 must be in \\[0, 1\\), got 1"),
    (O.Adam, dict(betas=(-0.1, 0.9)), "beta1 must be in \\[0, 1\\), got -0.1"),
    (O.AdamW, dict(eps=-1e-8), "eps must be finite and >= 0, got -1e-08"),
    (O.AdamW, dict(weight_decay=NAN), "weight_decay must be finite and >= 0, got nan"),
    (O.SGD, dict(momentum=-0.5), "momentum must be finite and >= 0, got -0.5"),
    (O.Adagrad, dict(lr_decay=-1.0), "lr_decay must be finite and >= 0, got -1"),
    (O.Adagrad, dict(initial_accumulator_value=-0.1), "initial_accumulator_value must be finite and >= 0, got -0.1"),
    (O.AdEMAMix, dict(betas=(0.9, 0.999, 1.5)), "beta3 must be in \\[0, 1\\), got 1.5"),
    (O.AdEMAMix, dict(t_alpha_beta3=-1), "t_alpha_beta3 must be"),
    (O.RMSprop, dict(alpha=INF), "alpha must be finite and >= 0, got inf"),
    (O.AdamW, dict(state_format="Q3"), "unknown state_format 'Q3'; expected one of FP32, BF16, Q8, Q4, FP8, C8"),
    (O.AdamW, dict(block_size=100), "block_size must be 0 \\(the format's default\\) or a power of two in \\[32, 4096\\], got 100"),
    (O.AdamW, dict(master_weight_bits=16), "master_weight_bits must be 0 \\(none\\), 24 \\(int8 correction\\) or 32"),
    (O.AdamW, dict(min_quant_numel=-1), "min_quant_numel must be >= 0, got -1"),
    (O.AdamW, dict(max_grad_norm=-1.0), "max_grad_norm must be finite and >= 0, got -1"),
    (O.AdamW, dict(fp8_second_moment="Dyn8Unsigned"), "fp8_second_moment must be FP8E4M3 or FP8E5M2, got Dyn8Unsigned"),
    (O.AdamW, dict(master_weight_bits=32, bf16_stochastic_round=True), "stochastic_round and a master-weight correction"),
]


@pytest.mark.parametrize("cls,options,message", OPTIONS, ids=[f"{c.__name__}-{sorted(o)[0]}" for c, o, _ in OPTIONS])
def test_bad_options_are_refused_naming_them(cls, options, message):
    with pytest.raises((RuntimeError, ValueError), match=f"lowbit.optim.{cls.__name__}: param group 0: .*{message}"):
        cls([torch.nn.Parameter(torch.zeros(3))], **options)


def test_unknown_and_unsupported_arguments():
    p = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(TypeError, match="unexpected keyword argument\\(s\\) \\['state_fromat'\\]"):
        O.AdamW(p, state_fromat="Q8")
    with pytest.raises(ValueError, match="differentiable=True is not supported"):
        O.AdamW(p, differentiable=True)
    O.AdamW(p, foreach=True, fused=True, capturable=False)  # torch's switches: lowbit's step is always fused
    opt = O.AdamW(p)
    with pytest.raises(TypeError, match="set_step_graphs: on must be a bool, got 'no'"):
        opt.set_step_graphs("no")
    opt.set_step_graphs(False)


def snapshot(params, opt):
    return [p.detach().clone() for p in params], [[t.clone() for t in state_list(opt, p)] for p in params]


def unchanged(before, params, opt):
    values, states = before
    return all(same_bits(v, p) for v, p in zip(values, params)) and all(
        len(s) == len(state_list(opt, p)) and all(same_bits(x, y) for x, y in zip(s, state_list(opt, p)))
        for s, p in zip(states, params))


def stepped_once():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5000)), torch.nn.Parameter(torch.randn(7))]
    opt = O.AdamW(params, state_format="Q8")
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    return params, opt


def test_bad_gradients_are_refused_naming_the_parameter_and_nothing_changes():
    cases = [
        (lambda ps: torch.randn(5000, dtype=torch.float64),
         "lowbit::grad_check: gradient 0 has dtype Double; supported: float32, bfloat16, float16"),
        (lambda ps: torch.randn(5000).to_sparse(),
         "lowbit.optim.AdamW: parameter 0 of group 0 \\(shape \\[5000\\]\\) has a sparse gradient"),
    ]
    for make_grad, message in cases:
        params, opt = stepped_once()
        before = snapshot(params, opt)
        params[1].grad = torch.randn(7)
        params[0].grad_dtype = None  # torch would refuse the float64 gradient itself
        params[0].grad = make_grad(params)
        with pytest.raises(RuntimeError, match=message):
            opt.step()
        assert unchanged(before, params, opt), message


def test_options_changed_after_construction_are_checked_at_the_step():
    params, opt = stepped_once()
    before = snapshot(params, opt)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.param_groups[0]["lr"] = -0.5
    with pytest.raises(RuntimeError, match="param group 0: lowbit::optim_step_: lr must be finite and >= 0, got -0.5"):
        opt.step()
    assert unchanged(before, params, opt)
    opt.param_groups[0]["lr"] = 1e-3
    opt.step()
    assert not unchanged(before, params, opt)


def test_a_parameter_in_two_groups_is_refused():
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        O.AdamW([dict(params=[p]), dict(params=[p])])


def test_master_weights_need_bf16_parameters():
    p = torch.nn.Parameter(torch.zeros(5000))
    opt = O.AdamW([p], master_weight_bits=32)
    p.grad = torch.ones(5000)
    with pytest.raises(RuntimeError, match="parameter 0 has dtype Float; a master-weight correction "
                                           "\\(int16_correction\\) needs bfloat16 parameters"):
        opt.step()
    assert torch.equal(p, torch.zeros(5000))


# ---- a step refused for a later param group steps no group (the earlier groups used to step first). Only the op
# refuses these: the group's options pass their checks, the parameter does not.
BAD_GROUPS = [
    # master_weight_bits needs bf16 parameters: parameter 1 is fp32 (parameter 0, bf16, is fine).
    (dict(master_weight_bits=32), [torch.bfloat16, torch.float32],
     "parameter 1 of group 2 \\(shape \\[300\\], torch.float32\\): lowbit::optim_step_: parameter 1 has dtype Float; "
     "a master-weight correction \\(int16_correction\\) needs bfloat16 parameters; no parameter was stepped"),
    # float64 parameters: no grad_check reads this group's gradients (it neither skips nor clips).
    (dict(skip_nonfinite=False), [torch.float32, torch.float64],
     "parameter 1 of group 2 \\(shape \\[300\\], torch.float64\\): lowbit::optim_step_: parameter 1 has dtype "
     "Double; supported: float32, bfloat16, float16; no parameter was stepped"),
]


def everything(params, opt):
    """Every parameter and every state tensor (counters included) of every group, lr tensors, skipped steps."""
    return ([p.detach().clone() for p in params],
            [{k: v.clone() for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)} if opt.state.get(p)
             else None for p in params],
            {k: (v[0].clone(), v[1]) for k, v in opt._lr_tensors.items()}, opt.skipped_steps())


def changed(a, b):
    """What differs between two everything() snapshots: [] when nothing, bit for bit."""
    (pa, sa, la, ka), (pb, sb, lb, kb) = a, b
    out = [f"parameter {i}" for i, (x, y) in enumerate(zip(pa, pb)) if not same_bits(x, y)]
    for i, (x, y) in enumerate(zip(sa, sb)):
        if (x is None) != (y is None) or (x is not None and x.keys() != y.keys()):
            out.append(f"state of parameter {i}: keys {x and sorted(x)} vs {y and sorted(y)}")
        elif x is not None:
            out += [f"state '{k}' of parameter {i}" for k in x if not same_bits(x[k], y[k])]
    if la.keys() != lb.keys() or any(not same_bits(la[k][0], lb[k][0]) or la[k][1] != lb[k][1] for k in la):
        out.append(f"lr tensors {la} vs {lb}")
    if ka != kb:
        out.append(f"skipped steps {ka} vs {kb}")
    return out


@pytest.mark.parametrize("options,dtypes,message", BAD_GROUPS, ids=["master-weights-fp32", "float64-unchecked"])
def test_a_step_refused_for_a_later_group_changes_no_group(options, dtypes, message):
    def make(bad):
        """Groups 0 (Q8 and fp32 state) and 1 (Q4), and group 2 to add: with a bad parameter, or as it should be."""
        torch.manual_seed(0)
        values = [torch.randn(5000), torch.randn(7), torch.randn(64, 80), torch.randn(300), torch.randn(300)]
        kinds = [torch.float32] * 3 + [dtypes[0], dtypes[1] if bad else dtypes[0]]
        params = [torch.nn.Parameter(t.to(d)) for t, d in zip(values, kinds)]
        opt = O.AdamW([dict(params=params[:2]), dict(params=params[2:3], lr=0.01, state_format="Q4",
                                                     min_quant_numel=0)])
        return params, opt, dict(params=params[3:], **options)

    def grads(params, step):
        g = torch.Generator().manual_seed(step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype)

    # ---- the first step: no state is made.
    params, opt, late = make(bad=True)
    opt.add_param_group(late)
    grads(params, 0)
    before = everything(params, opt)
    with pytest.raises(RuntimeError, match=f"lowbit.optim.AdamW: {message}"):
        opt.step()
    assert changed(before, everything(params, opt)) == [] and len(opt.state) == 0
    # ---- after steps (groups 0 and 1 hold state and reuse their calls), with a new lr for group 0 (its lr tensor).
    params, opt, late = make(bad=True)
    reference, ref_opt, ref_late = make(bad=False)
    for ps, o, group in [(params, opt, late), (reference, ref_opt, ref_late)]:
        for step in range(2):
            grads(ps[:3], step)
            o.step()
        o.add_param_group(group)
        o.param_groups[0]["lr"] = 5e-3
    grads(params, 2)
    before = everything(params, opt)
    with pytest.raises(RuntimeError, match=f"lowbit.optim.AdamW: {message}"):
        opt.step()
    assert changed(before, everything(params, opt)) == []
    # ---- the bad parameter repaired, the step writes what it writes where no step was refused.
    params[4].grad = None
    params[4].data = params[4].data.to(dtypes[0])
    for ps, o in [(params, opt), (reference, ref_opt)]:
        grads(ps, 2)
        o.step()
    assert changed(everything(params, opt), everything(reference, ref_opt)) == []


def test_a_later_group_refused_as_a_whole_names_its_parameters_in_the_group():
    """Two parameters of group 1 that share memory: each alone passes, the call refuses them together. They are its
    parameters 1 and 2, and the 0th and 1st of their call (parameter 0, quantized, is in another call)."""
    torch.manual_seed(0)
    base = torch.randn(600)
    params = [torch.nn.Parameter(torch.randn(7)), torch.nn.Parameter(torch.randn(5000)),
              torch.nn.Parameter(base[:300]), torch.nn.Parameter(base[200:500])]
    opt = O.AdamW([dict(params=params[:1]), dict(params=params[1:], weight_decay=0.0)])
    for p in params:
        p.grad = torch.randn_like(p)
    before = everything(params, opt)
    with pytest.raises(RuntimeError, match="lowbit.optim.AdamW: param group 1: lowbit::optim_step_: parameter 2 and "
                                           "parameter 1 share memory; .*; no parameter was stepped"):
        opt.step()
    assert changed(before, everything(params, opt)) == [] and len(opt.state) == 0
