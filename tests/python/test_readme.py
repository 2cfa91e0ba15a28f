"""The README's Python examples run as written, each in a fresh interpreter that finds lowbit where a
user's would (conftest.py: the installed package, or python/ with LOWBIT_LIBRARY)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_has_python_examples():
    assert BLOCKS, "README.md has no ```python block"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs_as_written(tmp_path, index):
    script = tmp_path / f"readme_example_{index}.py"
    script.write_text(BLOCKS[index])
    env = dict(os.environ)
    if env.get("LOWBIT_LIBRARY"):  # the source tree's package, not an installed one
        env["LOWBIT_LIBRARY"] = os.path.abspath(env["LOWBIT_LIBRARY"])  # the example runs elsewhere
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
