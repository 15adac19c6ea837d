#!/usr/bin/env bash
# Builds the Python package on a machine without internet (the GPU machine:
# Python with torch, numpy, pytest and nanobind installed; cmake and the CUDA
# toolkit) and runs the whole Python test suite, GPU cases included.
#   bash python/run_gpu_tests.sh [pytest args]
# scikit-build-core (and its pure-Python deps packaging, pathspec) come from
# the git-ignored .whl/ folder when not installed, prepared on a machine
# with PyPI:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl \
#     scikit-build-core==1.1.2 'packaging>=23.2' 'pathspec>=0.12.0'
# Everything is installed under $SITE (default /tmp/metrale-site, put on
# PYTHONPATH), never into the system's Python. The extension compiles the
# library and its CUDA kernels in build-py/ (kept, so a re-run is
# incremental); METRALE_PREBUILT_LIB=path/to/libmetrale.a links a carried
# one instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-python3}
SITE=${SITE:-/tmp/metrale-site}
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1; then
  for nvcc in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    if [ -x "$nvcc" ]; then export CUDACXX=$nvcc; break; fi
  done
fi
"$py" -c "import nanobind, numpy, pytest" || { echo "run_gpu_tests: needs nanobind, numpy, pytest" >&2; exit 1; }
if ! "$py" -c "import scikit_build_core" 2>/dev/null; then
  "$py" -m pip install -q --no-index --find-links .whl --target "$SITE" scikit-build-core
fi
extra=()
[ -n "${METRALE_PREBUILT_LIB:-}" ] && extra+=(--config-settings="cmake.define.METRALE_PREBUILT_LIB=$(realpath "$METRALE_PREBUILT_LIB")")
start=$SECONDS
"$py" -m pip install -q --no-index --no-build-isolation --no-deps --upgrade --target "$SITE" \
  --config-settings=build-dir=build-py ${extra[@]+"${extra[@]}"} .
echo "run_gpu_tests: built in $((SECONDS - start)) s"
"$py" - <<'PY'
import metrale
print("run_gpu_tests: metrale", metrale.__file__, "cuda_available", metrale.cuda_available())
try:
    import torch
    print("run_gpu_tests: torch", torch.__version__, "cuda", torch.cuda.is_available())
except ImportError:
    print("run_gpu_tests: torch not importable: the GPU tests will be skipped")
PY
exec "$py" -m pytest -q -rs tests/python "$@"
