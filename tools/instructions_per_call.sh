#!/usr/bin/env bash
# Server instructions per noop call (callgrind, deterministic: independent of the machine's load).
# Runs tools/profile_server.py under valgrind for N and 3N calls and divides the difference by 2N, so
# start-up cost cancels out. Extra arguments go to profile_server.py (e.g. --no-monitoring).
#   bash tools/instructions_per_call.sh [--no-monitoring]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
out=$(mktemp -d)
ir() {
  OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1" \
    .venv/bin/python tools/profile_server.py --calls "$1" --mode block --depth 256 "${@:2}" >/dev/null 2>&1
  grep -E "^summary:" "$out/cg.$1" | awk '{print $2}'
}
a=$(ir 10000 "$@"); b=$(ir 30000 "$@")
echo "$* : $(( (b - a) / 20000 )) instructions per call"
rm -rf "$out"
