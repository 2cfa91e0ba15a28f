"""LowbitOptimizer: a torch.optim.Optimizer whose step is torch.ops.lowbit.optim_step_, laid out and called as the
C++ optimizers call it (optim/lowbit_optimizer.cpp, optim/step_calls.cpp), so the bits are theirs.

A step: the op calls of every param group, one per (device, state layout), checked by the op before any runs
(call_checks.py: a step refused for one group changes nothing), one read of every gradient on its device
(grad_check: the non-finite flag, each group's squared norm for clipping), then the calls, group by group.
Everything that changes per step stays on
the device: the step counts (in each state's `counters`), lr (a float64 tensor per group and device, written from
group["lr"] when that changes: schedulers work), the skip flag and GradScaler's scale. Nothing waits for a GPU.
"""
import functools
import sys
from typing import Dict, Iterable, Optional, Set

import torch

from . import call_checks, dtensor_shards, param_state, state_dict_io, step_args
from .step_graph import StepGraph, same_tensors
from .option_checks import check_options

# The C++ optimizers' stochastic-rounding seed ("lowbit", LowbitOptimizer::seed_) and parameter keys
# (optim/step_calls.h param_rng_key): the same noise, so bf16 stochastic rounding matches them bit for bit.
DEFAULT_SEED = 0x6C6F77626974


def rng_key(group: int, index: int) -> int:
    return group * 7919 + index


def eager_under_compile(fn):
    """torch.compile does not trace a step (it makes state and calls ops that write it in place): a compiled
    training step breaks its graph here and runs the step as it comes, the same bits. torch._dynamo is asked only
    once something loaded it, so a program that never compiles does not pay its import."""
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        disabled = getattr(inner, "disabled", None)
        if disabled is None:
            disabled = inner.disabled = sys.modules["torch._dynamo"].disable(fn, recursive=True)
        return disabled(*args, **kwargs)
    return inner


# Options every lowbit optimizer takes beside its rule's own (optim/options.h LOWBIT_COMMON_ARGS says what each does).
COMMON_DEFAULTS = dict(state_format="Q8", block_size=0, min_quant_numel=4096, bf16_stochastic_round=False,
                       max_grad_norm=0.0, skip_nonfinite=True, fp8_second_moment="FP8E4M3", master_weight_bits=0)
# torch.optim's implementation switches: lowbit's step is always one fused call that never waits for the host.
IGNORED_TORCH_OPTIONS = ("foreach", "fused", "capturable")


class LowbitOptimizer(torch.optim.Optimizer):
    rule = ""            # the op's rule ("AdamW", ...)
    state_names = ()     # torch.optim's names of the rule's state slots 0..2 (kernels/common/state_slots.h)
    # torch.amp.GradScaler.step then hands over `found_inf` and `grad_scale` tensors instead of unscaling and
    # reading found_inf on the host: the op divides by the scale and skips on the flag, on the device.
    _step_supports_amp_scaling = True

    def __init__(self, params, defaults: Dict, options: Dict):
        unknown = set(options) - set(COMMON_DEFAULTS) - set(IGNORED_TORCH_OPTIONS) - {"differentiable"}
        if unknown:
            raise TypeError(f"{type(self).__name__}: unexpected keyword argument(s) {sorted(unknown)}; lowbit's "
                            f"options are {sorted(COMMON_DEFAULTS)}")
        if options.get("differentiable"):
            raise ValueError(f"{type(self).__name__}: differentiable=True is not supported (the step is a fused op)")
        self.seed = DEFAULT_SEED
        self._lr_tensors = {}      # (group, device) -> [float64 [1] tensor, the lr written into it]
        self._checked = {}         # group index -> the settings last checked (see _check_group)
        self._lr_checks = {}       # group index -> (its settings but lr, a check of another lr)
        self._skipped = None       # int64 [1] on the device: steps skipped for a non-finite gradient
        self._skipped_loaded = 0   # ... and those a loaded state_dict brought
        self._where = None         # id(param) -> (group, index), for steps of some parameters
        self._epoch = 0            # bumped when state is made or loaded: the cached call plans are then stale
        self._plans = {}           # group -> (epoch, indices stepped, the op calls' lists, the parameters): steps repeat
        self._pending = {}         # param -> state made for this step, kept once its group's calls ran
        self._overflow_reported = {}  # param -> its state's overflowed blocks when last reported (counters[1])
        self._overflow_interval = 0   # set_overflow_check_interval
        self._cpu_counters = (None, None, None)  # (epoch, the CPU states' counters, their overflows reported)
        self._steps_called = 0
        self._step_graph = StepGraph()  # steps recorded once and replayed (step_graph.py)
        self._capturing = False         # a step is being recorded: lr tensors are written before, not in it
        merged = dict(COMMON_DEFAULTS)
        merged.update({k: v for k, v in options.items() if k in COMMON_DEFAULTS})
        merged.update(defaults)
        super().__init__(params, merged)

    # ---- what each optimizer says -------------------------------------------------------------
    def op_hyper_parameters(self, group: Dict) -> Dict:
        """The op's named hyper-parameters (lowbit.optim.hyper_parameters()) from a param group's options."""
        raise NotImplementedError

    def initial_state_value(self, group: Dict) -> float:
        return 0.0

    # ---- param groups -------------------------------------------------------------------------
    def add_param_group(self, param_group: Dict) -> None:
        super().add_param_group(param_group)
        self._where = None
        self._epoch += 1
        self._check_group(len(self.param_groups) - 1, self.param_groups[-1])

    def _check_group(self, index: int, group: Dict) -> None:
        """Refuses bad options as the C++ optimizers do (LowbitOptimizer::check_groups), through the ops' own checks
        where an op sees the option: the layout options through optim_state_layout, lr and the hyper-parameters
        through a skipped step of a one-element parameter (found_inf set: the op checks every argument, then
        writes nothing). Checked again only when a value changed (a scheduler's new lr): a step pays a comparison."""
        key = tuple((k, v) for k, v in group.items() if k != "params" and not isinstance(v, torch.Tensor))
        if self._checked.get(index) == key:
            return
        rest = tuple(kv for kv in key if kv[0] != "lr")
        try:
            lr_check = self._lr_checks.get(index)
            if lr_check is not None and lr_check[0] == rest:
                lr_check[1](group["lr"])  # only lr changed (a scheduler): one op call checks it
            else:
                self._lr_checks[index] = (rest, check_options(self, group))
        except (RuntimeError, ValueError) as e:
            raise type(e)(f"lowbit.optim.{type(self).__name__}: param group {index}: {e}") from None
        self._checked[index] = key

    # ---- state --------------------------------------------------------------------------------
    def _state_for(self, p: torch.Tensor, group: Dict, gi: int, index: int) -> Dict:
        st = self.state.get(p) or self._pending.get(p)
        if st:
            if st["counters"].device != p.device:
                raise RuntimeError(f"lowbit.optim.{type(self).__name__}: parameter {index} of group {gi} is on "
                                   f"{p.device} but its optimizer state is on {st['counters'].device}; move the "
                                   "parameter back or recreate the optimizer")
            return st
        st = param_state.from_param_state(self._new_state(p, group), self.state_names)
        self._pending[p] = st  # kept once its group's calls ran (_commit)
        return st

    def _new_state(self, p: torch.Tensor, group: Dict, values=None, whole_numel=None) -> step_args.ParamState:
        return step_args.init_state(
            p, self.rule, group["state_format"], block_size=group["block_size"],
            min_quant_numel=group["min_quant_numel"], initial_value=self.initial_state_value(group),
            momentum=float(group.get("momentum", 0.0)), centered=bool(group.get("centered", False)),
            amsgrad=bool(group.get("amsgrad", False)), fp8_second_moment=group["fp8_second_moment"],
            master_weight_bits=group["master_weight_bits"], values=values, whole_numel=whole_numel)

    def _layout(self, group: Dict, numel: int):
        """(slots, block size) of a parameter of `numel` elements in this group."""
        return torch.ops.lowbit.optim_state_layout(
            self.rule, group["state_format"], numel, group["block_size"], group["min_quant_numel"],
            float(group.get("momentum", 0.0)), bool(group.get("centered", False)), bool(group.get("amsgrad", False)),
            group["fp8_second_moment"], group["master_weight_bits"])

    def _shard_state(self, p, group: Dict, gi: int, index: int, like: torch.Tensor, begin: int, end: int) -> Dict:
        """The state of elements [begin, end) of DTensor parameter p (dtensor_shards.py), laid out as the whole
        parameter's; `like`: a tensor of those elements."""
        st = self.state.get(p) or self._pending.get(p)
        if st:
            if st.get("range") != [begin, end]:
                raise RuntimeError(f"lowbit.optim.{type(self).__name__}: parameter {index} of group {gi} holds state "
                                   f"for elements {st.get('range')}, its shard now needs {[begin, end]}")
            return st
        st = param_state.from_param_state(self._new_state(like.reshape(-1), group, whole_numel=p.numel()),
                                          self.state_names)
        st["range"] = [begin, end]
        self._pending[p] = st
        return st

    def state_bytes(self) -> int:
        """Bytes the optimizer state holds (codes, scales, dense slots, corrections; not the counters)."""
        return sum(t.nbytes for st in self.state.values() for k, t in st.items()
                   if isinstance(t, torch.Tensor) and k != "counters")

    def check_overflow(self) -> None:
        """Raises if the quantized state of some parameter overflowed to Inf/NaN since the last check, naming the
        parameter (each overflow is reported once), as the C++ optimizers' check_overflow(). CPU parameters are
        checked after every step; GPU ones here, and every n steps after set_overflow_check_interval(n) (0, the
        default: never by itself, so that a step never waits for the GPU)."""
        self._check_overflow(cpu_only=False)

    def set_overflow_check_interval(self, n: int) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"lowbit.optim.{type(self).__name__}: set_overflow_check_interval: n must be an int "
                             f">= 0 (0: only check_overflow() checks GPU parameters), got {n!r}")
        self._overflow_interval = n

    def _check_overflow(self, cpu_only: bool) -> None:
        if cpu_only:
            # After a step: the CPU states' overflowed blocks summed in one op (the per-parameter search below
            # only where the sum moved); the list is kept while no state is made or loaded.
            if self._cpu_counters[0] != self._epoch:
                counters = [st["counters"] for st in self.state.values()
                            if "counters" in st and st["counters"].device.type == "cpu"]
                self._cpu_counters = (self._epoch, counters, sum(self._overflow_reported.get(p, 0)
                                      for p, st in self.state.items()
                                      if "counters" in st and st["counters"].device.type == "cpu"))
            _, counters, reported = self._cpu_counters
            if not counters or int(torch.stack(counters)[:, 1].sum()) == reported:
                return
            self._cpu_counters = (None, None, None)  # recounted at the next check, after the search below
        for gi, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                st = self.state.get(p)
                counters = st.get("counters") if st else None
                if counters is None or (cpu_only and counters.device.type != "cpu"):
                    continue
                steps, blocks = (int(x) for x in counters.tolist())
                fresh = blocks - self._overflow_reported.get(p, 0)
                self._overflow_reported[p] = blocks
                if fresh > 0:
                    raise RuntimeError(
                        f"lowbit.optim.{type(self).__name__}: the state of parameter {i} of group {gi} (shape "
                        f"{list(p.shape)}) overflowed to Inf/NaN in {fresh} block(s) at step {steps}; the parameter "
                        "is updated but that state is lost. Lower the learning rate, clip gradients (max_grad_norm), "
                        "or keep this parameter's state in FP32 (a param group with state_format='FP32')")

    def skipped_steps(self) -> int:
        """Steps skipped for a non-finite gradient (reading it waits for a GPU)."""
        return self._skipped_loaded + (int(self._skipped.sum()) if self._skipped is not None else 0)

    def state_dict(self) -> Dict:
        return state_dict_io.save(self, super().state_dict())

    def load_state_dict(self, state_dict: Dict) -> None:
        state_dict_io.load(self, state_dict)
        # Overflows the loaded state carries were the saving run's to report.
        self._overflow_reported = {p: int(st["counters"][1]) for p, st in self.state.items() if "counters" in st}
        self._epoch += 1
        self._lr_tensors.clear()
        self._checked.clear()
        self._lr_checks.clear()
        self._where = None

    # ---- the step -----------------------------------------------------------------------------
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._step(None)
        return loss

    def step_parameters(self, params: Iterable[torch.Tensor]) -> None:
        """A step of these parameters alone (gradient release): each steps as it would in step()."""
        self._step({id(p) for p in params})

    def set_step_graphs(self, on: bool) -> None:
        """Whether steps whose inputs repeat are recorded as a CUDA graph and replayed (on by default; the same bits
        either way), as the C++ optimizers' set_step_graphs."""
        if not isinstance(on, bool):
            raise TypeError(f"lowbit.optim.{type(self).__name__}: set_step_graphs: on must be a bool, got {on!r}")
        self._step_graph.set_enabled(on)

    def step_graph_replays(self) -> int:
        """Steps run as replays of a recorded CUDA graph (each recording's first run included)."""
        return self._step_graph.replays

    def _lr_tensor(self, gi: int, group: Dict, device: torch.device) -> torch.Tensor:
        lr = group["lr"]
        entry = self._lr_tensors.get((gi, device))
        if self._capturing:
            return entry[0]  # written before the recording (and before each replay), never in it
        if isinstance(lr, torch.Tensor):
            if entry is None:
                entry = self._lr_tensors[(gi, device)] = [torch.empty(1, dtype=torch.float64, device=device), None]
            entry[0].copy_(lr.detach().reshape(1))  # on the device: no host sync
        elif entry is None:
            entry = self._lr_tensors[(gi, device)] = [
                torch.full((1,), float(lr), dtype=torch.float64, device=device), lr]
        elif entry[1] != lr:
            entry[0].fill_(float(lr))  # a kernel on a GPU, no sync
            entry[1] = lr
        return entry[0]

    def _where_is(self, pid: int):
        """(group, index) of the parameter whose id() is pid; the map is made again when a group's list changed."""
        for fresh in (False, True):
            if fresh or self._where is None:
                self._where = {id(p): (gi, i) for gi, g in enumerate(self.param_groups)
                               for i, p in enumerate(g["params"])}
            at = self._where.get(pid)
            if at is not None and at[0] < len(self.param_groups) and at[1] < len(self.param_groups[at[0]]["params"]) \
                    and id(self.param_groups[at[0]]["params"][at[1]]) == pid:
                return at
        raise ValueError(f"lowbit.optim.{type(self).__name__}: step_parameters: a tensor that is not a parameter of "
                         "this optimizer's param groups")

    def _items(self, only: Optional[Set[int]]):
        """Per group, the (index, param, grad) to step."""
        work = [[] for _ in self.param_groups]
        if only is None:
            for gi, group in enumerate(self.param_groups):
                work[gi] = [(i, p, p.grad) for i, p in enumerate(group["params"]) if p.grad is not None]
        else:
            for pid in only:
                gi, i = self._where_is(pid)
                p = self.param_groups[gi]["params"][i]
                if p.grad is not None:
                    work[gi].append((i, p, p.grad))
            for w in work:
                w.sort(key=lambda item: item[0])
        # The one refusal no op makes (an op would fail inside ATen instead): the C++ optimizers' message.
        for gi, items in enumerate(work):
            for i, p, grad in items:
                if grad.layout != torch.strided:
                    raise RuntimeError(f"lowbit.optim.{type(self).__name__}: parameter {i} of group {gi} (shape "
                                       f"{list(p.shape)}) has a sparse gradient; lowbit optimizers need dense gradients")
        return work

    @eager_under_compile
    @torch.no_grad()
    def _step(self, only: Optional[Set[int]]) -> None:
        groups = self.param_groups
        for gi, group in enumerate(groups):
            self._check_group(gi, group)
        # ---- GradScaler's flag and scale (set by GradScaler.step for the duration of this step).
        amp_found = getattr(self, "found_inf", None)
        amp_scale = getattr(self, "grad_scale", None)
        if amp_found is not None:
            amp_found = amp_found.reshape(1).to(torch.float32)
        # ---- a recorded step whose inputs these are: replay it (step_graph.py).
        graph, now = self._step_graph, None
        head = graph.head(self, amp_found, amp_scale) if only is None and graph.enabled else None
        if head is not None:
            now, same = graph.look(head, groups)
            if same:
                self._refresh_lr(graph.device)
                graph.replay(amp_found, amp_scale, graph.device)
                self._after_step()
                return
        work = self._items(only)
        if not any(work):
            return
        # ---- every group's op calls, checked before any runs (call_checks.py): a step refused for one group
        # changes nothing. Calls reused from the last step were checked when they were built: between two such
        # steps only the gradients are new, and grad_check below reads those of every group that skips or clips.
        # A step whose inputs repeat the last one's is recorded (then run by one replay) instead.
        if now is not None and graph.repeats(now):
            device = next(items[0][1].device for items in work if items)
            self._refresh_lr(device)
            try:
                self._capturing = True
                graph.record(now, device, amp_found, amp_scale, lambda found, scale: self._step_calls(work, found, scale))
            except Exception as e:  # noqa: BLE001 (any failure to record: the step runs as it comes)
                graph.give_up(e)
            else:
                self._after_step()
                return
            finally:
                self._capturing = False
        self._pending = {}
        try:
            self._step_calls(work, amp_found, amp_scale)
        finally:
            self._pending = {}  # (what a refused step made)
        if now is not None:
            graph.remember(now)
        self._after_step()

    def _refresh_lr(self, device: torch.device) -> None:
        """Every group's lr tensor on `device` written from group["lr"] (before a recorded step runs)."""
        for gi, group in enumerate(self.param_groups):
            self._lr_tensor(gi, group, device)

    def _after_step(self) -> None:
        # ---- quantized state that overflowed to Inf/NaN: CPU parameters after every step, GPU ones every
        # set_overflow_check_interval steps (a read that waits for the device) or in check_overflow().
        self._steps_called += 1
        due = self._overflow_interval > 0 and self._steps_called % self._overflow_interval == 0
        self._check_overflow(cpu_only=not due)

    def _step_calls(self, work, amp_found, amp_scale) -> None:
        ops = torch.ops.lowbit
        groups = self.param_groups
        calls = [self._build_calls(gi, group, items) if items else None for gi, (group, items) in
                 enumerate(zip(groups, work))]
        built = [(gi, c[0]) for gi, c in enumerate(calls) if c is not None and c[2]]
        if built and sum(len(c[0]) for c in calls if c is not None) > 1:
            call_checks.check_calls(self, built, amp_scale)  # (one call alone refuses before it writes)
        # ---- pre-pass: one read of the gradients per device, for the groups that skip or clip.
        want_sumsq = any(g["max_grad_norm"] > 0 for g in groups)
        per_device, sharded_group = {}, None
        for gi, group in enumerate(groups):
            if not (group["skip_nonfinite"] or group["max_grad_norm"] > 0):
                continue
            for _, p, grad in work[gi]:
                if dtensor_shards.is_dtensor(grad):
                    sharded_group = sharded_group or dtensor_shards.rank_ranges(p)[2]
                    grad = grad.to_local()
                index = grad.get_device()  # an int: cheaper than a torch.device per gradient
                grads, ids, device = per_device.get(index) or per_device.setdefault(index, ([], [], grad.device))
                grads.append(grad)
                ids.append(gi)
        checks = {d: list(ops.grad_check(g, ids, len(groups), want_sumsq)) for g, ids, d in per_device.values()}
        if sharded_group is not None:  # DTensor parameters: skip on every rank where any rank saw Inf / NaN
            for found, _ in checks.values():
                dtensor_shards.agree_on_found_inf(found, sharded_group)
            # ... and clip by one process's norm of the whole gradients (the local sums above are the shards').
            for gi, group in enumerate(groups):
                if group["max_grad_norm"] > 0 and any(dtensor_shards.is_dtensor(g) for _, _, g in work[gi]):
                    first = work[gi][0][2]
                    device = (first.to_local() if dtensor_shards.is_dtensor(first) else first).device
                    checks[device][1][gi] = dtensor_shards.exact_sumsq(work[gi])
        if len(checks) > 1:
            # Several devices: the skip and the norms cover all of them (as the C++ optimizers do).
            first = next(iter(checks.values()))
            found, sumsq = first
            for other in list(checks.values())[1:]:
                found = torch.maximum(found, other[0].to(found.device))
                sumsq = sumsq + other[1].to(sumsq.device)
            for d in checks:
                checks[d] = [found.to(d), sumsq.to(d)]
        # ---- skipped steps: counted on the device; on the CPU the skip is decided here, before any state is kept.
        found_any = None
        if checks:
            found_any = next(iter(checks.values()))[0]
        if amp_found is not None:
            found_any = amp_found if found_any is None else torch.maximum(found_any, amp_found.to(found_any.device))
        own_found_cpu = amp_found_cpu = False
        if found_any is not None:
            if self._skipped is None:
                self._skipped = torch.zeros(1, dtype=torch.int64, device=found_any.device)
            self._skipped.add_(found_any.to(self._skipped.device).to(torch.int64))
            if checks and next(iter(checks.values()))[0].device.type == "cpu":
                own_found_cpu = bool(next(iter(checks.values()))[0].item())
            if amp_found is not None and amp_found.device.type == "cpu":
                amp_found_cpu = bool(amp_found.item())
        # ---- the calls, group by group; a group's new state is kept once its calls ran.
        ran, kept = [], False
        for gi, group in enumerate(groups):
            if calls[gi] is None or amp_found_cpu or (group["skip_nonfinite"] and own_found_cpu):
                continue
            buckets, finish, _, _ = calls[gi]
            self._run_calls(gi, group, buckets, checks, amp_found, amp_scale, finish)
            if finish is not None:
                finish()
            ran.append(gi)
            for _, p, _ in work[gi]:
                st = self._pending.pop(p, None)
                if st is not None:
                    self.state[p] = st
                    kept = True
        if kept:
            self._epoch += 1  # the call lists of every group are stale
        for gi in ran:  # kept without the gradients, which must not outlive the step
            buckets, finish, built, indices = calls[gi]
            if built and finish is None:
                self._plans[gi] = (self._epoch, indices, {k: (b[0], None) + b[2:] for k, b in buckets.items()},
                                   [p for _, p, _ in work[gi]])

    def _build_calls(self, gi, group, items):
        """The op calls of a group's items: ({(device, slots, block): bucket}, what to run after them (DTensor
        parameters), whether they were built anew (else reused from the last step), the indices stepped). A bucket:
        params, grads, state, counters, rng keys, offsets, each one's position in `items`, each one's index in the
        group. New state goes to self._pending."""
        # What the op steps: (index, tensor it writes, gradient, state, element offset in the whole parameter).
        plain = [item for item in items if not dtensor_shards.is_dtensor(item[1])]
        indices = tuple(item[0] for item in plain)
        plan = self._plans.get(gi)
        if (len(plain) == len(items) and plan is not None and plan[0] == self._epoch and plan[1] == indices
                and same_tensors(plan[3], [item[1] for item in plain])):
            # The same parameters as the last step (the very tensors: one may have been swapped in its group's
            # list), with the same state: only the gradients are new.
            buckets = {key: (b[0], [plain[k][2] for k in b[6]]) + b[2:] for key, b in plan[2].items()}
            return buckets, None, False, indices
        calls = [(i, p, grad, self._state_for(p, group, gi, i), 0, k) for k, (i, p, grad) in enumerate(plain)]
        finish = None
        if len(plain) < len(items):
            sharded, finish = dtensor_shards.prepare(self, group, gi,
                                                     [x for x in items if dtensor_shards.is_dtensor(x[1])])
            calls += [c + (None,) for c in sharded]
        buckets = {}
        for i, p, grad, st, offset, position in calls:
            key = (p.device, tuple(st["slots"]), st["block_size"])
            b = buckets.get(key)
            if b is None:
                b = buckets[key] = ([], [], [], [], [], [], [], [])
            b[0].append(p)
            b[1].append(grad)
            b[2].extend(st[k] for k in param_state.state_keys(key[1], self.state_names))
            b[3].append(st["counters"])
            b[4].append(rng_key(gi, i))
            b[5].append(offset)
            b[6].append(position)
            b[7].append(i)
        return buckets, finish, True, indices

    def _run_calls(self, gi, group, buckets, checks, amp_found, amp_scale, owners=None) -> None:
        """The group's op calls; owners (dtensor_shards.BlockOwners): its DTensor parameters stepped by block owners,
        whose LAMB norms are the whole parameters'."""
        ops = torch.ops.lowbit
        hyper = self.op_hyper_parameters(group)
        for (device, slots, block), (params, grads, state, counters, keys, offsets, _, indices) in buckets.items():
            found = sumsq = None
            if device in checks:
                if group["skip_nonfinite"]:
                    found = checks[device][0]
                if group["max_grad_norm"] > 0:
                    sumsq = checks[device][1].narrow(0, gi, 1)
            if amp_found is not None:
                a = amp_found.to(device)
                found = a if found is None else torch.maximum(found, a)
            scale = None if amp_scale is None else amp_scale.reshape(1).to(device, torch.float32)
            args = (params, grads, state, counters, self._lr_tensor(gi, group, device))
            kwargs = dict(rule=self.rule, slots=list(slots), block_size=block, offsets=offsets, rng_keys=keys,
                          seed=self.seed, stochastic_round=group["bf16_stochastic_round"], found_inf=found,
                          grad_sumsq=sumsq, max_grad_norm=group["max_grad_norm"] if sumsq is not None else 0.0,
                          grad_scale=scale, **hyper)
            lamb = owners.lamb_rows(args, kwargs, indices) if owners is not None and self.rule == "LAMB" else None
            ops.optim_step_(*args, lamb_norms=lamb, **kwargs)
