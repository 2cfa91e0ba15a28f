"""Files a user may hand `lowbit inspect` that are no lowbit checkpoint: a torch.save file written by
Python, which is named as such, and a FIFO, which is refused at once instead of blocking the reader
(tests/test_checkpoint_bad_files.cpp has the same cases in C++)."""
import os
import subprocess

import pytest
import torch

CLI = os.environ.get("LOWBIT_CLI")
if not CLI:
    pytest.skip("LOWBIT_CLI is not set (run through ctest)", allow_module_level=True)


def inspect(path):
    return subprocess.run([CLI, "inspect", str(path)], capture_output=True, text=True, timeout=60)


def test_a_torch_save_file_from_python_is_named_as_such(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"a": torch.ones(3)}, path)
    r = inspect(path)
    assert r.returncode == 1, r.stderr
    assert f"'{path}' is a zip archive without a checkpoint's entries" in r.stderr
    assert "a torch.save file from Python?" in r.stderr
    assert "miniz" not in r.stderr


def test_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "checkpoint.fifo"
    os.mkfifo(path)
    r = inspect(path)  # blocked in fopen before; the timeout fails the test if it still does
    assert r.returncode == 1, r.stderr
    assert f"'{path}' is a FIFO (named pipe), not a regular file" in r.stderr
