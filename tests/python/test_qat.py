"""lowbit's fake-quant (QAT) ops from Python: torch.ops.lowbit.fake_quant_*, against the ATen
reference and against torchao's formulas written out in torch ops."""

import pytest
import torch

import lowbit  # noqa: E402,F401  (conftest.py: the installed package, or python/ with LOWBIT_LIBRARY)
ops = torch.ops.lowbit

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
EPS = torch.finfo(torch.float32).eps


def torchao_style(x, group, bits, signed, symmetric):
    """choose_qparams_affine + quantize_affine + dequantize_affine, as torchao writes them."""
    qmin, qmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    xg = x.reshape(-1, group).float()
    min_neg = torch.clamp(xg.amin(1), max=0)
    max_pos = torch.clamp(xg.amax(1), min=0)
    if symmetric:
        amax = torch.maximum(-min_neg, max_pos)
        scale = torch.clamp(amax / torch.full_like(amax, (qmax - qmin) / 2), min=EPS)
        zp = torch.full_like(scale, (qmin + qmax + 1) // 2)
    else:
        scale = torch.clamp((max_pos - min_neg) / torch.full_like(max_pos, qmax - qmin), min=EPS)
        zp = torch.clamp(qmin - torch.round(min_neg / scale), qmin, qmax)
    q = torch.round(xg * torch.reciprocal(scale)[:, None]) + zp[:, None]
    mask = (q >= qmin) & (q <= qmax)
    y = (torch.clamp(q, qmin, qmax) - zp[:, None]) * scale[:, None]
    return y.to(x.dtype).view(x.shape), mask.view(-1), scale, zp


def unpack(mask, n):
    bits = (mask[:, None].long() >> torch.arange(8, device=mask.device)) & 1
    return bits.view(-1)[:n].bool()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits,signed,symmetric,group", [(4, True, True, 32), (8, True, False, 100), (4, False, False, 7), (2, True, True, 1), (8, False, True, 600)])
def test_fake_quant_matches_reference_and_torchao_formulas(device, dtype, bits, signed, symmetric, group):
    x = (torch.randn(6, 700) * 3).to(dtype)
    x[2] = 0
    y, mask, scale, zp = ops.fake_quant_dynamic(x.to(device), group if 4200 % group == 0 else 1, bits, signed, symmetric, EPS)
    g = group if 4200 % group == 0 else 1
    ry, rmask, rscale, rzp = ops.fake_quant_dynamic_reference(x, g, bits, signed, symmetric, EPS)
    assert torch.equal(y.cpu(), ry) and torch.equal(mask.cpu(), rmask)
    assert torch.equal(scale.cpu(), rscale) and torch.equal(zp.cpu(), rzp)
    ty, tmask, tscale, tzp = torchao_style(x, g, bits, signed, symmetric)
    assert torch.equal(ry, ty)
    assert torch.equal(unpack(rmask, x.numel()), tmask)
    assert torch.equal(rscale, tscale) and torch.equal(rzp, tzp)
    grad = torch.randn_like(x)
    dx = ops.fake_quant_backward(grad.to(device), mask)
    assert torch.equal(dx.cpu(), torch.where(tmask.view(x.shape), grad, torch.zeros_like(grad)))


@pytest.mark.parametrize("device", DEVICES)
def test_refuses_bad_arguments_with_the_value(device):
    x = torch.randn(4, 10, device=device)
    with pytest.raises(RuntimeError, match="group_size 7 does not divide the input's 40 elements"):
        ops.fake_quant_dynamic(x, 7, 4, True, True, EPS)
    with pytest.raises(RuntimeError, match=r"bits must be in \[2, 8\], got 9"):
        ops.fake_quant_dynamic(x, 10, 9, True, True, EPS)
    with pytest.raises(RuntimeError, match="input must be float32, bfloat16 or float16"):
        ops.fake_quant_dynamic(x.int(), 10, 4, True, True, EPS)


def test_codes_pack_and_dequantize_round_trip():
    w = torch.randn(12, 64)
    y, mask, scale, zp = ops.fake_quant_dynamic(w, 32, 4, True, True, EPS)
    codes = ops.quantize_codes(w, scale, zp, 32, 4, True)
    packed = ops.pack_codes(codes, 4)
    assert packed.numel() == w.numel() // 2
    back = ops.unpack_codes(packed, 4, w.numel()).view(w.shape)
    assert torch.equal(ops.dequantize_codes(back, scale, zp, 32, 4, True, torch.float32), y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,dt", [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_float8_matches_torch_cast(device, fmt, dt):
    """torchao's float8 fake quant: scale = amax / fmax, x / scale clamped, cast, times scale."""
    x = torch.randn(8, 64) * 10
    x[3] = 0
    y, mask, scale = ops.fake_quant_float8(x.to(device), 64, fmt, EPS)
    fmax = torch.finfo(dt).max
    s = torch.clamp(x.abs().amax(1) / torch.full((8,), fmax), min=EPS)
    want = torch.clamp(x / s[:, None], -fmax, fmax).to(dt).float() * s[:, None]
    assert torch.equal(scale.cpu(), s)
    assert torch.equal(y.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "nvfp4"])
def test_block_float_matches_reference(device, fmt):
    x = torch.randn(4, 64) * 3
    got = ops.fake_quant_block_float(x.to(device), fmt, EPS)
    want = ops.fake_quant_block_float_reference(x, fmt, EPS)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)


def _qat_calls(make):
    """Every QAT op (and its _reference oracle where one exists) on tensors made by make(shape, dtype)."""
    x, s, z = make((8, 64), torch.float32), make((16,), torch.float32), make((16,), torch.float32)
    codes, mask = make((8, 64), torch.uint8), make((64,), torch.uint8)
    calls = {
        "fake_quant_dynamic": (x, 32, 4, True, False, 1e-6),
        "fake_quant_static": (x, s, z, 32, 4, True),
        "fake_quant_float8": (x, 32, "e4m3", 1e-12),
        "fake_quant_block_float": (x, "nvfp4", 1e-12),
        "fake_quant_backward": (x, mask),
        "fake_quant_lsq_backward": (x, x, s, z, 32, 4, True, 1.0),
        "fake_quant_qparams": (s, s, 4, True, True, 1e-6),
        "quantize_codes": (x, s, z, 32, 4, True),
        "dequantize_codes": (codes, s, z, 32, 4, True, torch.bfloat16),
        "pack_codes": (codes.reshape(-1), 4),
        "unpack_codes": (make((256,), torch.uint8), 4, 512),
    }
    for name in ["fake_quant_dynamic", "fake_quant_static", "fake_quant_float8", "fake_quant_block_float",
                 "fake_quant_backward", "fake_quant_lsq_backward"]:
        calls[name + "_reference"] = calls[name]
    return calls


def test_every_qat_op_infers_its_outputs_on_meta_tensors():
    """Shape inference (FakeTensor, torch.compile): every op runs on meta tensors and gives the
    shapes and dtypes the CPU kernels give on real ones."""
    def real(shape, dtype):
        if dtype == torch.uint8:
            return torch.randint(0, 16, shape, dtype=dtype)
        # Small positive integers: valid scales and zero points of every format here; finite inputs.
        return torch.randint(1, 4, shape).to(dtype)
    meta_calls = _qat_calls(lambda shape, dtype: torch.empty(shape, dtype=dtype, device="meta"))
    real_calls = _qat_calls(real)
    assert len(meta_calls) == 17
    for name, args in meta_calls.items():
        got = getattr(ops, name)(*args)
        want = getattr(ops, name)(*real_calls[name])
        got = got if isinstance(got, (tuple, list)) else (got,)
        want = want if isinstance(want, (tuple, list)) else (want,)
        assert [o.device.type for o in got] == ["meta"] * len(got), name
        assert [(tuple(o.shape), o.dtype) for o in got] == [(tuple(o.shape), o.dtype) for o in want], name
