#!/usr/bin/env bash
# Installs what the build needs (Debian/Ubuntu, apt), then configures and
# builds everything into build/ (library, CUDA kernels, tests, tools).
# Idempotent: when all is installed and built it only checks, in seconds.
#
#   ./scripts/setup.sh            # then ./build/metrale, ctest --test-dir build
#
# Environment: BUILD_DIR (default build), BUILD_TYPE (default Release),
# CMAKE_ARGS (extra configure arguments, first configure only).
# The CUDA toolkit (nvcc, CUDA 12.4 or newer) must be installed; no GPU is
# needed to build, and the tests skip their GPU cases where none is present.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}

# ---- system packages, only those missing ----
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
[ -f /usr/include/CLI/CLI.hpp ] || missing+=(libcli11-dev)
[ -f /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ---- the CUDA compiler (not always on PATH) ----
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1; then
  for nvcc in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    if [ -x "$nvcc" ]; then export CUDACXX=$nvcc; break; fi
  done
  if [ -z "${CUDACXX:-}" ]; then
    echo "setup: nvcc not found; install the CUDA toolkit (12.4+) or set CUDACXX" >&2
    exit 1
  fi
fi

# ---- configure once, then build (ninja re-runs cmake when CMake files change) ----
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${CMAKE_ARGS:-}
fi
ninja -C "$BUILD_DIR"
