"""The state of a DTensor parameter (FSDP2) in state_dict(), in a form torch.distributed.checkpoint (DCP) saves at N
ranks and loads at M: every state tensor is a DTensor of the whole parameter's 1-D state tensor, of which each rank
holds the range it steps, at its offset. No rank talks to another to make or read it.

A rank steps a block-aligned range [begin, end) of the flattened parameter (dtensor_shards.py), so its tensors are
pieces of the one-process state at fixed offsets: per-element tensors (dense slots, the master-weight correction)
at `begin`, codes at `begin` * bits / 8 (4-bit codes pack two to a byte; begin is even), absmax at `begin` / block.
Those offsets follow no torch.chunk split, so each DTensor's local tensor is a LocalShardsWrapper (torch's carrier of
shards at arbitrary offsets, through which DCP writes and reads chunks), and DCP's resharding hands every rank of
another mesh its own range. The whole tensors are the one-process state: a plain optimizer loads them through DCP.

    counters     (steps, 0): the same on every rank (a plain tensor); the overflowed-block count is per rank and
                 starts again at 0 after a load, as the C++ sharded checkpoint does when it joins fragments
    slots, block_size        as for a plain parameter (the whole parameter's layout)
    <state keys>             DTensors as above; no "range" (the offsets say it)

load(): such an entry (its offsets must be this rank's: DCP's load makes them so), the whole parameter's state (a
plain optimizer's entry: this rank takes its range), or a rank's own entry with its "range" as earlier versions wrote.
torch.load(weights_only=True) reads them once this process has made one (the classes they hold are then allowed;
elsewhere torch's message names them). StateDictOptions(full_state_dict=True) cannot gather these DTensors (a
LocalShardsWrapper has no all-gather of uneven shards): save sharded, and make one whole file with DCP's
format_utils.dcp_to_torch_save where needed."""
import functools
from typing import Dict, Optional

import torch

from . import dtensor_shards, param_state

FORMATS_WITHOUT_CODES = param_state.DENSE + param_state.CORRECTIONS


@functools.lru_cache(maxsize=None)
def code_bits(storage: str) -> int:
    """Bits per element of a quantized slot's codes (8, or 4 where two pack into a byte)."""
    return 4 * torch.ops.lowbit.quantize_blockwise(torch.zeros(2), storage, 0)[0].numel()


def _pieces(slots, names, numel: int, block: int, begin: int, end: int):
    """Per state key: (global length, this range's offset in it) of the whole parameter's 1-D tensor."""
    out = {}
    keys = iter(param_state.state_keys(tuple(slots), tuple(names)))
    for storage in slots:
        if storage == "none":
            continue
        if storage in FORMATS_WITHOUT_CODES:
            out[next(keys)] = (numel, min(begin, numel))
            continue
        bits = code_bits(storage)
        out[next(keys)] = (-(-numel * bits // 8), min(begin * bits // 8, -(-numel * bits // 8)))
        out[next(keys)] = (-(-numel // block), min(begin // block, -(-numel // block)))
    return out


def block_state(tensors, slots, begin: int, end: int, block: int):
    """One item's state tensors (in optim_step_'s order for `slots`) cut to its elements [begin, end), begin a
    multiple of `block`: per-element tensors at begin, codes at begin * bits / 8, absmax at begin / block."""
    out, it = [], iter(tensors)
    for storage in slots:
        if storage == "none":
            continue
        if storage in FORMATS_WITHOUT_CODES:
            out.append(next(it)[begin:end])
            continue
        bits = code_bits(storage)
        out.append(next(it)[begin * bits // 8:-(-end * bits // 8)])
        out.append(next(it)[begin // block:-(-end // block)])
    return out


def _wrapper_class():
    from torch.distributed.checkpoint import metadata
    from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper
    if not getattr(_wrapper_class, "allowed", False):  # so that torch.load(weights_only=True) reads a saved one
        torch.serialization.add_safe_globals([LocalShardsWrapper, metadata.TensorStorageMetadata,
                                              metadata.TensorProperties, metadata.ChunkStorageMetadata,
                                              metadata._MEM_FORMAT_ENCODING])
        _wrapper_class.allowed = True
    return LocalShardsWrapper


def to_dcp(opt, p, st: Dict) -> Dict:
    """A DTensor parameter's state entry (optimizer.state[p]) as state_dict() gives it."""
    from torch.distributed.tensor import DTensor, Shard
    wrapper = _wrapper_class()
    begin, end = st["range"]
    out = {"counters": torch.stack([st["counters"][0], torch.zeros_like(st["counters"][0])]),
           "slots": list(st["slots"]), "block_size": st["block_size"]}
    for key, (size, offset) in _pieces(st["slots"], opt.state_names, p.numel(), st["block_size"], begin, end).items():
        t = st[key]
        out[key] = DTensor.from_local(wrapper([t], [(offset,)]), p.device_mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size([size]), stride=(1,))
    return out


def _local_piece(t, size: int, offset: int, length: int, who: str, key: str) -> Optional[torch.Tensor]:
    """This range's piece of a saved state tensor (a DTensor of pieces, or the whole tensor); None if not there."""
    if dtensor_shards.is_dtensor(t):
        local = t.to_local()
        shards = getattr(local, "local_shards", None)
        if shards is None or t.shape != torch.Size([size]):
            raise ValueError(f"{who}: '{key}' is a DTensor {list(t.shape)} that is not lowbit's (pieces of the "
                             f"whole 1-D state tensor of {size} elements)")
        for piece, at in zip(local.local_shards(), local.local_offsets()):
            if tuple(at) == (offset,) and piece.numel() == length:
                return piece
        held = [(at[0], piece.numel()) for piece, at in zip(local.local_shards(), local.local_offsets())]
        raise ValueError(f"{who}: '{key}' holds (offset, length) {held} here, this rank steps ({offset}, {length}): "
                         "a state dict of another mesh loads through torch.distributed.checkpoint, which reshards it")
    if isinstance(t, torch.Tensor) and t.dim() == 1 and t.numel() == size:
        return t.narrow(0, offset, length)  # the whole parameter's
    return None


def from_dcp(opt, p, entry: Dict, want: Dict, who: str) -> Dict:
    """The values of `entry` (see load() above), by key, for the state `want` that this rank's range needs."""
    if "range" in entry:
        if list(entry["range"]) != want["range"]:
            raise ValueError(f"{who}: the state dict holds elements {list(entry['range'])} of the parameter, this "
                             f"rank steps {want['range']}: a state dict of another mesh loads through "
                             "torch.distributed.checkpoint, which reshards it")
        return {k: entry.get(k) for k in want}
    begin, end = want["range"]
    pieces = _pieces(want["slots"], opt.state_names, p.numel(), want["block_size"], begin, end)
    out = {k: entry.get(k) for k in want}
    out["range"] = list(want["range"])
    for key, (size, offset) in pieces.items():
        t = entry.get(key)
        if t is None:
            continue
        piece = _local_piece(t, size, offset, want[key].numel(), who, key)
        if piece is not None:
            out[key] = piece
    counters = entry.get("counters")
    if isinstance(counters, torch.Tensor) and counters.numel() == 2 and not dtensor_shards.is_dtensor(counters):
        out["counters"] = torch.stack([counters[0], torch.zeros_like(counters[0])])
    return out
