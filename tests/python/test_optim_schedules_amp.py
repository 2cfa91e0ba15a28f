"""What changes per step reaches the op through device tensors: an lr scheduler's lr (bit for bit the C++ optimizer
given the same lr per step), torch.amp.GradScaler's scale and found_inf (a scaled step equals the unscaled one; an
inf skips it, on the device), and gradient release from post-accumulate-grad hooks (equal to step())."""
import pytest
import torch

import lowbit
from cpp_reference import differences, run_cpp, run_python, same_bits, state_list


def test_a_scheduler_changes_lr_and_the_steps_equal_the_cpp_optimizers():
    gen = torch.Generator().manual_seed(11)
    params = [[torch.randn(5003, generator=gen), torch.randn(300, generator=gen)]]
    grads = [[[torch.randn(p.shape, generator=gen) * 0.1 for p in params[0]]] for _ in range(5)]
    # The schedule as torch computes it ...
    probe = torch.nn.Parameter(torch.zeros(1))
    opt = lowbit.optim.AdamW([probe], lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=5, cycle_momentum=False)
    lrs = []
    for _ in range(5):
        lrs.append([opt.param_groups[0]["lr"]])
        probe.grad = torch.ones(1)
        opt.step()
        sched.step()
    assert len(set(lr[0] for lr in lrs)) == 5
    assert opt._lr_tensors[(0, probe.device)][0].item() == lrs[-1][0]  # the device tensor follows group["lr"]
    # ... then a run driven by the scheduler against the C++ optimizer given those lrs.
    spec = dict(rule="AdamW", groups=[dict(lr=1e-2, weight_decay=0.01)], params=params, grads=grads, lrs=lrs)
    want = run_cpp(spec)
    ps = [p.clone().requires_grad_() for p in params[0]]
    opt = lowbit.optim.AdamW(ps, lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=5, cycle_momentum=False)
    for step_grads in grads:
        for p, g in zip(ps, step_grads[0]):
            p.grad = g.clone()
        opt.step()
        sched.step()
    assert differences(ps, opt, want) == []


def amp_run(scaled, inf_at=None, steps=3):
    torch.manual_seed(0)
    m = torch.nn.Linear(80, 70)
    # skip_nonfinite off: only GradScaler's found_inf can skip a step here.
    opt = lowbit.optim.AdamW(m.parameters(), state_format="Q8", skip_nonfinite=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12) if scaled else None
    gen = torch.Generator().manual_seed(1)
    for s in range(steps):
        loss = m(torch.randn(8, 80, generator=gen)).square().mean()
        if s == inf_at:
            loss = loss * float("inf")
        if scaled:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad()
    return m, opt, scaler


def test_grad_scaler_steps_equal_unscaled_ones():
    a, opt_a, _ = amp_run(scaled=False)
    b, opt_b, scaler = amp_run(scaled=True)
    assert scaler.get_scale() == 2.0 ** 12  # no inf: the scale was never cut
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert same_bits(pa, pb)  # a power-of-two scale divides out exactly
        assert all(same_bits(x, y) for x, y in zip(state_list(opt_a, pa), state_list(opt_b, pb)))


def test_grad_scaler_inf_skips_the_step_on_the_device():
    b, opt_b, scaler = amp_run(scaled=True, inf_at=1)
    assert scaler.get_scale() == 2.0 ** 11  # GradScaler saw the inf the step skipped on
    assert opt_b.skipped_steps() == 1
    assert int(opt_b.state[b.weight]["counters"][0]) == 2
    # skipping is all it did: equal to a run without that step (and without the skip-check's own pre-pass)
    torch.manual_seed(0)
    m = torch.nn.Linear(80, 70)
    opt = lowbit.optim.AdamW(m.parameters(), state_format="Q8")
    gen = torch.Generator().manual_seed(1)
    for s in range(3):
        loss = m(torch.randn(8, 80, generator=gen)).square().mean()
        if s == 1:
            continue
        loss.backward()
        opt.step()
        opt.zero_grad()
    for pa, pb in zip(m.parameters(), b.parameters()):
        assert same_bits(pa, pb)


@pytest.mark.parametrize("cls", [lowbit.optim.AdamW, lowbit.optim.LAMB, lowbit.optim.SGD])
def test_gradient_release_equals_step(cls):
    kw = dict(momentum=0.9) if cls is lowbit.optim.SGD else {}

    def run(release):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 90), torch.nn.Tanh(), torch.nn.Linear(90, 5))
        opt = cls([dict(params=m[0].parameters()), dict(params=m[2].parameters(), lr=5e-3)], **kw)
        r = lowbit.optim.GradientRelease(opt) if release else None
        gen = torch.Generator().manual_seed(3)
        for _ in range(3):
            m(torch.randn(4, 64, generator=gen)).square().mean().backward()
            if release:
                assert all(p.grad is None for p in m.parameters())  # freed as they were stepped
            else:
                opt.step()
                opt.zero_grad()
        return m, opt, r

    a, opt_a, _ = run(False)
    b, opt_b, r = run(True)
    assert r.released == 3 * 4
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert same_bits(pa, pb)
        assert all(same_bits(x, y) for x, y in zip(state_list(opt_a, pa), state_list(opt_b, pb)))


def test_gradient_release_refuses_clipping():
    m = torch.nn.Linear(4, 4)
    opt = lowbit.optim.AdamW(m.parameters(), max_grad_norm=1.0)
    with pytest.raises(ValueError, match="param group 0 clips to max_grad_norm 1.0, which needs every gradient"):
        lowbit.optim.GradientRelease(opt)
