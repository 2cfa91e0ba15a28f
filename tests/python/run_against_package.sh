#!/usr/bin/env bash
# The Python suite against the installed package: `pip install` of the source tree into a folder of
# the build (pyproject.toml, with the library this build made: no second compile), then pytest with
# that folder first on the path and no LOWBIT_LIBRARY, so `import lowbit` finds liblowbit.so as a
# user's install does. ctest's python_ops runs this.
#   run_against_package.sh PYTHON SOURCE_DIR LIBRARY PACKAGE_DIR [pytest arguments]
set -euo pipefail
python=$1 source=$2 library=$3
# Absolute: pip resolves a relative build-dir against the source tree, not here.
package=$(realpath -m "$4")
shift 4
start=$(date +%s)
# pip and CMake run without what the caller preloads for the tests (the sanitizer run preloads ASan).
env -u LD_PRELOAD PIP_DISABLE_PIP_VERSION_CHECK=1 "$python" -m pip install --quiet --no-deps --no-build-isolation \
  --upgrade --target "$package" -C build-dir="$package.build" \
  -C cmake.define.LOWBIT_PREBUILT_LIBRARY="$library" "$source"
echo "[python_ops] package installed in $package in $(( $(date +%s) - start )) s"
unset LOWBIT_LIBRARY
export PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m pytest -q "$source/tests/python" "$@"
