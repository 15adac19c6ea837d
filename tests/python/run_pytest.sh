#!/usr/bin/env bash
# CTest entry of the Python tests (registered by tests/CMakeLists.txt):
#   tests/python/run_pytest.sh SOURCE_DIR BUILD_DIR [LIBMETRALE]
# 1. a venv at BUILD_DIR/pyenv (created once) with the build tools and test
#    dependencies from PyPI: scikit-build-core, nanobind, numpy, pytest, and
#    torch + transformers at the versions pinned in requirements-torch.txt
#    (beside this script) for the torch-op and transformers tests, reinstalled
#    when the venv holds other versions (the
#    PyPI torch wheel with its nvidia-* dependencies: about 100 s and 5.6 GB
#    the first time; `--no-deps` on torch alone was tried and does not
#    import: libtorch needs libcufile, libcusparseLt and libnvshmem from those
#    packages). They install one package at a time without pip's cache, so
#    the disk holds at most one downloaded wheel beside what is installed
#    (about 6.5 GB at the peak; 8 GB free are asked for). With less free
#    space, or when a package fails to install (what was installed is then
#    taken back), the torch tests skip, and this script says so.
#    METRALE_PYTEST_TORCH=0 leaves torch out on purpose (those tests then
#    skip too);
# 2. `pip install` of the package from SOURCE_DIR into it, linking the
#    libmetrale.a CTest's build already made (METRALE_PREBUILT_LIB), so only
#    the nanobind extension compiles (the CUDA kernels are not compiled a
#    second time); the CMake build tree BUILD_DIR/pybuild is kept, so a re-run
#    rebuilds only what changed;
# 3. pytest on SOURCE_DIR/tests/python; its exit status is the test's, and
#    "no tests collected" (5) is a failure.
# Environment: METRALE_PYTHON (default python3), PIP_INDEX_URL etc. as usual.
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
py=${METRALE_PYTHON:-python3}
venv=$build/pyenv
lib=${3:-$build/libmetrale.a}
log() { echo "run_pytest: $*"; }

[ -f "$lib" ] || { log "$lib is missing: build the 'metrale' target first"; exit 1; }
command -v "$py" >/dev/null 2>&1 || { log "$py not found: install Python 3.9+ (with venv and headers)"; exit 1; }

# One run at a time per build tree (they share the venv and the CMake tree).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$build/.python-tests.lock"
  flock 9
fi

start=$SECONDS
# Debian's own python3 ships venv (ensurepip) and the C headers separately:
# install them when missing, as scripts/setup.sh does for the C++ tools.
if ! "$py" -c "import ensurepip, sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(command -v "$py")" = /usr/bin/python3 ]; then
    log "installing python3-venv python3-dev"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv python3-dev
  else
    log "$py lacks venv/ensurepip or its C headers (Python.h) (Debian: apt-get install python3-venv python3-dev)"
    exit 1
  fi
fi
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$venv"
  "$py" -m venv "$venv" || { log "'$py -m venv $venv' failed"; exit 1; }
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if ! "$venv/bin/python" -c "import scikit_build_core, nanobind, numpy, pytest" >/dev/null 2>&1; then
  "${pip[@]}" install "scikit-build-core>=0.10" "nanobind>=2.2" numpy pytest
fi
# torch and transformers, one package at a time (pip resolves the whole set
# first, without downloading the wheels), with pip's downloads kept in the
# build tree so that one free-space check covers them.
torch_peak_gb=8
free_gb() { df -Pk "$build" | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }  # whole GB free under the build tree
install_torch() {
  local report=$build/pyenv-torch-report.json tmp=$build/pyenv-pip-tmp gb
  gb=$(free_gb)
  if [ "$gb" -lt "$torch_peak_gb" ]; then
    log "SKIPPING the torch tests: $gb GB free under $build, and torch +" \
        "transformers take about $torch_peak_gb GB to install"
    return 0
  fi
  log "installing $(grep -v '^#' "$torch_reqs" | tr '\n' ' ')($gb GB free)"
  mkdir -p "$tmp"
  TMPDIR=$tmp "${pip[@]}" install --dry-run --report "$report" -r "$torch_reqs"
  local -a pins
  mapfile -t pins < <("$venv/bin/python" -c '
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print(item["metadata"]["name"] + "==" + item["metadata"]["version"])' "$report")
  local pin done_pins=()
  for pin in "${pins[@]}"; do
    if ! TMPDIR=$tmp "${pip[@]}" install --no-deps --no-cache-dir "$pin"; then
      # A half-installed torch fails at import with an OSError, which
      # pytest.importorskip does not skip: take back what was installed.
      log "SKIPPING the torch tests: installing $pin failed ($(free_gb) GB free now);" \
          "removing the ${#done_pins[@]} packages installed before it"
      [ ${#done_pins[@]} -eq 0 ] || "${pip[@]}" uninstall -y "${done_pins[@]%%==*}" || true
      break
    fi
    done_pins+=("$pin")
  done
  rm -rf "$tmp" "$report"
}
torch_reqs=$src/tests/python/requirements-torch.txt
# Whether the venv imports torch and transformers at the pinned versions.
torch_pinned() {
  "$venv/bin/python" - "$torch_reqs" >/dev/null 2>&1 <<'PY'
import sys
from importlib.metadata import version
import torch, transformers  # noqa: F401 (a half-installed torch fails here)
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        if version(name) != want:
            sys.exit(1)
PY
}
if [ "${METRALE_PYTEST_TORCH:-1}" != 0 ] && ! torch_pinned; then
  install_torch
fi
log "venv ready in $((SECONDS - start)) s"

# The configure step enables CUDA (the root project's languages): find nvcc
# as scripts/setup.sh does.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1; then
  for nvcc in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    if [ -x "$nvcc" ]; then export CUDACXX=$nvcc; break; fi
  done
fi

"${pip[@]}" install --no-build-isolation --no-deps \
  --config-settings=build-dir="$build/pybuild" --config-settings=cmake.define.METRALE_PREBUILT_LIB="$lib" "$src"
log "package built and installed in $((SECONDS - start)) s"

cd "$build"  # import the installed package, never the source tree
set +e
"$venv/bin/python" -m pytest -q -c "$src/pyproject.toml" --rootdir "$src" "$src/tests/python"
rc=$?
set -e
log "pytest exit status $rc after $((SECONDS - start)) s"
if [ "$rc" -eq 5 ]; then
  log "no tests collected: failing"
  exit 1
fi
exit "$rc"
