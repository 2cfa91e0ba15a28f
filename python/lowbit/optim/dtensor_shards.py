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

The non-finite skip is agreed over the mesh (a max of the flags, exact). Clipping's norm is one process's sum
(exact_sumsq): one process adds squares per chunk of GRAD_CHUNK elements of a gradient, the chunks in order, the
gradients in order (kernels/common/grad_sums.h); a chunk cut by a shard boundary is summed whole by the rank
holding its first element (the next ranks' heads sent to it, as for quantization blocks), every rank gets every
chunk's sum, and each adds them in one process's order. LAMB's per-parameter norms likewise: every LAMB parameter is
stepped by block owners, each owner sums its blocks, and the blocks' sums are added in LAMB's order on every rank.
"""
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

QUANTIZED_NOT = ("none", "fp32", "bf16", "int16_correction", "int8_correction")
GRAD_CHUNK = 8192  # kernels/common/grad_sums.h's kGradChunk: the elements whose squares one process sums together


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


def owned_blocks(a: int, b: int, block: int, numel: int) -> int:
    """How many blocks start in [a, b) (owned's range in blocks)."""
    s0, e0 = owned(a, b, block, numel)
    return -(-(e0 - s0) // block)


def by_blocks(opt, slots) -> bool:
    """Whether a DTensor parameter is stepped by the owners of whole blocks: quantized state (a block's scale covers
    it), and any state under LAMB (its norms add per-block sums); else each rank steps its shard element by element."""
    return opt.rule == "LAMB" or not all(s in QUANTIZED_NOT for s in slots)


def state_range(opt, group: Dict, p) -> Tuple[int, int]:
    """The elements of DTensor parameter p whose state this rank keeps: its shard (by_blocks false), or the blocks
    that start in it (empty where none does)."""
    ranges, rank, _ = rank_ranges(p)
    a, b = ranges[rank]
    slots, block = opt._layout(group, p.numel())
    if not by_blocks(opt, slots):
        return a, b
    return owned(a, b, block, p.numel())


def agree_on_found_inf(found: torch.Tensor, group) -> None:
    dist.all_reduce(found, op=dist.ReduceOp.MAX, group=group)


def prepare(opt, group: Dict, gi: int, items) -> Tuple[list, Optional["BlockOwners"]]:
    """The op's items (index, param, grad, state, offset) for DTensor parameters, and what the op calls need around
    them where blocks are exchanged (BlockOwners)."""
    calls, exchanged = [], []
    for i, p, grad in items:
        ranges, rank, pg = rank_ranges(p)
        a, b = ranges[rank]
        local, local_grad = p.to_local(), grad.to_local()
        slots, block = opt._layout(group, p.numel())
        if not by_blocks(opt, slots):
            st = opt._shard_state(p, group, gi, i, local, a, b)
            calls.append((i, local, local_grad, st, a))
            continue
        s0, e0 = owned(a, b, block, p.numel())
        exchanged.append(dict(i=i, p=p, local=local.reshape(-1), grad=local_grad.reshape(-1), ranges=ranges,
                              rank=rank, pg=pg, a=a, b=b, s0=s0, e0=e0, block=block))
    if not exchanged:
        return calls, None
    # ---- the heads ([a, min(b, s0)): elements of blocks an earlier rank owns) to the blocks' owners.
    pieces = [(x["ranges"], x["rank"], [x["local"], x["grad"]], x["block"]) for x in exchanged]
    whole = heads_to_owners(pieces, exchanged[0]["pg"], exchanged[0]["local"].device)
    for x, (s0, (ext, ext_grad)) in zip(exchanged, whole):
        # No block starts here (s0 == e0): an empty state, stepped (its step count) like every rank's.
        x["ext"] = ext.to(x["local"].dtype)
        st = opt._shard_state(x["p"], group, gi, x["i"], x["ext"], s0, x["e0"])
        calls.append((x["i"], x["ext"], ext_grad.to(x["grad"].dtype), st, s0))

    return calls, BlockOwners(exchanged)


class BlockOwners:
    """A group's DTensor parameters stepped by block owners (prepare): LAMB's whole-parameter norms before the op
    (lamb_rows), the owners' updated tails back to the ranks they belong to after it (calling it)."""

    def __init__(self, exchanged):
        self.exchanged = exchanged
        self.by_index = {x["i"]: x for x in exchanged}
        self.pg, self.world = exchanged[0]["pg"], len(exchanged[0]["ranges"])

    def lamb_rows(self, args, kwargs, indices):
        """optim_lamb_norms' rows for an op call (its args, kwargs, each item's index in the group) with one process's
        bits: this rank's items as the op sums them, the DTensor ones replaced by their whole parameter's sums, each
        block summed by its owner and the blocks added in LAMB's order (lamb_add_block_sums), as the C++ sharded
        optimizer does. Every rank calls it for the same calls, in the same order."""
        ops = torch.ops.lowbit
        params, grads, state, counters, lr = args
        rows = ops.optim_lamb_norms(params, grads, state, counters, lr, **kwargs)
        mine = [(k, self.by_index[i]) for k, i in enumerate(indices) if i in self.by_index]
        if not mine:
            return rows
        from .dtensor_state import block_state  # (it imports this module)
        per_item = len(state) // max(len(params), 1)
        blocks = {key: [] for key in ("params", "grads", "state", "counters", "offsets", "rng_keys")}
        base, first, count = 0, [], []
        for k, x in mine:
            block = x["block"]
            first.append(base)
            count.append(-(-x["p"].numel() // block))
            base += count[-1]
            for at in range(0, x["e0"] - x["s0"], block):
                end = min(at + block, x["e0"] - x["s0"])
                blocks["params"].append(params[k][at:end])
                blocks["grads"].append(grads[k][at:end])
                blocks["state"] += block_state(state[k * per_item:(k + 1) * per_item], kwargs["slots"], at, end, block)
                blocks["counters"].append(counters[k])
                blocks["offsets"].append(x["s0"] + at)
                blocks["rng_keys"].append(kwargs["rng_keys"][k])
        table = torch.zeros(base, 2, dtype=torch.float64, device=rows.device)
        if blocks["params"]:
            sums = ops.optim_lamb_norms(blocks["params"], blocks["grads"], blocks["state"], blocks["counters"], lr,
                                        **dict(kwargs, offsets=blocks["offsets"], rng_keys=blocks["rng_keys"]))
            at = 0
            for (k, x), f in zip(mine, first):
                n = owned_blocks(x["a"], x["b"], x["block"], x["p"].numel())
                table[f + x["s0"] // x["block"]:][:n] = sums[at:at + n]
                at += n
        dist.all_reduce(table, op=dist.ReduceOp.SUM, group=self.pg)  # each block's sums from its one owner
        whole = ops.lamb_add_block_sums(table, first, count)
        rows = rows.clone()
        for j, (k, _) in enumerate(mine):
            rows[k] = whole[j]
        return rows

    def __call__(self):
        # ---- the owners' updated tails ([b, e0)) back to the ranks whose heads they are.
        exchanged = self.exchanged
        width = max(x["block"] for x in exchanged)
        tails = torch.zeros(len(exchanged), width, dtype=torch.float32, device=exchanged[0]["local"].device)
        for j, x in enumerate(exchanged):
            n_local = max(0, x["b"] - x["s0"])
            x["local"][x["s0"] - x["a"]:].copy_(x["ext"][:n_local])
            tails[j, :x["e0"] - x["s0"] - n_local] = x["ext"][n_local:]
        back = [torch.empty_like(tails) for _ in range(self.world)]
        dist.all_gather(back, tails, group=self.pg)
        for j, x in enumerate(exchanged):
            a, b = x["a"], x["b"]
            n = min(b, x["s0"]) - a
            if n <= 0:
                continue
            start = (a // x["block"]) * x["block"]  # the owner holds this block's first element
            o = next(k for k, (ka, kb) in enumerate(x["ranges"]) if ka <= start < kb)
            at = a - x["ranges"][o][1]
            x["local"][:n].copy_(back[o][j, at:at + n].to(x["local"].dtype))


def heads_to_owners(pieces, pg, device):
    """Blocks cut by shard boundaries, made whole on the rank holding their first element. pieces: per parameter
    (every rank's ranges of it, this rank's index, this rank's values: 1-D tensors of its shard, e.g. the parameter
    and its gradient, the block size), the parameter cut into blocks from element 0. Returns per piece s0 and
    the values of the blocks that start in this rank's range, [s0, e0), in float32 (exact for fp32, bf16, fp16):
    this rank's from s0 on, then the next ranks' heads (what each holds before its first block start) up to e0,
    all brought by one all_gather. Every rank calls it with the same parameters, in the same order."""
    def head(ranges, k, block):
        ka, kb = ranges[k]
        return min(kb, owned(ka, kb, block, ranges[-1][1])[0]) - ka

    world = len(pieces[0][0])
    rows = len(pieces[0][2])
    width = max(max(head(r, k, block) for k in range(world)) for r, _, _, block in pieces)
    heads = torch.zeros(len(pieces), rows, max(width, 1), dtype=torch.float32, device=device)
    for j, (ranges, rank, values, block) in enumerate(pieces):
        n = head(ranges, rank, block)
        for v, t in enumerate(values):
            heads[j, v, :n] = t[:n]
    gathered = [torch.empty_like(heads) for _ in range(world)]
    dist.all_gather(gathered, heads, group=pg)
    out = []
    for j, (ranges, rank, values, block) in enumerate(pieces):
        a, b = ranges[rank]
        s0, e0 = owned(a, b, block, ranges[-1][1])
        if e0 == s0:
            out.append((s0, [t[:0].float() for t in values]))
            continue
        ext = []
        for v, t in enumerate(values):
            parts, need, k = [t[s0 - a:].float()], e0 - b, rank + 1
            while need > 0:  # the following ranks' heads, in order, up to e0
                take = min(head(ranges, k, block), need)
                parts.append(gathered[k][j, v, :take])
                need -= take
                k += 1
            ext.append(torch.cat(parts))
        out.append((s0, ext))
    return out


def exact_sumsq(items) -> float:
    """The sum of squares of a param group's gradients (items: (index, param, grad) in the group's order, DTensor or
    not) with one process's bits: grad_check's own chunk sums (each chunk given to it as a gradient of its own),
    the chunks of a sharded gradient summed by their owners and gathered, then added in grad_sums.h's order."""
    ops = torch.ops.lowbit
    sharded = [(i, p, g) for i, p, g in items if is_dtensor(g)]
    pg, world, device = None, 1, None
    pieces = []
    for _, p, g in sharded:
        ranges, rank, pg = rank_ranges(p)
        world, device = len(ranges), g.to_local().device
        pieces.append((ranges, rank, [g.to_local().reshape(-1)], GRAD_CHUNK))
    mine = heads_to_owners(pieces, pg, device) if pieces else []
    counts = [[owned_blocks(a, b, GRAD_CHUNK, r[-1][1]) for a, b in r] for r, _, _, _ in pieces]
    most = max([c for cs in counts for c in cs] + [1])
    sums = torch.zeros(len(pieces), most, dtype=torch.float64, device=device or "cpu")
    for j, (_, (ext,)) in enumerate(mine):
        chunks = list(ext.split(GRAD_CHUNK)) if ext.numel() else []
        if chunks:
            sums[j, :len(chunks)] = ops.grad_check(chunks, list(range(len(chunks))), len(chunks), True)[1]
    every = [torch.empty_like(sums) for _ in range(world)]
    if pieces:
        dist.all_gather(every, sums, group=pg)
    every = [e.tolist() for e in every]
    total, j = 0.0, 0
    for _, p, g in items:
        if is_dtensor(g):
            s = 0.0
            for k in range(world):  # the ranks' owned chunks, in element order
                for c in every[k][j][:counts[j][k]]:
                    s += c
            j += 1
        else:
            s = float(ops.grad_check([g], [0], 1, True)[1][0]) if g.numel() else 0.0
        total += s
    return total
