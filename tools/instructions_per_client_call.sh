#!/usr/bin/env bash
# Client instructions per noop call (callgrind, deterministic: independent of the machine's load), for the
# svcframe client, the raw uvloop client (the limit) and the hand-written asyncio + msgpack client, each
# against its own server running outside valgrind (tools/profile_client.py starts it; valgrind does not follow
# children). One run per row: callgrind dumps its counts where tools/profile_client.py marks the start and the
# end of its N timed calls (--dump-before=getsid), so the second dump holds those calls alone, without the
# interpreter's start-up (which takes most of the run under valgrind) or the warm-up.
#   bash tools/instructions_per_client_call.sh [--calls N] [--impl svcframe|raw|msgpack]... [--depth D]...
#                                              [other tools/profile_client.py options, e.g. --transport unix]
# Defaults: N = 6000, every implementation, depth 1 (one call at a time: the same path every call) and 32 (many
# in flight; under valgrind the client is ~50x slower than its server, so it finds every reply waiting: a
# client that batches as much as it can). Repeat runs agree within about 3%.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
calls=6000 impls=() depths=() rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    --calls) calls="$2"; shift 2 ;;
    --impl) impls+=("$2"); shift 2 ;;
    --depth) depths+=("$2"); shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
[ ${#impls[@]} -gt 0 ] || impls=(raw msgpack svcframe)
[ ${#depths[@]} -gt 0 ] || depths=(1 32)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ir() {  # instructions per call of one run: impl, depth, calls
  rm -f "$out"/cg*
  if ! OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind --dump-before=getsid --callgrind-out-file="$out/cg" \
      .venv/bin/python tools/profile_client.py --impl "$1" --depth "$2" --calls "$3" ${rest[@]+"${rest[@]}"} \
      >"$out/log" 2>&1; then
    echo "tools/profile_client.py --impl $1 --depth $2 --calls $3 failed under valgrind:" >&2
    tail -5 "$out/log" >&2
    exit 1
  fi
  if [ ! -f "$out/cg.2" ] || [ -f "$out/cg.3" ]; then  # exactly the two marks of tools/profile_client.py
    echo "callgrind did not dump at tools/profile_client.py's two marks (getsid): no count" >&2
    exit 1
  fi
  awk -v n="$3" '/^summary:/ { printf "%d\n", $2 / n }' "$out/cg.2"
}
extra=""
[ ${#rest[@]} -eq 0 ] || extra=", ${rest[*]}"
for depth in "${depths[@]}"; do
  raw=""
  for impl in "${impls[@]}"; do
    n=$(ir "$impl" "$depth" "$calls")
    [ "$impl" != raw ] || raw=$n
    ratio=""
    [ -z "$raw" ] || ratio=$(awk -v n="$n" -v r="$raw" 'BEGIN { printf " (%.2fx raw)", n / r }')
    printf '%-8s client, depth %s%s: %d instructions per call%s\n' "$impl" "$depth" "$extra" "$n" "$ratio"
  done
done
