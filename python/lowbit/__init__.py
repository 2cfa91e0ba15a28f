"""lowbit from Python: load the library, then call torch.ops.lowbit.* directly or through lowbit.optim."""
import os

import torch

from . import optim  # noqa: F401

__all__ = ["load_library", "optim"]


def load_library(path=None):
    """Loads liblowbit.so (path, else $LOWBIT_LIBRARY) so that torch.ops.lowbit.* exist; returns torch.ops.lowbit."""
    path = path or os.environ.get("LOWBIT_LIBRARY")
    if not path:
        raise RuntimeError("lowbit.load_library: give the path of liblowbit.so or set LOWBIT_LIBRARY")
    torch.ops.load_library(path)
    return torch.ops.lowbit
