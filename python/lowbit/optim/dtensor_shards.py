"""DTensor parameters (FSDP2's fully_shard: Shard(0) on a 1-D mesh) stepped so that parameters and state are bit
for bit those of one process, on any number of ranks.

Each rank holds a contiguous range [a, b) of the flattened parameter. The step reads a parameter through its
element offset, and quantization blocks are the whole parameter's (multiples of the block size B from element 0):

- dense state (FP32, BF16, or a parameter below min_quant_numel): elements are independent, so a rank steps its
  local shard with offset a;
- quantized state: a block cut by a shard boundary must be stepped whole, by one rank. The rank holding a block's
  first element owns it: it keeps the state of the blocks that start in [a, b), i.e. the range [s0, e0) with
  s0 = a rounded up to B and e0 = b rounded up to B (at most the numel). What those blocks hold beyond b belongs
  to the next ranks' shards (their "heads", [a, s0)): one all_gather brings every rank's head (parameter and
  gradient) to the owners before the step, and one more takes the updated values back after it.

The non-finite skip is agreed over the mesh (a max of the flags, exact). Global-norm clipping and LAMB's norms
would sum over ranks in another order than one process does, so they are refused for DTensor parameters.
"""
import math
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

QUANTIZED_NOT = ("none", "fp32", "bf16", "int16_correction", "int8_correction")


def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
        return DTensor
    except ImportError:  # a torch built without distributed
        return ()


_DTENSOR = _dtensor_class()


def is_dtensor(t) -> bool:
    return isinstance(t, _DTENSOR)


def rank_ranges(p) -> Tuple[List[Tuple[int, int]], int, object]:
    """Every rank's [a, b) of the flattened parameter, this rank's index and the mesh's process group."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    mesh = p.device_mesh
    if mesh.ndim != 1 or len(p.placements) != 1 or p.placements[0] != Shard(0):
        raise RuntimeError(f"lowbit.optim: a DTensor parameter must be Shard(0) on a 1-D mesh (fully_shard), got "
                           f"{p.placements} on a {mesh.ndim}-D mesh")
    world, rank = mesh.size(), mesh.get_local_rank()
    rows, row = p.shape[0] if p.dim() else 1, math.prod(p.shape[1:])
    chunk = -(-rows // world)  # torch.chunk's split, as Shard(0) cuts
    ranges = [(min(k * chunk, rows) * row, min((k + 1) * chunk, rows) * row) for k in range(world)]
    _, offset = compute_local_shape_and_global_offset(p.shape, mesh, p.placements)
    if p.to_local().numel() and ranges[rank][0] != offset[0] * row:
        raise RuntimeError(f"lowbit.optim: the DTensor's shard starts at row {offset[0]}, not where Shard(0)'s "
                           f"chunks put it ({ranges[rank][0] // row})")
    return ranges, rank, mesh.get_group()


def owned(a: int, b: int, block: int, numel: int) -> Tuple[int, int]:
    """The range of the blocks that start in [a, b): [s0, e0), empty (s0 == e0) where none does."""
    s0 = -(-a // block) * block
    return (s0, min(-(-b // block) * block, numel)) if s0 < b else (s0, s0)


def state_range(opt, group: Dict, p) -> Tuple[int, int]:
    """The elements of DTensor parameter p whose state this rank keeps: its shard (dense state), or the blocks that
    start in it (quantized state; empty where none does)."""
    ranges, rank, _ = rank_ranges(p)
    a, b = ranges[rank]
    slots, block = opt._layout(group, p.numel())
    if all(s in QUANTIZED_NOT for s in slots):
        return a, b
    return owned(a, b, block, p.numel())


def agree_on_found_inf(found: torch.Tensor, group) -> None:
    dist.all_reduce(found, op=dist.ReduceOp.MAX, group=group)


def prepare(opt, group: Dict, gi: int, items) -> Tuple[list, callable]:
    """The op's items (index, param, grad, state, offset) for DTensor parameters, and what to run after the op."""
    who = f"lowbit.optim.{type(opt).__name__}: DTensor parameters (group {gi})"
    if group["max_grad_norm"] > 0:
        raise RuntimeError(f"{who} cannot clip with max_grad_norm={group['max_grad_norm']}: a norm summed over ranks "
                           "would not be one process's bits. Set max_grad_norm=0 and clip before step() with "
                           "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm), which takes DTensor gradients")
    if opt.rule == "LAMB":
        raise RuntimeError(f"{who} cannot step with LAMB: its per-parameter norms summed over ranks would not be one "
                           "process's bits. Use another rule for sharded parameters")
    calls, exchanged = [], []
    for i, p, grad in items:
        ranges, rank, pg = rank_ranges(p)
        a, b = ranges[rank]
        local, local_grad = p.to_local(), grad.to_local()
        slots, block = opt._layout(group, p.numel())
        if all(s in QUANTIZED_NOT for s in slots):
            st = opt._shard_state(p, group, gi, i, local, a, b)
            calls.append((i, local, local_grad, st, a))
            continue
        s0, e0 = owned(a, b, block, p.numel())
        exchanged.append(dict(i=i, p=p, local=local.reshape(-1), grad=local_grad.reshape(-1), ranges=ranges,
                              rank=rank, pg=pg, a=a, b=b, s0=s0, e0=e0, block=block))
    if not exchanged:
        return calls, None
    pg, world = exchanged[0]["pg"], len(exchanged[0]["ranges"])
    width = max(x["block"] for x in exchanged)
    # ---- the heads ([a, min(b, s0)): elements of blocks an earlier rank owns) go to every rank.
    heads = torch.zeros(len(exchanged), 2, width, dtype=torch.float32, device=exchanged[0]["local"].device)
    for j, x in enumerate(exchanged):
        n = min(x["b"], x["s0"]) - x["a"]
        heads[j, 0, :n] = x["local"][:n]
        heads[j, 1, :n] = x["grad"][:n]
    gathered = [torch.empty_like(heads) for _ in range(world)]
    dist.all_gather(gathered, heads, group=pg)
    for j, x in enumerate(exchanged):
        s0, e0, a, b = x["s0"], x["e0"], x["a"], x["b"]
        if e0 == s0:  # no block starts here: an empty state, stepped (its step count) like every rank's
            x["ext"] = x["local"][:0]
            st = opt._shard_state(x["p"], group, gi, x["i"], x["ext"], s0, e0)
            calls.append((x["i"], x["ext"], x["grad"][:0], st, s0))
            continue
        p_parts, g_parts = [x["local"][s0 - a:]], [x["grad"][s0 - a:]]
        need, k = e0 - b, x["rank"] + 1
        while need > 0:  # the following ranks' heads, in order, up to e0
            ka, kb = x["ranges"][k]
            n = min(kb, owned(ka, kb, x["block"], x["p"].numel())[0]) - ka
            take = min(n, need)
            p_parts.append(gathered[k][j, 0, :take].to(x["local"].dtype))
            g_parts.append(gathered[k][j, 1, :take].to(x["grad"].dtype))
            need -= take
            k += 1
        x["ext"] = torch.cat(p_parts)
        st = opt._shard_state(x["p"], group, gi, x["i"], x["ext"], s0, e0)
        calls.append((x["i"], x["ext"], torch.cat(g_parts), st, s0))

    def finish():
        # ---- the owners' updated tails ([b, e0)) back to the ranks whose heads they are.
        tails = torch.zeros(len(exchanged), width, dtype=torch.float32, device=heads.device)
        for j, x in enumerate(exchanged):
            if "ext" in x:
                n_local = max(0, x["b"] - x["s0"])
                x["local"][x["s0"] - x["a"]:].copy_(x["ext"][:n_local])
                tails[j, :x["e0"] - x["s0"] - n_local] = x["ext"][n_local:]
        back = [torch.empty_like(tails) for _ in range(world)]
        dist.all_gather(back, tails, group=pg)
        for j, x in enumerate(exchanged):
            a, b = x["a"], x["b"]
            n = min(b, x["s0"]) - a
            if n <= 0:
                continue
            start = (a // x["block"]) * x["block"]  # the owner holds this block's first element
            o = next(k for k, (ka, kb) in enumerate(x["ranges"]) if ka <= start < kb)
            at = a - x["ranges"][o][1]
            x["local"][:n].copy_(back[o][j, at:at + n].to(x["local"].dtype))

    return calls, finish
