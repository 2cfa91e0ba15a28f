"""lowbit from Python: low-bit optimizers (lowbit.optim.AdamW, ...) over the ops torch.ops.lowbit.*.

`import lowbit` loads liblowbit.so: $LOWBIT_LIBRARY if set (a build tree's library), else the one
`pip install .` put in this package. A source tree without either loads nothing until
`lowbit.load_library(path)`.
"""
import os

import torch

from . import optim  # noqa: F401

__all__ = ["load_library", "library_path", "optim"]

_PACKAGED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "liblowbit.so")
_loaded = None  # the path liblowbit.so was loaded from


def load_library(path=None):
    """Loads liblowbit.so (path, else $LOWBIT_LIBRARY, else the packaged one) so that torch.ops.lowbit.* exist;
    returns torch.ops.lowbit. A process holds one liblowbit: asking for a second file is refused (its ops
    would register the namespace `lowbit` twice)."""
    global _loaded
    path = path or os.environ.get("LOWBIT_LIBRARY") or (_PACKAGED if os.path.exists(_PACKAGED) else None)
    if not path:
        raise RuntimeError("lowbit.load_library: no liblowbit.so: give its path, set LOWBIT_LIBRARY, "
                           "or install the package (pip install .)")
    path = os.path.realpath(path)
    if _loaded is not None:
        if _loaded != path:
            raise RuntimeError(f"lowbit.load_library: liblowbit.so is already loaded from {_loaded}; "
                               f"a process can hold one (asked for {path})")
        return torch.ops.lowbit
    torch.ops.load_library(path)
    _loaded = path
    return torch.ops.lowbit


def library_path():
    """Where liblowbit.so was loaded from (None: not loaded)."""
    return _loaded


if os.environ.get("LOWBIT_LIBRARY") or os.path.exists(_PACKAGED):
    load_library()
