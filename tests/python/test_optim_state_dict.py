"""state_dict() / load_state_dict() of the optimizer classes: codes and scales saved and loaded as they are (a run
resumed from a torch.save'd state dict equals the run that went on), torch.optim.AdamW's state dict loaded into
lowbit's (quantized), and dicts that do not fit refused before anything changes."""
import io

import pytest
import torch

import lowbit
from cpp_reference import same_bits, state_list

FORMATS = ["FP32", "BF16", "Q8", "Q4", "FP8", "C8"]


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(97, 61), torch.nn.ReLU(), torch.nn.Linear(61, 3))


def train(m, opt, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 97, generator=gen)
        m(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def through_a_file(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cls", [lowbit.optim.AdamW, lowbit.optim.AdEMAMix, lowbit.optim.RMSprop])
def test_round_trip_through_a_file_is_bit_exact(cls, fmt):
    kw = dict(momentum=0.9, centered=True) if cls is lowbit.optim.RMSprop else {}
    a = model(0)
    opt_a = cls(a.parameters(), state_format=fmt, min_quant_numel=100, **kw)
    train(a, opt_a, 3, seed=1)
    saved = through_a_file(opt_a.state_dict())
    b = model(0)
    b.load_state_dict(a.state_dict())
    opt_b = cls(b.parameters(), state_format=fmt, min_quant_numel=100, **kw)
    opt_b.load_state_dict(saved)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert all(same_bits(x, y) for x, y in zip(state_list(opt_a, pa), state_list(opt_b, pb)))
    train(a, opt_a, 2, seed=2)
    train(b, opt_b, 2, seed=2)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert same_bits(pa, pb)
        sa, sb = state_list(opt_a, pa), state_list(opt_b, pb)
        assert len(sa) == len(sb) > 0 and all(same_bits(x, y) for x, y in zip(sa, sb))
        assert torch.equal(opt_a.state[pa]["counters"], opt_b.state[pb]["counters"])
    assert opt_a.state_dict()["param_groups"] == opt_b.state_dict()["param_groups"]


def test_the_state_dict_holds_codes_and_scales_not_fp32():
    m = model(0)
    opt = lowbit.optim.AdamW(m.parameters(), state_format="Q8")
    train(m, opt, 1, seed=1)
    st = opt.state_dict()["state"][0]  # the 97 x 61 weight: 5917 elements, quantized
    assert st["slots"] == ["Dyn8Signed", "Dyn8Unsigned"] and st["block_size"] == 256
    assert st["exp_avg.codes"].dtype == torch.uint8 and st["exp_avg.codes"].numel() == 61 * 97
    assert st["exp_avg_sq.absmax"].dtype == torch.float32 and st["exp_avg_sq.absmax"].numel() == (61 * 97 + 255) // 256
    assert opt.state_dict()["lowbit"]["format_version"] == 1


@pytest.mark.parametrize("amsgrad", [False, True])
def test_a_torch_adamw_state_dict_loads_quantized(amsgrad):
    m = model(3)
    ref = torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.03, amsgrad=amsgrad)
    train(m, ref, 2, seed=4)
    sd = ref.state_dict()
    opt = lowbit.optim.AdamW(m.parameters(), state_format="Q8", amsgrad=amsgrad)
    opt.load_state_dict(sd)
    g = opt.param_groups[0]
    assert g["lr"] == 2e-3 and g["weight_decay"] == 0.03 and g["state_format"] == "Q8"  # torch's options, lowbit's format
    ops = torch.ops.lowbit
    for i, p in enumerate(m.parameters()):
        st, theirs = opt.state[p], sd["state"][i]
        assert int(st["counters"][0]) == 2
        for k, name in enumerate(["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])):
            slot = st["slots"][k]
            if slot == "fp32":  # small tensors keep fp32 state: the values as they were
                assert torch.equal(st[name], theirs[name].reshape(-1))
            else:
                codes, absmax = ops.quantize_blockwise(theirs[name].reshape(-1).float(), slot, st["block_size"])
                assert torch.equal(st[name + ".codes"], codes) and torch.equal(st[name + ".absmax"], absmax)
                back = ops.dequantize_blockwise(codes, absmax, slot, st["block_size"], [p.numel()])
                v = theirs[name].reshape(-1)
                assert (back - v).abs().max() <= 0.05 * v.abs().max()  # 8-bit: within a few % of the block scale
    train(m, opt, 1, seed=5)  # and it steps on from there
    assert int(opt.state[next(m.parameters())]["counters"][0]) == 3


def test_dicts_that_do_not_fit_are_refused_and_change_nothing():
    m = model(0)
    opt = lowbit.optim.AdamW(m.parameters(), state_format="Q8")
    train(m, opt, 1, seed=1)
    before = through_a_file(opt.state_dict())
    other = lowbit.optim.AdamW(m.parameters(), state_format="Q4")
    train(m, other, 1, seed=1)
    cases = [
        ({"state": {}, "param_groups": []}, "has 0 param groups, this optimizer 1"),
        (dict(other.state_dict()), "keeps its state as \\['DE4Signed', 'Linear4Unsigned'\\] in blocks of 128, this "
                                   "optimizer as \\['Dyn8Signed', 'Dyn8Unsigned'\\] in blocks of 256"),
    ]
    lost = through_a_file(opt.state_dict())
    del lost["state"][0]["exp_avg.codes"]
    cases.append((lost, "parameter 0 of group 0: 'exp_avg.codes' is missing"))
    wrong = through_a_file(opt.state_dict())
    wrong["state"][2]["exp_avg"] = wrong["state"][2]["exp_avg"][:5]
    cases.append((wrong, "parameter 2 of group 0: 'exp_avg' is torch.float32 \\[5\\]; expected torch.float32 \\[183\\]"))
    bad_lr = through_a_file(opt.state_dict())
    bad_lr["param_groups"][0]["lr"] = -1.0
    cases.append((bad_lr, "lr must be finite and >= 0, got -1"))
    for sd, message in cases:
        with pytest.raises((ValueError, RuntimeError), match=message):
            opt.load_state_dict(sd)
        now = opt.state_dict()
        assert now["param_groups"] == before["param_groups"]
        for i in before["state"]:
            for k, v in before["state"][i].items():
                assert same_bits(v, now["state"][i][k]) if isinstance(v, torch.Tensor) else v == now["state"][i][k]


def test_loading_into_an_optimizer_that_has_stepped_replaces_its_state():
    """The new state is what the next step writes (not the state the optimizer held before the load)."""
    saved_from = model(0)
    opt_saved = lowbit.optim.AdamW(saved_from.parameters(), state_format="Q8")
    train(saved_from, opt_saved, 2, seed=1)
    sd = through_a_file(opt_saved.state_dict())
    a, b = model(0), model(0)
    opt_a = lowbit.optim.AdamW(a.parameters(), state_format="Q8")
    train(a, opt_a, 3, seed=9)  # steps of its own first
    b.load_state_dict(a.state_dict())
    opt_b = lowbit.optim.AdamW(b.parameters(), state_format="Q8")
    opt_a.load_state_dict(sd)
    opt_b.load_state_dict(sd)
    train(a, opt_a, 2, seed=2)
    train(b, opt_b, 2, seed=2)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert same_bits(pa, pb)
        assert all(same_bits(x, y) for x, y in zip(state_list(opt_a, pa), state_list(opt_b, pb)))
        assert int(opt_a.state[pa]["counters"][0]) == 4
