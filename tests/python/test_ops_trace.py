"""The QAT code ops trace for torch.compile: quantize_codes, dequantize_codes and fake_quant_float8 run on meta
tensors (shape inference: the CompositeExplicitAutograd reference serves the Meta key, ATen ops only) and a
function of all three compiles with fullgraph=True to the eager bits."""
import torch

import lowbit  # noqa: F401  (conftest.py)

ops = torch.ops.lowbit


def test_on_meta_tensors_the_outputs_have_the_right_shapes_and_dtypes():
    x = torch.empty(6, 64, device="meta", dtype=torch.bfloat16)
    scale, zero = torch.empty(12, device="meta"), torch.empty(12, device="meta")
    codes = ops.quantize_codes(x, scale, zero, 32, 4, True)
    assert codes.device.type == "meta" and codes.shape == x.shape and codes.dtype == torch.uint8
    back = ops.dequantize_codes(codes, scale, zero, 32, 4, True, torch.float16)
    assert back.shape == x.shape and back.dtype == torch.float16
    out, mask, s = ops.fake_quant_float8(x, 32, "e4m3", 1e-12)
    assert (out.shape, out.dtype) == (x.shape, x.dtype)
    assert mask.dtype == torch.uint8 and mask.numel() == (6 * 64 + 7) // 8
    assert s.shape == (12,) and s.dtype == torch.float32


def test_the_three_compile_with_fullgraph_to_the_eager_bits():
    torch.manual_seed(0)
    x = torch.randn(4, 96)
    scale, zero = torch.full((12,), 0.05), torch.zeros(12)

    def f(x):
        codes = ops.quantize_codes(x, scale, zero, 32, 4, True)
        y = ops.dequantize_codes(codes, scale, zero, 32, 4, True, torch.float32)
        return ops.fake_quant_float8(y * 3, 32, "e4m3", 1e-12)[0], codes

    want = f(x)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
