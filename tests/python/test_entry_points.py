"""Bad input at every op from Python, as a table: each row one call through torch.ops.lowbit that must
raise an error whose message names the argument and the bad value (tests/test_entry_points.cpp is the
C++ side). A second, short table holds inputs of the same kinds that are valid and must work."""

import pytest
import torch

import lowbit  # noqa: E402,F401  (conftest.py: the installed package, or python/ with LOWBIT_LIBRARY)
ops = torch.ops.lowbit


def step_graph_inputs(params):
    return torch.classes.lowbit.StepGraphInputs(params)

NAN, INF = float("nan"), float("inf")
N = 512  # two Dyn8 blocks of 256


# ---------------------------------------------------------------------------------------------
# A valid call of each op; every row changes one thing
# ---------------------------------------------------------------------------------------------

def step_args(n=N, **change):
    """optim_step_'s arguments for one AdamW parameter with Q8 state (valid as they are)."""
    p = torch.randn(n)
    m_codes, m_absmax = ops.quantize_blockwise(torch.zeros(n), "Dyn8Signed", 0)
    v_codes, v_absmax = ops.quantize_blockwise(torch.zeros(n), "Dyn8Unsigned", 0)
    a = dict(params=[p], grads=[torch.randn(n)], state=[m_codes, m_absmax, v_codes, v_absmax],
             counters=[torch.zeros(2, dtype=torch.int64)], lr=torch.tensor([1e-3], dtype=torch.float64),
             rule="AdamW", slots=["Dyn8Signed", "Dyn8Unsigned"])
    a.update(change)
    return a


def step(op="optim_step_", **change):
    a = step_args(**change)
    return getattr(ops, op)(a.pop("params"), a.pop("grads"), a.pop("state"), a.pop("counters"), a.pop("lr"), **a)


def with_state(i, t):
    """step_args' state with tensor i replaced by t."""
    s = step_args()["state"]
    s[i] = t
    return s


def strided(t):
    """t's values in a tensor that is not contiguous."""
    return torch.stack([t, t], 1)[:, 0]


x = torch.randn(1000)
codes, absmax = ops.quantize_blockwise(x, "Dyn8Signed", 0)
g8 = torch.randn(8, 64)
ones64 = torch.ones(8)


# ---------------------------------------------------------------------------------------------
# The table: (row name, call, substrings the message must hold: the argument and the bad value)
# ---------------------------------------------------------------------------------------------

ROWS = [
    # ---- quantize_blockwise (and its reference)
    ("quantize: unknown format", lambda: ops.quantize_blockwise(x, "Dyn9", 0), ["format", "Dyn9"]),
    ("quantize: format name empty", lambda: ops.quantize_blockwise(x, "", 0), ["format", "''"]),
    ("quantize: block_size not a power of two", lambda: ops.quantize_blockwise(x, "Dyn8Signed", 100),
     ["block_size", "100"]),
    ("quantize: block_size negative", lambda: ops.quantize_blockwise(x, "Dyn8Signed", -256), ["block_size", "-256"]),
    ("quantize: block_size too small", lambda: ops.quantize_blockwise(x, "DE4Signed", 1), ["block_size", "1"]),
    ("quantize: block_size 2^40", lambda: ops.quantize_blockwise(x, "FP8E4M3", 1 << 40),
     ["block_size", str(1 << 40)]),
    ("quantize: wrong dtype", lambda: ops.quantize_blockwise(x.long(), "Dyn8Signed", 0), ["input", "Long"]),
    ("quantize: float64", lambda: ops.quantize_blockwise(x.double(), "Dyn8Signed", 0), ["input", "Double"]),
    ("quantize: sparse layout", lambda: ops.quantize_blockwise(x.to_sparse(), "Dyn8Signed", 0), ["input", "Sparse"]),
    ("quantize: NaN in the input", lambda: ops.quantize_blockwise(torch.tensor([1.0, NAN]), "Dyn8Signed", 0),
     ["input", "NaN", "block 0"]),
    ("quantize: negative input, unsigned format", lambda: ops.quantize_blockwise(-x.abs(), "Dyn8Unsigned", 0),
     ["input", "negative", "Dyn8Unsigned"]),
    ("quantize_reference: block_size not a power of two",
     lambda: ops.quantize_blockwise_reference(x, "Dyn8Signed", 100), ["block_size", "100"]),
    ("quantize_reference: unknown format", lambda: ops.quantize_blockwise_reference(x, "Q8", 0), ["format", "Q8"]),

    # ---- dequantize_blockwise (and its reference)
    ("dequantize: codes wrong dtype",
     lambda: ops.dequantize_blockwise(codes.float(), absmax, "Dyn8Signed", 0, [1000]), ["codes", "Float"]),
    ("dequantize: absmax wrong dtype",
     lambda: ops.dequantize_blockwise(codes, absmax.double(), "Dyn8Signed", 0, [1000]), ["absmax", "Double"]),
    ("dequantize: absmax on another device",
     lambda: ops.dequantize_blockwise(codes, absmax.to("meta"), "Dyn8Signed", 0, [1000]), ["absmax", "meta"]),
    ("dequantize: absmax too short",
     lambda: ops.dequantize_blockwise(codes, absmax[:1], "Dyn8Signed", 0, [1000]), ["absmax", "got 1"]),
    ("dequantize: codes empty",
     lambda: ops.dequantize_blockwise(codes[:0], absmax, "Dyn8Signed", 0, [1000]), ["code bytes", "got 0"]),
    ("dequantize: shape too small", lambda: ops.dequantize_blockwise(codes, absmax, "Dyn8Signed", 0, [999]),
     ["shape", "999"]),
    ("dequantize: shape negative", lambda: ops.dequantize_blockwise(codes, absmax, "Dyn8Signed", 0, [-1000]),
     ["shape", "-1000"]),
    ("dequantize: unknown format", lambda: ops.dequantize_blockwise(codes, absmax, "nope", 0, [1000]),
     ["format", "nope"]),
    ("dequantize: block_size not a power of two",
     lambda: ops.dequantize_blockwise(codes, absmax, "Dyn8Signed", 3, [1000]), ["block_size", "3"]),
    ("dequantize: dtype int64",
     lambda: ops.dequantize_blockwise(codes, absmax, "Dyn8Signed", 0, [1000], torch.int64), ["dtype", "Long"]),
    ("dequantize_reference: absmax too short",
     lambda: ops.dequantize_blockwise_reference(codes, absmax[:2], "Dyn8Signed", 0, [1000]), ["absmax", "got 2"]),

    # ---- grad_check
    ("grad_check: groups shorter than grads", lambda: ops.grad_check([ones64, ones64], [0], 1, False),
     ["groups", "1 entries", "2 gradients"]),
    ("grad_check: num_groups negative", lambda: ops.grad_check([ones64], [0], -1, False), ["num_groups", "-1"]),
    ("grad_check: group id out of range", lambda: ops.grad_check([ones64], [3], 2, False), ["groups[0]", "3"]),
    ("grad_check: integer gradient", lambda: ops.grad_check([ones64, ones64.int()], [0, 0], 1, False),
     ["gradient 1", "Int"]),
    ("grad_check: gradients on two devices", lambda: ops.grad_check([ones64, ones64.to("meta")], [0, 0], 1, False),
     ["gradient 1", "meta"]),

    # ---- optim_step_: names (rule, slots)
    ("step: unknown rule", lambda: step(rule="AdamX"), ["rule", "AdamX"]),
    ("step: unknown slot storage", lambda: step(slots=["Dyn9", "Dyn8Unsigned"]), ["slots", "Dyn9"]),
    ("step: slots empty", lambda: step(slots=[], state=[]), ["slot 0", "AdamW"]),
    ("step: a slot the rule does not use", lambda: step(slots=["Dyn8Signed", "Dyn8Unsigned", "fp32"]),
     ["slot 2", "fp32"]),
    # ---- optim_step_: dtype, device, layout, contiguity
    ("step: integer parameter", lambda: step(params=[torch.zeros(N, dtype=torch.int64)]),
     ["parameter 0", "Long"]),
    ("step: float64 gradient", lambda: step(grads=[torch.zeros(N, dtype=torch.float64)]),
     ["gradient of parameter 0", "Double"]),
    ("step: gradient of another shape", lambda: step(grads=[torch.zeros(N + 1)]),
     ["parameter 0", "[513]"]),
    ("step: codes wrong dtype", lambda: step(state=with_state(0, torch.zeros(N, dtype=torch.int8))),
     ["slot 0 of parameter 0", "Char"]),
    ("step: absmax wrong dtype", lambda: step(state=with_state(1, torch.zeros(2, dtype=torch.float64))),
     ["slot 0 of parameter 0", "absmax", "Double"]),
    ("step: codes not contiguous", lambda: step(state=with_state(2, strided(torch.zeros(N, dtype=torch.uint8)))),
     ["codes of slot 1 of parameter 0", "not contiguous"]),
    ("step: state on another device", lambda: step(state=with_state(3, torch.zeros(2, device="meta"))),
     ["absmax of slot 1 of parameter 0", "meta"]),
    ("step: gradient on another device", lambda: step(grads=[torch.zeros(N, device="meta")]),
     ["gradient", "meta"]),
    ("step: parameters on two devices",
     lambda: step(params=[torch.zeros(N), torch.zeros(N, device="meta")], grads=[torch.zeros(N)] * 2,
                  state=step_args()["state"] * 2, counters=[torch.zeros(2, dtype=torch.int64)] * 2),
     ["parameter 1", "meta"]),
    ("step: sparse parameter", lambda: step(params=[torch.zeros(N).to_sparse()]), ["parameter 0", "Sparse"]),
    ("step: sparse gradient", lambda: step(grads=[torch.zeros(N).to_sparse()]), ["gradient", "Sparse"]),
    ("step: sparse state", lambda: step(state=with_state(1, torch.zeros(2).to_sparse())),
     ["absmax of slot 0 of parameter 0", "Sparse"]),
    ("step: counters int32", lambda: step(counters=[torch.zeros(2, dtype=torch.int32)]), ["counters[0]", "Int"]),
    ("step: counters not contiguous", lambda: step(counters=[strided(torch.zeros(2, dtype=torch.int64))]),
     ["counters[0]", "contiguous"]),
    ("step: counters empty", lambda: step(counters=[torch.zeros(0, dtype=torch.int64)]), ["counters[0]", "[0]"]),
    ("step: lr int64", lambda: step(lr=torch.tensor([1], dtype=torch.int64)), ["lr", "Long"]),
    ("step: lr empty", lambda: step(lr=torch.zeros(0, dtype=torch.float64)), ["lr", "got 0"]),
    ("step: lr on another device", lambda: step(lr=torch.zeros(1, dtype=torch.float64, device="meta")),
     ["lr", "meta"]),
    ("step: found_inf float64", lambda: step(found_inf=torch.zeros(1, dtype=torch.float64)),
     ["found_inf", "Double"]),
    ("step: grad_scale two values", lambda: step(grad_scale=torch.ones(2)), ["grad_scale", "got 2"]),
    ("step: grad_sumsq float32", lambda: step(grad_sumsq=torch.ones(1), max_grad_norm=1.0), ["grad_sumsq", "Float"]),
    ("step: lamb_norms wrong shape", lambda: step(rule="LAMB", lamb_norms=torch.zeros(2, 2, dtype=torch.float64)),
     ["lamb_norms", "[2, 2]"]),
    # ---- optim_step_: overlapping outputs
    ("step: one parameter passed twice",
     lambda: (lambda p: step(params=[p, p], grads=[torch.zeros(N)] * 2, state=step_args()["state"] + step_args()["state"],
                             counters=[torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)]))(torch.zeros(N)),
     ["parameter 1", "parameter 0", "share memory"]),
    ("step: codes aliasing the parameter",
     lambda: (lambda p: step(params=[p], state=with_state(0, p.view(torch.uint8)[:N])))(torch.zeros(N)),
     ["codes of slot 0 of parameter 0", "parameter 0", "share memory"]),
    ("step: counters shared by two parameters",
     lambda: (lambda c: step(params=[torch.zeros(N), torch.zeros(N)], grads=[torch.zeros(N)] * 2,
                             state=step_args()["state"] + step_args()["state"], counters=[c, c]))(
         torch.zeros(2, dtype=torch.int64)),
     ["counters[1]", "counters[0]", "share memory"]),
    ("step: expanded parameter", lambda: step(params=[torch.zeros(1).expand(N)]), ["parameter 0", "share memory"]),
    # ---- optim_step_: mismatched lists
    ("step: fewer grads than params", lambda: step(grads=[]), ["grads", "0 entries", "1 parameters"]),
    ("step: more counters than params", lambda: step(counters=[torch.zeros(2, dtype=torch.int64)] * 2),
     ["counters", "2 entries"]),
    ("step: state one tensor short", lambda: step(state=step_args()["state"][:3]), ["state", "3 tensors", "need 4"]),
    ("step: offsets of another length", lambda: step(offsets=[0, 0]), ["offsets", "2 entries"]),
    ("step: rng_keys of another length", lambda: step(rng_keys=[0, 1, 2]), ["rng_keys", "3 entries"]),
    ("step: offset negative", lambda: step(offsets=[-256]), ["offsets[0]", "-256"]),
    ("step: offset not on a block", lambda: step(offsets=[100]), ["offsets[0]", "100"]),
    # ---- optim_step_: block size
    ("step: block_size not a power of two", lambda: step(block_size=100), ["block_size", "100"]),
    ("step: block_size negative", lambda: step(block_size=-256), ["block_size", "-256"]),
    ("step: dense block_size not a multiple of 16", lambda: step(slots=["fp32", "fp32"],
                                                                 state=[torch.zeros(N), torch.zeros(N)], block_size=24),
     ["block_size", "24"]),
    # ---- optim_step_: hyper-parameters
    ("step: max_grad_norm negative", lambda: step(grad_sumsq=torch.ones(1, dtype=torch.float64), max_grad_norm=-1.0),
     ["max_grad_norm", "-1"]),
    ("step: max_grad_norm without grad_sumsq", lambda: step(max_grad_norm=1.0), ["max_grad_norm", "grad_sumsq"]),
    ("step: t_alpha_beta3 negative", lambda: step(rule="AdEMAMix", t_alpha_beta3=-5), ["t_alpha_beta3", "-5"]),
    ("step: a parameter that is not a leaf", lambda: step(params=[torch.randn(N, requires_grad=True) * 2]),
     ["parameter 0", "not a leaf"]),
]

# The per-step values in tensors, each out of its range: refused naming it, and nothing changes
# (test_a_refused_step_changes_nothing). (row name, changes to step_args, substrings of the message)
F64 = torch.float64
STEP_VALUE_ROWS = [
    ("lr NaN", dict(lr=torch.tensor([NAN], dtype=F64)), ["lr", "nan"]),
    ("lr Inf", dict(lr=torch.tensor([INF], dtype=F64)), ["lr", "inf"]),
    ("lr negative", dict(lr=torch.tensor([-1e-3], dtype=F64)), ["lr", "-0.001"]),
    ("lr negative, float32", dict(lr=torch.tensor([-2.0])), ["lr", "-2"]),
    ("grad_scale 0", dict(grad_scale=torch.zeros(1)), ["grad_scale", "0"]),
    ("grad_scale negative", dict(grad_scale=torch.tensor([-65536.0])), ["grad_scale", "-65536"]),
    ("grad_scale NaN", dict(grad_scale=torch.tensor([NAN])), ["grad_scale", "nan"]),
    ("grad_sumsq NaN", dict(grad_sumsq=torch.tensor([NAN], dtype=F64), max_grad_norm=1.0), ["grad_sumsq", "nan"]),
    ("grad_sumsq negative", dict(grad_sumsq=torch.tensor([-4.0], dtype=F64), max_grad_norm=1.0),
     ["grad_sumsq", "-4"]),
    ("lamb_norms NaN", dict(rule="LAMB", lamb_norms=torch.tensor([[1.0, NAN]], dtype=F64)),
     ["lamb_norms[0][1]", "nan"]),
    ("lamb_norms negative", dict(rule="LAMB", lamb_norms=torch.tensor([[-1.0, 2.0]], dtype=F64)),
     ["lamb_norms[0][0]", "-1"]),
    ("steps taken negative", dict(counters=[torch.tensor([-1, 0])]), ["counters[0][0]", "-1"]),
    ("steps taken at 2^53", dict(counters=[torch.tensor([1 << 53, 0])]), ["counters[0][0]", str(1 << 53)]),
    ("steps taken near int64's end", dict(counters=[torch.tensor([(1 << 63) - 1, 0])]),
     ["counters[0][0]", str((1 << 63) - 1)]),
    ("overflowed blocks negative", dict(counters=[torch.tensor([0, -3])]), ["counters[0][1]", "-3"]),
    ("offset whose last element is past int64", dict(offsets=[(1 << 63) - 256]),
     ["offsets[0]", str((1 << 63) - 256)]),
    ("an unsigned format for the signed first moment", dict(slots=["Dyn8Unsigned", "Dyn8Unsigned"]),
     ["slot 0", "exp_avg", "signed", "Dyn8Unsigned"]),
]


def aliasing_step_args():
    """FP32 state whose first moment is also the gradient."""
    m = torch.zeros(N)
    return step_args(slots=["fp32", "fp32"], state=[m, torch.zeros(N)], grads=[m])


STEP_VALUE_ROWS.append(("a gradient that is the first moment", None, ["gradient of parameter 0", "slot 0"]))


def _tensors(a):
    return [t for v in a.values() for t in (v if isinstance(v, list) else [v]) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name,change,want", STEP_VALUE_ROWS, ids=[r[0] for r in STEP_VALUE_ROWS])
def test_a_refused_step_names_the_value_and_changes_nothing(name, change, want):
    a = aliasing_step_args() if change is None else step_args(**change)
    tensors = _tensors(a)
    before = [t.clone() for t in tensors]
    versions = [t._version for t in tensors]
    with pytest.raises(RuntimeError) as e:
        ops.optim_step_(a.pop("params"), a.pop("grads"), a.pop("state"), a.pop("counters"), a.pop("lr"), **a)
    for w in want:
        assert w in str(e.value), f"{name}: the message does not name {w!r}: {e.value}"
    for t, b, v in zip(tensors, before, versions):
        assert torch.equal(t, b) or (t.isnan() == b.isnan()).all() and torch.equal(t.nan_to_num(), b.nan_to_num())
        assert t._version == v, f"{name}: a refused call bumped a version counter"


def test_the_step_bumps_the_version_of_what_it_writes():
    """A graph that saved the parameter refuses to backward through the stepped value, as it does
    after torch's in-place ops (and torch's fused optimizers)."""
    p = torch.randn(N, requires_grad=True)
    loss = (p * p).sum()  # saves p
    a = step_args(params=[p.detach()])
    written = a["params"] + a["counters"] + a["state"]
    versions = [t._version for t in written]
    ops.optim_step_(a.pop("params"), a.pop("grads"), a.pop("state"), a.pop("counters"), a.pop("lr"), **a)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    assert all(t._version > v for t, v in zip(written, versions))

# NaN / Inf in every float hyper-parameter of optim_step_ and optim_lamb_norms.
for _op in ("optim_step_", "optim_lamb_norms"):
    for _name in ("beta1", "beta2", "beta3", "eps", "weight_decay", "alpha", "momentum", "dampening", "lr_decay",
                  "max_grad_norm"):
        # max_grad_norm with its grad_sumsq, so that the finiteness check is what refuses it.
        _with = {"grad_sumsq": torch.ones(1, dtype=torch.float64)} if _name == "max_grad_norm" else {}
        for _bad in (NAN, INF, -INF):
            ROWS.append((f"{_op}: {_name}={_bad}",
                         (lambda op, kw: lambda: step(op, **kw))(_op, {_name: _bad, **_with}), [_name, str(_bad)]))

ROWS += [
    # ---- optim_state_layout
    ("state_layout: unknown rule", lambda: ops.optim_state_layout("Adamm", "Q8", 100), ["rule", "Adamm"]),
    ("state_layout: unknown state_format", lambda: ops.optim_state_layout("AdamW", "Q3", 100),
     ["state_format", "Q3"]),
    ("state_layout: numel negative", lambda: ops.optim_state_layout("AdamW", "Q8", -1), ["numel", "-1"]),
    ("state_layout: block_size not a power of two", lambda: ops.optim_state_layout("AdamW", "Q8", 8192, 100),
     ["block_size", "100"]),
    ("state_layout: fp8_second_moment unknown", lambda: ops.optim_state_layout("AdamW", "FP8", 8192, 0, 4096, 0.0,
                                                                             False, False, "FP8E3M4"),
     ["FP8E3M4"]),
    ("state_layout: master_weight_bits 12", lambda: ops.optim_state_layout("AdamW", "Q8", 8192, 0, 4096, 0.0, False,
                                                                         False, "FP8E4M3", 12),
     ["master_weight_bits", "12"]),

    # ---- fake_quant_dynamic / _static / _float8 / _block_float
    ("fake_quant_dynamic: bits 9", lambda: ops.fake_quant_dynamic(g8, 64, 9, True, True, 1e-6), ["bits", "9"]),
    ("fake_quant_dynamic: bits 1", lambda: ops.fake_quant_dynamic(g8, 64, 1, True, True, 1e-6), ["bits", "1"]),
    ("fake_quant_dynamic: group_size 0", lambda: ops.fake_quant_dynamic(g8, 0, 4, True, True, 1e-6),
     ["group_size", "0"]),
    ("fake_quant_dynamic: group_size does not divide", lambda: ops.fake_quant_dynamic(g8, 100, 4, True, True, 1e-6),
     ["group_size", "100"]),
    ("fake_quant_dynamic: eps NaN", lambda: ops.fake_quant_dynamic(g8, 64, 4, True, True, NAN), ["eps", "nan"]),
    ("fake_quant_dynamic: eps Inf", lambda: ops.fake_quant_dynamic(g8, 64, 4, True, True, INF), ["eps", "inf"]),
    ("fake_quant_dynamic: eps 0", lambda: ops.fake_quant_dynamic(g8, 64, 4, True, True, 0.0), ["eps", "0"]),
    ("fake_quant_dynamic: integer input", lambda: ops.fake_quant_dynamic(g8.long(), 64, 4, True, True, 1e-6),
     ["input", "Long"]),
    ("fake_quant_dynamic: sparse input", lambda: ops.fake_quant_dynamic(g8.to_sparse(), 64, 4, True, True, 1e-6),
     ["input", "Sparse"]),
    ("fake_quant_static: scale float64",
     lambda: ops.fake_quant_static(g8, torch.ones(8, dtype=torch.float64), torch.zeros(8), 64, 4, True),
     ["scale", "Double"]),
    ("fake_quant_static: scale empty", lambda: ops.fake_quant_static(g8, torch.ones(0), torch.zeros(8), 64, 4, True),
     ["scale", "got 0"]),
    ("fake_quant_static: zero_point one short",
     lambda: ops.fake_quant_static(g8, torch.ones(8), torch.zeros(7), 64, 4, True), ["zero_point", "got 7"]),
    ("fake_quant_static: scale on another device",
     lambda: ops.fake_quant_static(g8, torch.ones(8, device="meta"), torch.zeros(8), 64, 4, True), ["scale", "meta"]),
    ("fake_quant_float8: unknown format", lambda: ops.fake_quant_float8(g8, 64, "e3m4", 1e-6), ["format", "e3m4"]),
    ("fake_quant_float8: eps NaN", lambda: ops.fake_quant_float8(g8, 64, "e4m3", NAN), ["eps", "nan"]),
    ("fake_quant_block_float: unknown format", lambda: ops.fake_quant_block_float(g8, "mxfp3", 1e-6),
     ["format", "mxfp3"]),
    ("fake_quant_block_float: blocks do not divide", lambda: ops.fake_quant_block_float(torch.ones(40), "mxfp4", 1e-6),
     ["blocks of 32", "40"]),
    ("fake_quant_block_float: eps Inf", lambda: ops.fake_quant_block_float(g8, "nvfp4", INF), ["eps", "inf"]),
    ("fake_quant_backward: mask float", lambda: ops.fake_quant_backward(g8, torch.zeros(64)), ["mask", "Float"]),
    ("fake_quant_backward: mask too short",
     lambda: ops.fake_quant_backward(g8, torch.zeros(3, dtype=torch.uint8)), ["mask", "got 3"]),
    ("fake_quant_lsq_backward: grad of another shape",
     lambda: ops.fake_quant_lsq_backward(torch.ones(4, 128), g8, torch.ones(8), torch.zeros(8), 64, 4, True, 1.0),
     ["grad", "[4, 128]"]),
    ("fake_quant_qparams: bits 0",
     lambda: ops.fake_quant_qparams(-torch.ones(8), torch.ones(8), 0, True, True, 1e-6), ["bits", "0"]),
    ("fake_quant_qparams: eps NaN",
     lambda: ops.fake_quant_qparams(-torch.ones(8), torch.ones(8), 4, True, True, NAN), ["eps", "nan"]),
    ("quantize_codes: bits 9",
     lambda: ops.quantize_codes(g8, torch.ones(8), torch.zeros(8), 64, 9, True), ["bits", "9"]),
    ("dequantize_codes: dtype int64",
     lambda: ops.dequantize_codes(torch.zeros(8, 64, dtype=torch.uint8), torch.ones(8), torch.zeros(8), 64, 4, True,
                                  torch.int64), ["dtype", "Long"]),
    ("dequantize_codes: codes int8",
     lambda: ops.dequantize_codes(torch.zeros(8, 64, dtype=torch.int8), torch.ones(8), torch.zeros(8), 64, 4, True,
                                  torch.float32), ["codes", "Char"]),
    ("pack_codes: bits 9", lambda: ops.pack_codes(torch.zeros(8, dtype=torch.uint8), 9), ["bits", "9"]),
    ("pack_codes: codes float", lambda: ops.pack_codes(torch.zeros(8), 4), ["codes", "Float"]),
    ("unpack_codes: numel negative", lambda: ops.unpack_codes(torch.zeros(0, dtype=torch.uint8), 4, -1),
     ["numel", "-1"]),
    ("fake_quant_static: scale 0", lambda: ops.fake_quant_static(g8, torch.zeros(8), torch.zeros(8), 64, 4, True),
     ["scale[0]", "0"]),
    ("fake_quant_static: scale negative",
     lambda: ops.fake_quant_static(g8, torch.tensor([1.0] * 7 + [-0.5]), torch.zeros(8), 64, 4, True),
     ["scale[7]", "-0.5"]),
    ("fake_quant_static: scale NaN",
     lambda: ops.fake_quant_static(g8, torch.tensor([NAN] + [1.0] * 7), torch.zeros(8), 64, 4, True),
     ["scale[0]", "nan"]),
    ("fake_quant_static: zero_point past int4",
     lambda: ops.fake_quant_static(g8, torch.ones(8), torch.tensor([0.0, 8.0] + [0.0] * 6), 64, 4, True),
     ["zero_point[1]", "[-8, 7]", "8"]),
    ("fake_quant_static: zero_point below uint4",
     lambda: ops.fake_quant_static(g8, torch.ones(8), torch.full((8,), -1.0), 64, 4, False),
     ["zero_point[0]", "[0, 15]", "-1"]),
    ("fake_quant_static: zero_point fractional",
     lambda: ops.fake_quant_static(g8, torch.ones(8), torch.full((8,), 0.5), 64, 4, True), ["zero_point[0]", "0.5"]),
    ("fake_quant_static: zero_point NaN",
     lambda: ops.fake_quant_static(g8, torch.ones(8), torch.full((8,), NAN), 64, 4, True), ["zero_point[0]", "nan"]),
    ("fake_quant_lsq_backward: scale 0",
     lambda: ops.fake_quant_lsq_backward(g8, g8, torch.zeros(8), torch.zeros(8), 64, 4, True, 1.0), ["scale[0]", "0"]),
    ("quantize_codes: zero_point past int8",
     lambda: ops.quantize_codes(g8, torch.ones(8), torch.full((8,), 128.0), 64, 8, True), ["zero_point[0]", "128"]),
    ("dequantize_codes: scale Inf",
     lambda: ops.dequantize_codes(torch.zeros(8, 64, dtype=torch.uint8), torch.full((8,), INF), torch.zeros(8), 64, 4,
                                  False, torch.float32), ["scale[0]", "inf"]),
    ("fake_quant_qparams: min > max",
     lambda: ops.fake_quant_qparams(torch.tensor([-1.0, 2.0]), torch.tensor([1.0, 1.0]), 4, True, True, 1e-6),
     ["min[1]", "max[1]", "min <= max"]),
    ("fake_quant_qparams: max NaN",
     lambda: ops.fake_quant_qparams(torch.tensor([-1.0]), torch.tensor([NAN]), 4, True, False, 1e-6),
     ["max[0]", "nan"]),
    ("pack_codes: a code of 5 bits in 4", lambda: ops.pack_codes(torch.tensor([0x1F, 0x02], dtype=torch.uint8), 4),
     ["codes[0]", "31", "[0, 15]"]),
    ("pack_codes: a code of 8 bits in 6",
     lambda: ops.pack_codes(torch.tensor([1, 2, 255], dtype=torch.uint8), 6), ["codes[2]", "255", "[0, 63]"]),
    ("dequantize: absmax NaN", lambda: ops.dequantize_blockwise(codes, absmax.clone().fill_(NAN), "Dyn8Signed", 0,
                                                                [1000]), ["absmax[0]", "nan"]),
    ("dequantize: absmax Inf", lambda: ops.dequantize_blockwise(codes, torch.cat([absmax[:3], torch.tensor([INF])]),
                                                                "Dyn8Signed", 0, [1000]), ["absmax[3]", "inf"]),
    ("dequantize: absmax negative", lambda: ops.dequantize_blockwise(codes, -absmax, "Dyn8Signed", 0, [1000]),
     ["absmax[0]", "-"]),
    ("dequantize_reference: absmax negative",
     lambda: ops.dequantize_blockwise_reference(codes, -absmax, "Dyn8Signed", 0, [1000]), ["absmax[0]", "-"]),
    ("dequantize_codes: a code of 5 bits in 4",
     lambda: ops.dequantize_codes(torch.full((8, 64), 16, dtype=torch.uint8), torch.ones(8), torch.zeros(8), 64, 4,
                                  True, torch.float32), ["codes[0]", "16", "[0, 15]"]),
    ("unpack_codes: numel past the packed bytes", lambda: ops.unpack_codes(torch.zeros(4, dtype=torch.uint8), 4, 9),
     ["numel", "9"]),
    # ---- StepGraphInputs (the Python optimizers' step graphs)
    ("StepGraphInputs.look: recorded float", lambda: step_graph_inputs([torch.zeros(3)]).look(torch.zeros(1, 5)),
     ["recorded", "Float"]),
    ("StepGraphInputs.look: recorded of 3 columns",
     lambda: step_graph_inputs([torch.zeros(3)]).look(torch.zeros(2, 3, dtype=torch.int64)), ["recorded", "[2, 3]"]),
    ("StepGraphInputs.look: recorded not contiguous",
     lambda: step_graph_inputs([torch.zeros(3)]).look(torch.zeros(5, 2, dtype=torch.int64).t()),
     ["recorded", "[2, 5]"]),
    ("StepGraphInputs: not a list of tensors", lambda: step_graph_inputs([torch.zeros(3), 4]), ["Tensor"]),
]


@pytest.mark.parametrize("name,call,want", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_raises_an_error_naming_the_argument(name, call, want):
    with pytest.raises((RuntimeError, ValueError, TypeError, IndexError, NotImplementedError)) as e:
        call()
    msg = str(e.value)
    for w in want:
        assert w in msg, f"{name}: the message does not name {w!r}: {msg}"


# ---------------------------------------------------------------------------------------------
# Inputs of the same kinds that are valid: they must work (a check must not refuse them)
# ---------------------------------------------------------------------------------------------

def test_valid_inputs_of_the_same_kinds_work():
    # Non-contiguous input to quantize: as its contiguous copy.
    y = torch.randn(2000)
    assert all(torch.equal(u, v) for u, v in zip(ops.quantize_blockwise(y[::2], "Dyn8Signed", 0),
                                                 ops.quantize_blockwise(y[::2].contiguous(), "Dyn8Signed", 0)))
    # Empty input: empty codes and absmax, and back.
    c, m = ops.quantize_blockwise(torch.zeros(0), "Dyn8Signed", 0)
    assert c.numel() == 0 and m.numel() == 0
    assert ops.dequantize_blockwise(c, m, "Dyn8Signed", 0, [0]).numel() == 0
    # Block size 0 is the format's default.
    assert torch.equal(ops.quantize_blockwise(x, "Dyn8Signed", 0)[1], ops.quantize_blockwise(x, "Dyn8Signed", 256)[1])
    # Step-graph inputs of CPU parameters: nothing to record (no rows), never the same as a recording.
    rows, same = step_graph_inputs([torch.zeros(3, requires_grad=True)]).look(torch.zeros(1, 5, dtype=torch.int64))
    assert rows.shape == (0, 5) and not same
    assert step_graph_inputs([]).look()[0].shape == (0, 5)  # no parameters: nothing to record
    # An empty parameter list steps nothing; a parameter that is not contiguous steps like a contiguous one.
    ops.optim_step_([], [], [], [], torch.ones(1, dtype=torch.float64), rule="AdamW", slots=["fp32", "fp32"])
    p = torch.randn(N)
    q = strided(p.clone())
    a = step_args(params=[p])
    b = step_args(params=[q], grads=a["grads"], state=[t.clone() for t in a["state"]])
    for t in a, b:
        ops.optim_step_(t.pop("params"), t.pop("grads"), t.pop("state"), t.pop("counters"), t.pop("lr"), **t)
    assert torch.equal(p, q)
    # Finite hyper-parameters at their edges.
    e = step_args()
    p = e["params"][0]
    ops.optim_step_(e.pop("params"), e.pop("grads"), e.pop("state"), e.pop("counters"), e.pop("lr"),
                    weight_decay=0.0, eps=1e-30, beta1=0.0, **e)
    assert torch.isfinite(p).all()
    # Per-step values at their edges: lr 0 leaves AdamW's parameter as it was, an infinite gradient
    # norm clips to 0 (as torch's clip_grad_norm_), NaN sums of a call found_inf skips are not read,
    # and a step count just below 2^53 - 1 is taken.
    z = step_args(lr=torch.zeros(1, dtype=F64), weight_decay=0.5)
    pz = z["params"][0]
    p0 = pz.clone()
    ops.optim_step_(z.pop("params"), z.pop("grads"), z.pop("state"), z.pop("counters"), z.pop("lr"), **z)
    assert torch.equal(pz, p0)
    f = step_args(grad_sumsq=torch.tensor([NAN], dtype=F64), max_grad_norm=1.0, found_inf=torch.ones(1))
    p = f["params"][0].clone()
    pf = f["params"][0]
    ops.optim_step_(f.pop("params"), f.pop("grads"), f.pop("state"), f.pop("counters"), f.pop("lr"), **f)
    assert torch.equal(pf, p)
    step(grad_sumsq=torch.tensor([INF], dtype=F64), max_grad_norm=1.0)
    step(counters=[torch.tensor([(1 << 53) - 2, 0])])
    # QAT: zero points at both ends of the grid; codes at the top of their width.
    for zp in (-8.0, 7.0):
        ops.fake_quant_static(g8, torch.ones(8), torch.full((8,), zp), 64, 4, True)
    ops.fake_quant_qparams(torch.tensor([1.0]), torch.tensor([1.0]), 4, True, False, 1e-6)
    assert ops.pack_codes(torch.tensor([15, 15], dtype=torch.uint8), 4).tolist() == [255]
    ops.dequantize_blockwise(codes, torch.zeros_like(absmax), "Dyn8Signed", 0, [1000])
