"""One parameter's state as the optimizer classes keep it in `optimizer.state[p]` (and so in state_dict()):
a flat dict of tensors and plain values, under torch.optim's state names.

    counters            int64 [2]: steps taken, state blocks that overflowed (the op updates both)
    slots               the op's slot storages ("Dyn8Signed", "fp32", "none", ...), from optim_state_layout
    block_size          the quantization block
    <name>              a dense slot (fp32 / bf16), e.g. "exp_avg"
    <name>.codes        a quantized slot's codes (uint8) ...
    <name>.absmax       ... and per-block scales (float32), e.g. "exp_avg_sq.codes", "exp_avg_sq.absmax"
    master_correction   a bf16 parameter's master-weight correction (int16 / int8)

The tensors are the op's `state` list, by key, in the order state_keys() gives; codes and scales are saved and
loaded as they are, never expanded to fp32."""
from functools import lru_cache
from typing import Dict, Tuple

from .step_args import ParamState

CORRECTIONS = ("int16_correction", "int8_correction")
DENSE = ("fp32", "bf16")


@lru_cache(maxsize=None)
def state_keys(slots: Tuple[str, ...], names: Tuple[str, ...]) -> Tuple[str, ...]:
    """The keys of a state's tensors in the order optim_step_ takes them; names[k]: slot k's torch.optim name."""
    keys = []
    for k, storage in enumerate(slots):
        if storage == "none":
            continue
        if storage in CORRECTIONS:
            keys.append("master_correction")
        elif storage in DENSE:
            keys.append(names[k])
        else:
            keys += [names[k] + ".codes", names[k] + ".absmax"]
    return tuple(keys)


def from_param_state(ps: ParamState, names: Tuple[str, ...]) -> Dict:
    """The dict entry of a helper-made state (step_args.init_state)."""
    entry = {"counters": ps.counters, "slots": list(ps.slots), "block_size": ps.block_size}
    entry.update(zip(state_keys(tuple(ps.slots), names), ps.tensors))
    return entry
