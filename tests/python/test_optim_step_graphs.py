"""Steps recorded as a CUDA graph and replayed (python/lowbit/optim/step_graph.py) compute the bits of the steps they
replace, and a recording is dropped whenever it would not do a step's work: gradients at new addresses, another
lr (read from the device, no new recording), other options, GradScaler's flag, a loaded state. Each run with step
graphs is compared with the same run with set_step_graphs(False), every parameter and state tensor bit for bit.
Needs a GPU (CUDA graphs); skipped elsewhere."""
import pytest
import torch

import lowbit

O = lowbit.optim
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def make(dtype=torch.float32, shapes=((300, 70), (4096,), (33,), (5000,))):
    torch.manual_seed(0)
    return [torch.randn(s, device="cuda").to(dtype).requires_grad_() for s in shapes]


def grads_for(params, steps, scale=1e-2):
    g = torch.Generator(device="cuda").manual_seed(1)
    return [[(torch.randn(p.shape, device="cuda", generator=g) * scale).to(p.dtype) for p in params]
            for _ in range(steps)]


def assert_same_run(opt_a, pa, opt_b, pb):
    for x, y in zip(pa, pb):
        assert torch.equal(x.detach().view(-1).view(torch.uint8), y.detach().view(-1).view(torch.uint8))
    for x, y in zip(pa, pb):
        sa, sb = opt_a.state[x], opt_b.state[y]
        assert sa.keys() == sb.keys()
        for k in sa:
            if isinstance(sa[k], torch.Tensor):
                assert torch.equal(sa[k], sb[k]), k


def run(make_opt, dtype, steps, graphs, between=None, in_place=True, shapes=None):
    params = make(dtype) if shapes is None else make(dtype, shapes)
    opt = make_opt(params)
    opt.set_step_graphs(graphs)
    gs = grads_for(params, steps)
    for p, g in zip(params, gs[0]):
        p.grad = g.clone()
    for s in range(steps):
        if in_place:  # the same gradient tensors each step: their addresses repeat, so steps replay
            for p, g in zip(params, gs[s]):
                p.grad.copy_(g)
        else:
            for p, g in zip(params, gs[s]):
                p.grad = g.clone()
        if between is not None:
            between(s, opt, params)
        opt.step()
    torch.cuda.synchronize()
    return opt, params


CASES = [
    ("AdamW Q8", lambda p: O.AdamW(p, lr=1e-2, weight_decay=0.1), torch.float32),
    ("AdamW Q4", lambda p: O.AdamW(p, lr=1e-2, state_format="Q4"), torch.float32),
    ("Adam FP32", lambda p: O.Adam(p, lr=1e-2, state_format="FP32"), torch.float32),
    ("Lion C8", lambda p: O.Lion(p, lr=1e-3, state_format="C8"), torch.float32),
    ("AdamW Q8 bf16 + 24-bit master", lambda p: O.AdamW(p, lr=1e-2, master_weight_bits=24), torch.bfloat16),
    ("AdamW Q8 bf16 stochastic", lambda p: O.AdamW(p, lr=1e-2, bf16_stochastic_round=True), torch.bfloat16),
    ("LAMB Q8", lambda p: O.LAMB(p, lr=1e-2), torch.float32),
    ("AdamW Q8 clipped", lambda p: O.AdamW(p, lr=1e-2, max_grad_norm=0.05), torch.float32),
]


@pytest.mark.parametrize("name,make_opt,dtype", CASES, ids=[c[0] for c in CASES])
def test_replayed_steps_equal_the_steps_as_they_come(name, make_opt, dtype):
    a, pa = run(make_opt, dtype, 6, graphs=True)
    b, pb = run(make_opt, dtype, 6, graphs=False)
    assert a.step_graph_replays() >= 4, "steps 2.. repeat step 1's inputs: recorded at 2, replayed from 3"
    assert b.step_graph_replays() == 0
    assert_same_run(a, pa, b, pb)


# 1,300 parameters: the step's kernels over several chunks of parameters on two streams (a fork and a join in the
# recording) and the gradient check over three launches.
MANY = tuple((1 + (i * 37) % 300,) for i in range(1300))


@pytest.mark.parametrize("name,make_opt,dtype", [CASES[0], CASES[5]], ids=[CASES[0][0], CASES[5][0]])
def test_replayed_steps_over_many_tensors_equal_the_steps_as_they_come(name, make_opt, dtype):
    a, pa = run(make_opt, dtype, 4, graphs=True, shapes=MANY)
    b, pb = run(make_opt, dtype, 4, graphs=False, shapes=MANY)
    assert a.step_graph_replays() >= 2
    assert_same_run(a, pa, b, pb)


def test_a_scheduler_lr_and_changed_options_are_seen_by_replays():
    def between(s, opt, params):
        opt.param_groups[0]["lr"] = 1e-2 / (s + 1)  # read from the device: no new recording
        if s == 4:
            opt.param_groups[0]["betas"] = (0.8, 0.99)  # a kernel argument: a new recording

    make_opt = lambda p: O.AdamW(p, lr=1e-2)  # noqa: E731
    a, pa = run(make_opt, torch.float32, 9, graphs=True, between=between)
    b, pb = run(make_opt, torch.float32, 9, graphs=False, between=between)
    assert a.step_graph_replays() >= 5
    assert_same_run(a, pa, b, pb)


def test_new_gradient_tensors_drop_the_recording_and_the_steps_stay_right():
    # Fresh gradients each step, the old ones kept alive so that no address repeats.
    keep = []

    def between(s, opt, params):
        keep.append([p.grad for p in params])

    make_opt = lambda p: O.AdamW(p, lr=1e-2)  # noqa: E731
    a, pa = run(make_opt, torch.float32, 5, graphs=True, between=between, in_place=False)
    b, pb = run(make_opt, torch.float32, 5, graphs=False, in_place=False)
    assert a.step_graph_replays() == 0
    assert_same_run(a, pa, b, pb)


def test_a_non_finite_gradient_skips_a_replayed_step():
    def between(s, opt, params):
        if s == 4:
            params[1].grad[7] = float("inf")

    make_opt = lambda p: O.AdamW(p, lr=1e-2)  # noqa: E731
    a, pa = run(make_opt, torch.float32, 6, graphs=True, between=between)
    b, pb = run(make_opt, torch.float32, 6, graphs=False, between=between)
    assert a.step_graph_replays() >= 3
    assert a.skipped_steps() == b.skipped_steps() == 1
    assert_same_run(a, pa, b, pb)


def test_grad_scaler_replays_read_its_flag_and_scale():
    def steps(graphs):
        torch.manual_seed(0)
        m = torch.nn.Linear(80, 70).cuda()
        # skip_nonfinite off: only GradScaler's found_inf can skip a step here.
        opt = O.AdamW(m.parameters(), lr=1e-2, skip_nonfinite=False)
        opt.set_step_graphs(graphs)
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 12, growth_interval=3)
        gen = torch.Generator(device="cuda").manual_seed(1)
        for s in range(9):
            loss = m(torch.randn(8, 80, device="cuda", generator=gen)).square().mean()
            if s == 5:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=False)  # the gradients stay where they are: the steps replay
        torch.cuda.synchronize()
        return opt, list(m.parameters()), scaler

    a, pa, sa = steps(True)
    b, pb, sb = steps(False)
    assert a.step_graph_replays() >= 4
    assert sa.get_scale() == sb.get_scale()
    assert int(a.state[pa[0]]["counters"][0]) == int(b.state[pb[0]]["counters"][0]) == 8  # the inf's step skipped
    assert_same_run(a, pa, b, pb)


def test_a_loaded_state_is_not_stepped_by_a_stale_recording():
    make_opt = lambda p: O.AdamW(p, lr=1e-2)  # noqa: E731
    saved = {}

    def between(s, opt, params):
        if s == 3:
            saved["sd"] = {k: v for k, v in opt.state_dict().items()}
            saved["sd"] = torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t,
                                                       saved["sd"])
        if s == 6:
            opt.load_state_dict(saved["sd"])

    a, pa = run(make_opt, torch.float32, 9, graphs=True, between=between)
    b, pb = run(make_opt, torch.float32, 9, graphs=False, between=between)
    assert a.step_graph_replays() >= 4
    assert_same_run(a, pa, b, pb)


def test_a_replay_bumps_the_parameters_versions():
    params = make()
    opt = O.AdamW(params, lr=1e-2)
    for p in params:
        p.grad = torch.randn_like(p)
    for _ in range(3):
        opt.step()
    assert opt.step_graph_replays() >= 1
    before = [p._version for p in params]
    opt.step()
    assert opt.step_graph_replays() >= 2
    assert all(p._version > v for p, v in zip(params, before))


def test_a_parameter_swapped_in_its_group_is_stepped_not_the_old_one():
    # The same number of parameters, one of them another tensor: the recording (of the old one's addresses) must not
    # do the step; the new parameter gets its state and its steps as it would without step graphs.
    def between(s, opt, params):
        if s == 4:
            new = params[2].detach().clone().requires_grad_()
            new.grad = params[2].grad.clone()
            params[2] = new
            opt.param_groups[0]["params"][2] = new

    make_opt = lambda p: O.AdamW(p, lr=1e-2)  # noqa: E731
    a, pa = run(make_opt, torch.float32, 8, graphs=True, between=between)
    b, pb = run(make_opt, torch.float32, 8, graphs=False, between=between)
    assert a.step_graph_replays() >= 3
    assert int(a.state[pa[2]]["counters"][0]) == int(b.state[pb[2]]["counters"][0]) == 4  # steps 4..7
    assert_same_run(a, pa, b, pb)
