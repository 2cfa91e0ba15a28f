"""Where the tests get lowbit from: the installed package (ctest's python_ops installs it first,
run_against_package.sh), or this source tree's python/ with $LOWBIT_LIBRARY naming a build's
liblowbit.so (a developer's quick run). Either way `import lowbit` has loaded the library."""
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if os.environ.get("LOWBIT_LIBRARY"):
    sys.path.insert(0, str(ROOT / "python"))

import lowbit  # noqa: E402

if lowbit.library_path() is None:
    raise pytest.UsageError("lowbit is importable but loaded no liblowbit.so: run through ctest (python_ops), "
                            "install the package (pip install .), or set LOWBIT_LIBRARY to a build's library")


def pytest_report_header(config):
    return f"lowbit {os.path.dirname(lowbit.__file__)}, library {lowbit.library_path()}"
