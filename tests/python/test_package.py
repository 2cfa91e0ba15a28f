"""The package as users get it: `import lowbit` has loaded liblowbit.so without a path (the installed package's
own copy, under ctest's python_ops), one library per process, and the package's version is the library's."""
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import lowbit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_import_loaded_the_library_and_its_ops():
    assert lowbit.library_path() is not None
    assert "optim_step_" in dir(torch.ops.lowbit) or hasattr(torch.ops.lowbit, "optim_step_")
    assert lowbit.optim.hyper_parameters()[0] == "beta1"


@pytest.mark.skipif(bool(os.environ.get("LOWBIT_LIBRARY")), reason="a source-tree run: the library is a build's")
def test_the_installed_package_loads_its_own_library():
    package = pathlib.Path(lowbit.__file__).parent
    assert pathlib.Path(lowbit.library_path()).parent == package.resolve()
    assert not str(package).startswith(str(ROOT / "python"))  # not the source tree's python/lowbit


def test_a_second_library_is_refused(tmp_path):
    other = tmp_path / "liblowbit.so"
    other.write_bytes(b"")
    with pytest.raises(RuntimeError, match="liblowbit.so is already loaded from .*; a process can hold one"):
        lowbit.load_library(str(other))
    assert lowbit.load_library(lowbit.library_path()) is torch.ops.lowbit  # the same one again: fine


def test_without_a_library_the_package_says_how_to_get_one(tmp_path):
    # The source tree's package, no LOWBIT_LIBRARY: imports, and load_library says what to do.
    code = ("import lowbit\nassert lowbit.library_path() is None\n"
            "try:\n    lowbit.load_library()\nexcept RuntimeError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LOWBIT_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT / "python")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "give its path, set LOWBIT_LIBRARY, or install the package (pip install .)" in done.stdout


def test_the_package_version_is_the_librarys():
    cmake = re.search(r"project\(lowbit VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
    pyproject = re.search(r'^version = "([0-9.]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert cmake == pyproject
