"""Runs the C++ optimizers (lowbit_optimizer_steps, optimizer_steps.cpp) and the Python classes on the same inputs,
and compares what they end with bit for bit."""
import os
import subprocess
import tempfile

import torch

import lowbit


def run_cpp(specs):
    """specs: dicts as optimizer_steps.cpp's header describes; one process for all of them."""
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.pt"), os.path.join(d, "out.pt")
        torch.save(specs, src)
        subprocess.run([os.environ["LOWBIT_OPTIMIZER_STEPS"], src, dst], check=True)
        return torch.load(dst, weights_only=False)  # our own file, written by torch::pickle_save


def leaf(t):
    """A leaf parameter with t's values and strides (a non-contiguous t stays non-contiguous)."""
    return t.detach().clone().requires_grad_(True)


def run_python(cls, spec, **extra):
    """The spec's steps through lowbit.optim.<cls>; returns (params flat, optimizer)."""
    params = [[leaf(p) for p in group] for group in spec["params"]]
    opt = cls([dict(params=ps, **options) for ps, options in zip(params, spec["groups"])], **extra)
    for s, step_grads in enumerate(spec["grads"]):
        for g, grads in enumerate(step_grads):
            if "lrs" in spec:
                opt.param_groups[g]["lr"] = spec["lrs"][s][g]
            for p, grad in zip(params[g], grads):
                p.grad = None if grad is None else grad.clone()
        opt.step()
    return [p for group in params for p in group], opt


def state_list(opt, p):
    """p's state in the op's order (what optimizer_steps.cpp writes), [] where none was made."""
    st = opt.state.get(p)
    if not st:
        return []
    return [st[k] for k in lowbit.optim.param_state.state_keys(tuple(st["slots"]), opt.state_names)]


def bits(t):
    """t's bytes (so NaNs and signed zeros compare too)."""
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1).to(torch.uint8)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def differences(params, opt, want):
    """What differs between the Python run (params, opt) and the C++ run's results `want`: [] when nothing."""
    diffs = []
    for i, p in enumerate(params):
        if not same_bits(p, want["params"][i]):
            diffs.append(f"param {i} {list(p.shape)} {p.dtype}")
        got, exp = state_list(opt, p), want["state"][i]
        if len(got) != len(exp):
            diffs.append(f"param {i}: {len(got)} state tensors, C++ {len(exp)}")
        diffs += [f"param {i} state {k}" for k, (x, y) in enumerate(zip(got, exp)) if not same_bits(x, y)]
        counters = opt.state[p]["counters"] if opt.state.get(p) else None
        if (counters is None) != (want["counters"][i] is None) or (
                counters is not None and not torch.equal(counters, want["counters"][i])):
            diffs.append(f"param {i} counters {counters} vs {want['counters'][i]}")
    if opt.skipped_steps() != want["skipped"]:
        diffs.append(f"skipped {opt.skipped_steps()} vs {want['skipped']}")
    return diffs
