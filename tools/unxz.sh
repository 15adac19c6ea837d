#!/usr/bin/env bash
# Unpacks an xz-compressed binary (tools/prepare_device_carry.sh packs them)
# into an executable file, with xz where the machine has it, else Python's
# lzma (the GPU machine may have no xz).
#   tools/unxz.sh FILE.xz OUT
set -euo pipefail
xz -dc "$1" >"$2" 2>/dev/null || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$1" >"$2"
chmod +x "$2"
