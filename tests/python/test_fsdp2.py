"""FSDP2 (fully_shard, DTensor parameters) over Gloo on the CPU: 1, 2 and 3 ranks step their shards to the very
bits of one process, parameters and state (dtensor_shards.py: quantization blocks are the whole parameter's,
a block cut by a shard boundary is stepped whole by the rank holding its first element), and a
torch.distributed.checkpoint checkpoint written at N ranks goes on at M ranks with those bits (dtensor_state.py)."""
import copy
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

import lowbit
from cpp_reference import same_bits

HERE = pathlib.Path(__file__).resolve().parent
# Shapes with shards that cut quantization blocks (256 for Q8, 128 for Q4, 64 for C8), shards smaller than a
# block (3 x 61 over 3 ranks), fewer rows than ranks, and tensors that keep fp32 state; for clipping's norm, shards
# that cut its chunks of 8192 (130 x 131 over 2 and 3 ranks) and a chunk over 3 ranks (12 x 1000).
SHAPES = [(61, 97), (300,), (3, 61), (2, 200), (1000,), (5,), (130, 131), (12, 1000)]
# (class, options, parameter dtype): bf16 parameters with stochastic rounding (its noise follows the global element
# index) and with a 32-bit master (a correction slot in the exchanged blocks' state).
F32, BF16 = torch.float32, torch.bfloat16
CONFIGS = [("AdamW", dict(state_format="Q8", min_quant_numel=64), F32),
           ("Lion", dict(state_format="Q4", min_quant_numel=64, weight_decay=0.1), F32),
           ("AdEMAMix", dict(state_format="C8", min_quant_numel=64, t_alpha_beta3=5), F32),
           ("SGD", dict(momentum=0.9, state_format="FP8", min_quant_numel=64), F32),
           ("RMSprop", dict(state_format="FP32", centered=True, momentum=0.5), F32),
           ("Adam", dict(state_format="BF16", bf16_stochastic_round=True), BF16),
           ("AdamW", dict(state_format="Q8", min_quant_numel=64, master_weight_bits=32), BF16),
           # Clipping by the norm of the whole gradients (about 19 here: every step clips), one process's bits.
           ("AdamW", dict(state_format="Q8", min_quant_numel=64, max_grad_norm=0.5), F32),
           ("SGD", dict(momentum=0.9, state_format="FP32", max_grad_norm=1.0, bf16_stochastic_round=True), BF16),
           # LAMB: its trust ratios take whole parameters' norms (blocks summed by their owners, added in its order).
           ("LAMB", dict(state_format="Q8", min_quant_numel=64, weight_decay=0.01), F32),
           ("LAMB", dict(state_format="FP32", max_grad_norm=0.5), F32)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, script, *args):
    """`script` RANK WORLD PORT *args on `world` processes; fails with their stderr if one fails."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE)] + sys.path))
    procs = [subprocess.Popen([sys.executable, str(HERE / script), str(r), str(world), str(port)] +
                              [str(a) for a in args], env=env, stderr=subprocess.PIPE, text=True) for r in range(world)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(e[-3000:] for e in errors)


def single_process(spec):
    out = []
    for cls_name, options, dtype in spec["configs"]:
        params = [t.detach().to(dtype).clone().requires_grad_() for t in spec["init"]]
        opt = getattr(lowbit.optim, cls_name)(params, **options)
        for grads in spec["grads"]:
            for p, g in zip(params, grads):
                p.grad = g.to(dtype)
            opt.step()
        out.append((params, opt))
    return out


def merged_state(states, i):
    """Parameter i's state from every rank's ranges, in element order (they must tile the parameter)."""
    pieces = sorted((s[i] for s in states if s and i in s and s[i]["range"][1] > s[i]["range"][0]),
                    key=lambda e: e["range"][0])
    return pieces


# The sanitizer run (scripts/sanitize) preloads ASan into Python: Gloo ranks under it would only repeat, far slower,
# what the normal run checks here (the step op itself runs under ASan in the other tests).
# Gloo on the CPU everywhere; NCCL with one GPU a rank where there are enough (the one process it is compared with
# steps on the CPU: the CUDA step's bits are the CPU's).
WORLDS = [("gloo", 1), ("gloo", 2), ("gloo", 3), ("nccl", 1), ("nccl", 2)]


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""), reason="ranks under the sanitizer run")
@pytest.mark.parametrize("backend,world", WORLDS, ids=[f"{b}-{w}" for b, w in WORLDS])
def test_fully_sharded_steps_equal_one_process(tmp_path, backend, world):
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < world):
        pytest.skip(f"NCCL over {world} GPU(s) needs that many")
    gen = torch.Generator().manual_seed(world)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) * 0.1 for s in SHAPES] for _ in range(3)]
    grads[1][0][7, 3] = float("nan")  # a non-finite gradient on one rank's shard: every rank skips that step
    # For clipping's sum of squares alone: gradients whose squares span many magnitudes (so that adding the chunks'
    # sums in another order would change the bits).
    norm_grads = [[torch.randn(s, generator=gen) * 10.0 ** torch.randint(-4, 4, s, generator=gen) for s in SHAPES]
                  for _ in range(8)]
    spec = dict(init=init, grads=grads, configs=CONFIGS, norm_grads=norm_grads)
    torch.save(spec, tmp_path / "in.pt")
    run_ranks(world, "fsdp2_worker.py", tmp_path / "in.pt", tmp_path / "out.pt", backend)
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    # Clipping's sum of squares from the shards: one process's bits (grad_check over the whole gradients), for the
    # steps without Inf or NaN (a chunk with one sums to 0 on the CPU, to NaN on a GPU; the step is skipped anyway).
    every = grads + norm_grads
    finite = [all(torch.isfinite(g).all() for g in step) for step in every for _ in range(2)]
    want = [float(torch.ops.lowbit.grad_check([g.to(dtype) for g in step], [0] * len(step), 1, True)[1][0])
            for step in every for dtype in (torch.float32, torch.bfloat16)]
    assert [x for x, f in zip(out["norms"], finite) if f] == [x for x, f in zip(want, finite) if f]
    for (cls_name, _, _), (params, opt), got in zip(CONFIGS, single_process(spec), out["configs"]):
        assert got["skipped"] == opt.skipped_steps() == 1, cls_name
        assert got["resumed"], f"{cls_name}: a state_dict() round trip on the ranks changed the next step"
        for i, p in enumerate(params):
            assert same_bits(got["params"][i], p.detach()), (cls_name, i)
            pieces = merged_state(got["states"], i)
            st = opt.state[p]
            assert pieces[0]["range"][0] == 0 and pieces[-1]["range"][1] == p.numel(), (cls_name, i)
            assert all(x["range"][1] == y["range"][0] for x, y in zip(pieces, pieces[1:])), (cls_name, i)
            for key in lowbit.optim.param_state.state_keys(tuple(st["slots"]), opt.state_names):
                whole = torch.cat([x[key] for x in pieces])
                assert same_bits(whole, st[key]), (cls_name, i, key)
            assert all(torch.equal(x["counters"], st["counters"]) for x in pieces), (cls_name, i)


# ---- torch.distributed.checkpoint: N ranks save, M ranks load. A Q8 weight whose shards cut blocks, a Q8 bias of one
# block (ranks that own none of it), a Q4 weight (4-bit codes; at 3 ranks one owns none), an fp32-state bias; two
# param groups; a non-finite gradient before the save (the skip count goes along).
DCP_SPEC = dict(optimizer="AdamW", options=dict(min_quant_numel=64), split=3,
                groups=[dict(params=["a.weight", "a.bias"]),
                        dict(params=["b.weight", "b.bias"], state_format="Q4", lr=3e-3, weight_decay=0.1)])


def same_as_one_process(got, named, opt, run):
    """A run's whole parameters and every rank's state (by parameter name) against one process's, bit for bit."""
    assert got["skipped"] == opt.skipped_steps() == 1, run
    for name, p in named.items():
        assert same_bits(got["params"][name], p.detach()), (run, name)
        st = opt.state[p]
        everyone = [s[name] for s in got["states"]]  # every rank holds a state, maybe of no element
        assert all(torch.equal(x["counters"], st["counters"]) for x in everyone), (run, name)
        pieces = sorted((x for x in everyone if x["range"][1] > x["range"][0]), key=lambda x: x["range"][0])
        assert pieces[0]["range"][0] == 0 and pieces[-1]["range"][1] == p.numel(), (run, name)
        assert all(x["range"][1] == y["range"][0] for x, y in zip(pieces, pieces[1:])), (run, name)
        for key in lowbit.optim.param_state.state_keys(tuple(st["slots"]), opt.state_names):
            assert same_bits(torch.cat([x[key] for x in pieces]), st[key]), (run, name, key)


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""), reason="ranks under the sanitizer run")
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # (the one-process loads)
def test_a_dcp_checkpoint_saved_at_n_ranks_goes_on_at_m_ranks(tmp_path):
    import fsdp2_dcp_worker as worker
    gen = torch.Generator().manual_seed(11)
    init = {name: torch.randn(p.shape, generator=gen) for name, p in worker.Net().named_parameters()}
    grads = [{name: torch.randn(t.shape, generator=gen) * 0.1 for name, t in init.items()} for _ in range(5)]
    grads[1]["a.weight"][40, 7] = float("inf")
    spec = dict(DCP_SPEC, init=init, grads=grads)
    # ---- one process that never saves: every step (and its state_dict() after the first `split`).
    model, opt = worker.build(spec, init)
    worker.steps(model, opt, grads[:spec["split"]])
    spec["whole"] = copy.deepcopy(opt.state_dict())
    worker.steps(model, opt, grads[spec["split"]:])
    named = dict(model.named_parameters())
    torch.save(spec, tmp_path / "spec.pt")
    # ---- 2 ranks save after 3 steps and go on; 3 ranks load that, save it again and go on (one launch of 3 ranks).
    ck2, ck3 = tmp_path / "ck2", tmp_path / "ck3"
    run_ranks(3, "fsdp2_dcp_worker.py", tmp_path / "spec.pt", tmp_path / "out.pt", ck2, ck3)
    runs = torch.load(tmp_path / "out.pt", weights_only=False)
    assert runs.pop("whole state loaded"), "3 ranks loading one process's state_dict() got another state than DCP's"
    assert sorted(runs) == ["2 ranks, saved", "3 ranks, loaded"]
    for run, got in runs.items():
        same_as_one_process(got, named, opt, run)
    # ---- one process (no FSDP, no process group) loads either: the whole tensors are one process's state.
    for ck in (ck2, ck3):
        one, one_opt = worker.load(spec, ck)
        worker.steps(one, one_opt, grads[spec["split"]:])
        mine = {name: dict(one_opt.state[p], range=[0, p.numel()]) for name, p in one.named_parameters()}
        same_as_one_process(dict(params=dict(one.named_parameters()), states=[mine], skipped=one_opt.skipped_steps()),
                            named, opt, f"1 process loads {ck.name}")


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""), reason="ranks under the sanitizer run")
def test_a_dtensor_not_sharded_as_fully_shard_does_is_refused_and_changes_nothing(tmp_path):
    # Shard(1): its ranks' pieces are not ranges of the flattened parameter (dtensor_shards.rank_ranges).
    run_ranks(2, "fsdp2_refusal_worker.py", tmp_path / "out.pt")
    assert torch.load(tmp_path / "out.pt") == []
