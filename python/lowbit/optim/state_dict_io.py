"""state_dict() / load_state_dict() of the optimizer classes.

Saved: torch.optim's layout (state by parameter index, param_groups with every option) with each state as
param_state.py describes it (codes and scales as they are; a DTensor parameter's as dtensor_state.py makes it, for
torch.distributed.checkpoint), plus "lowbit" (at the top and in each param group): the format version, the seed and
the skipped steps. Loaded: such a dict bit for bit, or a torch.optim state dict of the same rule (e.g.
torch.optim.AdamW's fp32 exp_avg / exp_avg_sq), quantized into this optimizer's state format.

Everything is checked before anything changes: a refused dict leaves the optimizer as it was.
"""
import copy
from typing import Dict

import torch

from . import dtensor_shards, dtensor_state, param_state

FORMAT_VERSION = 1
# The options that decide how a parameter's state is stored (optim_state_layout's).
LAYOUT_OPTIONS = ("state_format", "block_size", "min_quant_numel", "fp8_second_moment", "master_weight_bits")


def save(opt, packed: Dict) -> Dict:
    packed["lowbit"] = {"format_version": FORMAT_VERSION, "seed": opt.seed, "skipped_steps": opt.skipped_steps()}
    # ... and in every param group too: torch.distributed.checkpoint's get_state_dict keeps only "state" and
    # "param_groups" (it also keeps the groups' keys that torch.optim does not know).
    for group in packed["param_groups"]:
        group["lowbit"] = dict(packed["lowbit"])
    # torch.optim numbers the parameters of all groups in order; a DTensor parameter's state as DCP reshards it.
    params = [p for group in opt.param_groups for p in group["params"]]
    for index, p in enumerate(params):
        if index in packed["state"] and dtensor_shards.is_dtensor(p):
            packed["state"][index] = dtensor_state.to_dcp(opt, p, opt.state[p])
    return packed


def _fail(opt, message):
    raise ValueError(f"lowbit.optim.{type(opt).__name__}.load_state_dict: {message}")


def load(opt, state_dict: Dict) -> None:
    saved_groups = state_dict.get("param_groups")
    saved_state = state_dict.get("state")
    if not isinstance(saved_groups, list) or not isinstance(saved_state, dict):
        _fail(opt, "expected a dict with 'state' and 'param_groups' (an optimizer's state_dict())")
    extra = state_dict.get("lowbit")
    if extra is None and isinstance(saved_groups, list):  # (get_state_dict drops the top-level entry)
        extra = next((g["lowbit"] for g in saved_groups if isinstance(g, dict) and "lowbit" in g), None)
    if extra is not None and extra.get("format_version") != FORMAT_VERSION:
        _fail(opt, f"format_version {extra.get('format_version')} is not {FORMAT_VERSION}, the one this version reads")
    if len(saved_groups) != len(opt.param_groups):
        _fail(opt, f"the state dict has {len(saved_groups)} param groups, this optimizer {len(opt.param_groups)}")
    # ---- groups: the saved options over this optimizer's, as torch.optim loads them, but for how state is stored:
    # that stays this optimizer's (a state stored otherwise is refused below, as the C++ optimizers refuse it).
    # A torch.optim dict lacks lowbit's options, and its implementation switches (foreach, ...) are not ours.
    groups, where = [], {}
    for gi, (saved, group) in enumerate(zip(saved_groups, opt.param_groups)):
        if len(saved["params"]) != len(group["params"]):
            _fail(opt, f"param group {gi} has {len(saved['params'])} parameters in the state dict, "
                       f"{len(group['params'])} here")
        new = dict(group)
        new.update({k: v for k, v in saved.items() if k in group and k not in LAYOUT_OPTIONS and k != "params"})
        groups.append(new)
        for i, (pid, p) in enumerate(zip(saved["params"], group["params"])):
            where[pid] = (gi, i, p)
    checked = {}
    for gi, group in enumerate(groups):
        opt._check_group(gi, group)  # refuses bad options before anything changes
        checked[gi] = opt._checked[gi]
    # ---- state
    state = {}
    for pid, entry in saved_state.items():
        if pid not in where:
            _fail(opt, f"state for parameter id {pid}, which no param group holds")
        gi, i, p = where[pid]
        state[p] = _import(opt, entry, p, groups[gi], f"parameter {i} of group {gi}")
    # ---- commit
    for group, new in zip(opt.param_groups, groups):
        group.update(new)
    opt.state.clear()
    opt.state.update(state)
    if extra is not None:
        opt.seed = int(extra["seed"])
        opt._skipped_loaded = int(extra["skipped_steps"])
        opt._skipped = None
    opt._checked.update(checked)


def _import(opt, entry: Dict, p: torch.Tensor, group: Dict, who: str) -> Dict:
    if "counters" in entry:
        return _import_lowbit(opt, entry, p, group, who)
    return _import_torch(opt, entry, p, group, who)


def _import_lowbit(opt, entry, p, group, who):
    values = entry
    if dtensor_shards.is_dtensor(p):  # this rank's range of a sharded parameter (dtensor_shards.py, dtensor_state.py)
        begin, end = dtensor_shards.state_range(opt, group, p)
        like = torch.empty(end - begin, dtype=p.dtype, device=p.to_local().device)
        want = param_state.from_param_state(opt._new_state(like, group, whole_numel=p.numel()), opt.state_names)
        want["range"] = [begin, end]
    else:
        want = param_state.from_param_state(opt._new_state(p, group), opt.state_names)
        if any(dtensor_shards.is_dtensor(v) for v in entry.values()):
            _fail(opt, f"{who}: the state dict holds DTensors (a sharded parameter's state) for a parameter that is "
                       "not one: load it through torch.distributed.checkpoint, which gives each tensor whole")
    if list(entry.get("slots", [])) != want["slots"] or entry.get("block_size") != want["block_size"]:
        _fail(opt, f"{who}: the state dict keeps its state as {entry.get('slots')} in blocks of "
                   f"{entry.get('block_size')}, this optimizer as {want['slots']} in blocks of {want['block_size']} "
                   "(state_format, block_size, min_quant_numel, fp8_second_moment, master_weight_bits)")
    if dtensor_shards.is_dtensor(p):
        try:
            values = dtensor_state.from_dcp(opt, p, entry, want, who)
        except ValueError as e:
            _fail(opt, str(e))
    out = {}
    for key, fresh in want.items():
        if not isinstance(fresh, torch.Tensor):
            out[key] = copy.deepcopy(values[key])
            continue
        t = values.get(key)
        if not isinstance(t, torch.Tensor):
            _fail(opt, f"{who}: '{key}' is missing")
        if t.dtype != fresh.dtype or t.shape != fresh.shape:
            _fail(opt, f"{who}: '{key}' is {t.dtype} {list(t.shape)}; expected {fresh.dtype} {list(fresh.shape)}")
        out[key] = t.detach().to(p.device).clone()
    counters = out["counters"]
    if bool((counters < 0).any()) or int(counters[0]) >= 2 ** 53:
        _fail(opt, f"{who}: counters {counters.tolist()} are out of range (steps in [0, 2^53), overflowed >= 0)")
    return out


def _import_torch(opt, entry, p, group, who):
    """A torch.optim state: its fp32 slots (by torch's names) quantized as this optimizer stores them."""
    if dtensor_shards.is_dtensor(p):
        _fail(opt, f"{who}: a torch.optim state of a DTensor parameter cannot be loaded (only lowbit's own)")
    layout = opt._new_state(p, group)
    values = []
    for k, storage in enumerate(layout.slots):
        if storage == "none" or storage in param_state.CORRECTIONS:
            values.append(None)
            continue
        name = opt.state_names[k]
        v = entry.get(name)
        if not isinstance(v, torch.Tensor):
            _fail(opt, f"{who}: the state has no tensor '{name}' (keys {sorted(entry)}); expected a "
                       f"torch.optim.{type(opt).__name__} state or a lowbit one")
        if v.numel() != p.numel() or not v.is_floating_point():
            _fail(opt, f"{who}: '{name}' is {v.dtype} {list(v.shape)}; expected floats shaped like the parameter "
                       f"{list(p.shape)}")
        values.append(v)
    step = entry.get("step", 0)
    step = int(step.item()) if isinstance(step, torch.Tensor) else int(step)
    if step < 0 or step >= 2 ** 53:
        _fail(opt, f"{who}: step {step} is out of range [0, 2^53)")
    st = param_state.from_param_state(opt._new_state(p, group, values=values), opt.state_names)
    st["counters"][0] = step
    return st
