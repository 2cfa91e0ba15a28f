"""The README's Python example runs as written (the library path swapped for the build's)."""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_python_block_runs_as_written(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no ```python block"
    code = blocks[0].replace('"build/liblowbit.so"', repr(os.environ["LOWBIT_LIBRARY"]))
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
