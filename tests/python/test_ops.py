"""lowbit's ops from Python: import lowbit, then torch.ops.lowbit.*."""
import os
import subprocess

import pytest
import torch

import lowbit  # noqa: E402,F401  (conftest.py: the installed package, or python/ with LOWBIT_LIBRARY)
ops = torch.ops.lowbit

FORMATS = ["Dyn8Signed", "Dyn8Unsigned", "DE4Signed", "Linear4Unsigned", "FP8E4M3", "FP8E5M2", "Pow8Signed",
           "Pow8Unsigned"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def dynamic_map_bnb_style(signed, exponent_bits, total_bits):
    """The 8-bit optimizers paper's dynamic map built with torch ops, as bitsandbytes does."""
    data = []
    non_sign_bits = total_bits - 1
    for i in range(exponent_bits):
        items = 2 ** (i + non_sign_bits - exponent_bits) + 1 if signed else 2 ** (i + non_sign_bits - exponent_bits + 1) + 1
        grid = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = (grid[:-1] + grid[1:]) / 2.0
        data += ((10 ** (-(exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(exponent_bits - 1) + i)) * means).tolist()
    data += [0.0, 1.0]
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def cli(*args):
    return subprocess.run([os.environ["LOWBIT_CLI"], *args], capture_output=True, text=True)


@pytest.mark.parametrize("fmt,args", [("Dyn8Signed", (True, 7, 8)), ("Dyn8Unsigned", (False, 7, 8)), ("DE4Signed", (True, 3, 4))])
def test_dynamic_maps_match_bitsandbytes_construction(fmt, args):
    want = dynamic_map_bnb_style(*args)
    got = torch.tensor([float(v) for v in cli("codebook", fmt).stdout.split()], dtype=torch.float32)
    assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_matches_reference_and_round_trips(device, fmt):
    x = torch.randn(3 * 256 + 17, device=device) * 3
    if "Unsigned" in fmt:
        x = x.abs()
    codes, absmax = ops.quantize_blockwise(x, fmt, 0)
    rcodes, rabsmax = ops.quantize_blockwise_reference(x.cpu(), fmt, 0)
    assert codes.device.type == device and codes.dtype == torch.uint8
    assert torch.equal(codes.cpu(), rcodes) and torch.equal(absmax.cpu(), rabsmax)
    block = 64 if fmt.startswith("Pow8") else (128 if "4" in fmt and "FP8" not in fmt else 256)
    y = ops.dequantize_blockwise(codes, absmax, fmt, 0, list(x.shape), torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    scale = absmax.repeat_interleave(block)[: x.numel()]
    # Widest half-gap of the codebook or clamp distance at a range end, plus bf16 output rounding.
    cb = torch.tensor([float(v) for v in cli("codebook", fmt).stdout.split()])
    cb = cb[cb.isfinite()].sort().values
    lo = 0.0 if "Unsigned" in fmt else -1.0
    bound = max((cb[1:] - cb[:-1]).max().item() / 2, cb[0].item() - lo, 1 - cb[-1].item())
    if fmt.startswith("Pow8"):  # rounds sqrt|x|: crossovers 1/(4 m^2) below the value midpoints
        bound += 0.25 / (127.0 if "Signed" in fmt else 255.0) ** 2
    assert ((y.float() - x).abs() / scale).max().item() <= bound + 0.004


def test_errors_reach_python():
    with pytest.raises(RuntimeError, match="NaN or Inf in block 0"):
        ops.quantize_blockwise(torch.tensor([1.0, float("nan")]), "Dyn8Signed", 0)
    with pytest.raises(RuntimeError, match="unknown quantization format 'int8'"):
        ops.quantize_blockwise(torch.ones(4), "int8", 0)
    with pytest.raises(RuntimeError, match="block_size must be"):
        ops.quantize_blockwise(torch.ones(4), "FP8E4M3", 48)


def test_cli_info_and_errors():
    info = cli("info")
    assert info.returncode == 0 and "libtorch 2." in info.stdout and "cpu   yes" in info.stdout
    bad = cli("codebook", "int8")
    assert bad.returncode != 0 and "unknown quantization format" in bad.stderr
    assert len(cli("codebook", "FP8E5M2").stdout.split()) == 256


# kernels::Hyper as the op carries it (tensors/optim_ops.h): the fields in pack order.
def adamw_q8(device, n, block=256):
    m = ops.quantize_blockwise(torch.zeros(n, device=device), "Dyn8Signed", block)
    v = ops.quantize_blockwise(torch.zeros(n, device=device), "Dyn8Unsigned", block)
    return [m[0], m[1], v[0], v[1]]


@pytest.mark.parametrize("device", DEVICES)
def test_fused_adamw_step_op_equals_reference_op(device):
    """lowbit::optim_step_ with Q8 state (codes from quantize_blockwise) against the ATen oracle."""
    torch.manual_seed(0)
    n = 10007
    p0 = torch.randn(n, device=device)
    runs = []
    for op in (ops.optim_step_, ops.optim_step_reference_):
        p = p0.clone()
        state = adamw_q8(device, n)
        counters = torch.zeros(2, dtype=torch.int64, device=device)
        lr = torch.tensor([1e-2], dtype=torch.float64, device=device)
        gen = torch.Generator(device="cpu").manual_seed(1)
        for _ in range(3):
            g = torch.randn(n, generator=gen).to(device)
            op([p], [g], state, [counters], lr, rule="AdamW", slots=["Dyn8Signed", "Dyn8Unsigned"], weight_decay=1e-2)
        assert counters.tolist() == [3, 0]
        runs.append((p, state))
    (pa, sa), (pb, sb) = runs
    assert torch.equal(pa, pb)
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))
    assert not torch.equal(pa, p0)


def test_grad_check_op():
    g = [torch.randn(5000), torch.tensor([1.0, 2.0]), torch.zeros(0)]
    found_inf, sumsq = ops.grad_check(g, [0, 1, 1], 2, True)
    assert found_inf.tolist() == [0.0]
    assert abs(sumsq[0].item() - g[0].double().pow(2).sum().item()) <= 1e-9 * sumsq[0].item()
    assert sumsq[1].item() == 5.0
    found_inf, _ = ops.grad_check(g + [torch.tensor([float("inf")])], [0, 1, 1, 0], 2, False)
    assert found_inf.tolist() == [1.0]


def test_step_op_names_the_bad_argument():
    p, g = torch.randn(300), torch.randn(300)
    counters, lr = torch.zeros(2, dtype=torch.int64), torch.tensor([1e-3], dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"slot 0 of parameter 0 \(fp32\) must be Float with 300 elements"):
        ops.optim_step_([p], [g], [torch.zeros(299)], [counters], lr, rule="SGD", slots=["fp32"], momentum=0.9)
    with pytest.raises(RuntimeError, match="unknown rule 'Adamw2'"):
        ops.optim_step_([p], [g], [], [counters], lr, rule="Adamw2", slots=[])
    with pytest.raises(RuntimeError, match="unknown slot storage 'Dyn9'"):
        ops.optim_step_([p], [g], [], [counters], lr, rule="SGD", slots=["Dyn9"])
    with pytest.raises(RuntimeError, match="counters has 0 entries for 1 parameters"):
        ops.optim_step_([p], [g], [], [], lr, rule="SGD", slots=[])


def test_blockwise_and_step_ops_have_meta_kernels():
    """Shape inference on meta tensors: the same checks, no data read."""
    x = torch.empty(1000, device="meta")
    codes, absmax = ops.quantize_blockwise(x, "DE4Signed", 0)
    assert codes.shape == (500,) and codes.dtype == torch.uint8 and absmax.shape == (8,)
    y = ops.dequantize_blockwise(codes, absmax, "DE4Signed", 128, [10, 100], torch.bfloat16)
    assert y.shape == (10, 100) and y.dtype == torch.bfloat16 and y.device.type == "meta"
    with pytest.raises(RuntimeError, match="block_size"):
        ops.quantize_blockwise(x, "FP8E4M3", 48)
    found_inf, sumsq = ops.grad_check([torch.empty(10, device="meta")], [0], 3, True)
    assert found_inf.shape == (1,) and sumsq.shape == (3,)
