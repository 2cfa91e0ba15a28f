"""lowbit.optim.<Class> steps bit for bit as the C++ lowbit::optim::<Class>: every rule, every state format, two
param groups (fp32 parameters; bf16 ones with stochastic rounding or a 32-bit master), odd sizes, an empty
parameter, a non-contiguous one, a missing gradient, clipping, a non-finite gradient (the step skipped)."""
import torch

import lowbit
from cpp_reference import differences, run_cpp, run_python

CLASSES = {cls.rule: cls for cls in lowbit.optim.optimizers.ALL}
FORMATS = ["FP32", "BF16", "Q8", "Q4", "FP8", "C8"]
# Per rule, option variants beside the defaults: each rule's own switches (amsgrad, nesterov, centered, ...).
VARIANTS = {
    "Adam": [dict(weight_decay=0.1, amsgrad=True), dict(betas=(0.8, 0.99), eps=1e-6, maximize=True)],
    "AdamW": [dict(), dict(amsgrad=True, weight_decay=0.05)],
    "SGD": [dict(momentum=0.9, nesterov=True, weight_decay=0.01), dict(momentum=0.5, dampening=0.1), dict()],
    "Lion": [dict(weight_decay=0.1), dict(betas=(0.95, 0.98), maximize=True)],
    "RMSprop": [dict(momentum=0.9, centered=True), dict(alpha=0.9, weight_decay=0.01)],
    "Adagrad": [dict(lr_decay=0.01, initial_accumulator_value=0.1), dict(weight_decay=0.01)],
    "AdEMAMix": [dict(t_alpha_beta3=10), dict(alpha=8.0, weight_decay=0.01)],
    "LAMB": [dict(weight_decay=0.01), dict(betas=(0.9, 0.99))],
}
CASES = [(rule, v, fmt) for rule, vs in VARIANTS.items() for v in range(len(vs)) for fmt in FORMATS]


def fp32_params(gen):
    shapes = [(0,), (1,), (257,), (5000,)]
    ps = [torch.randn(s, generator=gen) for s in shapes]
    ps.append(torch.randn(73, 70, generator=gen).t())  # non-contiguous, 5110 elements
    return ps


def make_spec(rule, variant, fmt, seed, steps=3, nonfinite_at=None):
    gen = torch.Generator().manual_seed(seed)
    options = dict(VARIANTS[rule][variant], state_format=fmt)
    g0 = dict(options, lr=1e-2)
    g1 = dict(options, lr=3e-3, min_quant_numel=1000)
    if variant == 0:
        g1["bf16_stochastic_round"] = True
    else:
        g1["master_weight_bits"] = 32
        g0.update(block_size=512, max_grad_norm=0.5)
        g1["max_grad_norm"] = 0.05  # each group clips by its own norm
        if fmt == "FP8":
            g0["fp8_second_moment"] = "FP8E5M2"
    params = [fp32_params(gen), [torch.randn(3001, generator=gen).bfloat16(), torch.randn(4097, generator=gen).bfloat16()]]
    grads = []
    for s in range(steps):
        step = []
        for ps in params:
            gs = [torch.randn(p.shape, generator=gen).to(p.dtype) * 0.1 for p in ps]
            if s == 1:
                gs[-1] = None  # no gradient this step: not stepped
            step.append(gs)
        if s == 1 and len(params[0][3]):
            step[0][4] = torch.randn(73, 70, generator=gen).t() * 0.1  # a non-contiguous gradient
        if s == nonfinite_at:
            step[0][3] = step[0][3].clone()
            step[0][3][17] = float("inf")
        grads.append(step)
    return dict(rule=rule, groups=[g0, g1], params=params, grads=grads)


def test_every_class_every_state_format_equals_the_cpp_optimizer():
    specs = [make_spec(rule, v, fmt, seed=1000 + i) for i, (rule, v, fmt) in enumerate(CASES)]
    wants = run_cpp(specs)
    failures = []
    for (rule, v, fmt), spec, want in zip(CASES, specs, wants):
        params, opt = run_python(CLASSES[rule], spec)
        diffs = differences(params, opt, want)
        if diffs:
            failures.append(f"{rule} variant {v} {fmt}: {diffs[:4]}")
    assert not failures, "\n".join(failures)
    assert len(CASES) == 102


def test_a_non_finite_gradient_skips_the_step_as_in_cpp():
    cases = [(rule, at) for rule in sorted(CLASSES) for at in (0, 1)]
    specs = [make_spec(rule, 0, "Q8", seed=7, steps=3, nonfinite_at=at) for rule, at in cases]
    failures = []
    for (rule, at), spec, want in zip(cases, specs, run_cpp(specs)):
        params, opt = run_python(CLASSES[rule], spec)
        diffs = differences(params, opt, want)
        if opt.skipped_steps() != 1 or want["skipped"] != 1:
            diffs.append(f"skipped {opt.skipped_steps()}, C++ {want['skipped']}")
        if rule != "SGD" and int(opt.state[params[3]]["counters"][0]) != 2:  # (SGD without momentum: no state)
            diffs.append("three steps with one skipped are not two")
        if diffs:
            failures.append(f"{rule}, inf at step {at}: {diffs[:4]}")
    assert not failures, "\n".join(failures)


def test_defaults_are_torch_optims():
    import inspect
    for name in ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad"):
        ours = inspect.signature(getattr(lowbit.optim, name)).parameters
        theirs = inspect.signature(getattr(torch.optim, name)).parameters
        for arg in ours:
            if arg in theirs and arg not in ("params", "options"):
                assert ours[arg].default == theirs[arg].default or (
                    isinstance(theirs[arg].default, tuple) and tuple(ours[arg].default) == theirs[arg].default), \
                    (name, arg, ours[arg].default, theirs[arg].default)
        missing = [a for a, p in theirs.items() if a not in ours and a not in
                   ("foreach", "fused", "capturable", "differentiable", "decoupled_weight_decay")]
        assert not missing, (name, missing)


def test_a_parameter_swapped_in_its_group_is_stepped_as_a_new_one():
    # Steps reuse the last step's op calls while the parameters stay: a tensor put in another's place in its group's
    # list must be stepped (with new state), through step() and step_parameters() (gradient release), and the one it
    # replaced left alone. The swapped-in tensor's steps equal those of an optimizer of its own.
    for through_release in (False, True):
        gen = torch.Generator().manual_seed(3)
        params = [torch.randn(300, generator=gen).requires_grad_() for _ in range(3)]
        opt = lowbit.optim.AdamW(params, lr=1e-2, state_format="Q8", min_quant_numel=0)
        new = torch.randn(300, generator=gen).requires_grad_()
        alone = lowbit.optim.AdamW([new.detach().clone().requires_grad_()], lr=1e-2, state_format="Q8", min_quant_numel=0)
        for s in range(6):
            if s == 3:
                old = opt.param_groups[0]["params"][1]
                old_value = old.detach().clone()
                opt.param_groups[0]["params"][1] = new
            for p in opt.param_groups[0]["params"]:
                p.grad = torch.randn(300, generator=gen)
            if through_release:
                opt.step_parameters(opt.param_groups[0]["params"])
            else:
                opt.step()
            if s >= 3:
                alone.param_groups[0]["params"][0].grad = new.grad.clone()
                alone.step()
        assert torch.equal(old.detach(), old_value), "the replaced parameter was stepped"
        assert int(opt.state[new]["counters"][0]) == 3
        assert torch.equal(new.detach(), alone.param_groups[0]["params"][0].detach())
