#!/usr/bin/env bash
# Prepares, on this (Debian, networked) machine, what the GPU machine lacks,
# in the git-ignored folders that the device tool carries:
#   .deps/googletest, .deps/include/{CLI,nlohmann}  sources/headers for a build there
#   .deps/build/{tests,bench,metrale}.xz            binaries built here (static cudart; stripped, xz)
#   .whl/                                            scikit-build-core wheels for the Python tests
# Then, on the GPU machine (carry [".deps", ".whl"]):
#   METRALE_BUILD_DIR=.deps/build tools/device_run.sh
# The Python tests build their extension there, with that machine's compiler.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh >/dev/null
mkdir -p .deps/include .deps/build/tests .deps/build/bench .whl
rm -rf .deps/googletest && cp -r /usr/src/googletest .deps/googletest
cp -r /usr/include/CLI /usr/include/nlohmann .deps/include/
# Stripped and xz-compressed (14 binaries of 14 MB, mostly sm_90a code, fit
# the carry's 64 MiB only so: about 1.7 MB each); device_run.sh unpacks them.
rm -f .deps/build/tests/* .deps/build/bench/* .deps/build/metrale*
pack() { strip -o "$2/$(basename "$1")" "$1" && xz -9 -f "$2/$(basename "$1")"; }
for t in build/tests/test_*; do [ -f "$t" ] && [ -x "$t" ] && pack "$t" .deps/build/tests; done
for b in build/bench/metrale_bench build/bench/prefill_bench build/bench/cp_bench; do [ -x "$b" ] && pack "$b" .deps/build/bench; done
pack build/metrale .deps/build
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .whl scikit-build-core==1.1.2 'packaging>=23.2' 'pathspec>=0.12.0'
du -sh .deps .whl
