"""A training step compiled with the optimizer inside: torch.compile breaks its graph at the step (optimizer.py
eager_under_compile) and runs it as it comes, so the bits are eager's (aot_eager: the same ATen kernels)."""
import torch

import lowbit  # noqa: F401  (conftest.py)


def make():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(300, 40), torch.nn.Tanh(), torch.nn.Linear(40, 2))
    return m, lowbit.optim.AdamW(m.parameters(), state_format="Q8", min_quant_numel=64)


def train_step(model, opt, x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def test_a_compiled_training_step_equals_the_eager_one():
    a, opt_a = make()
    b, opt_b = make()
    compiled = torch.compile(train_step, backend="aot_eager")
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(8, 300, generator=gen)
        assert torch.equal(compiled(a, opt_a, x), train_step(b, opt_b, x))
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
        assert all(torch.equal(v, opt_b.state[q][k]) for k, v in opt_a.state[p].items() if isinstance(v, torch.Tensor))
    assert int(opt_a.state[a[0].weight]["counters"][0]) == 3
