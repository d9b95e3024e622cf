#!/usr/bin/env bash
# The main job on this machine: set up, then measure this machine's data-service roofline with the
# self-test (launch servers from configs/selftest.json, Pc, Ps, validation grid, teardown).
# Extra arguments go to `svcframe roofline collect` (e.g. --paper, --duration-seconds 5).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
svcframe roofline collect --config configs/selftest.json --output out/roofline "$@"
