#!/usr/bin/env bash
# The main job on this machine: set up, then measure this machine's data-service roofline with the
# self-test (launch servers from its shipped config, selftest/selftest.json; Pc, Ps, validation grid, teardown).
# Extra arguments go to `svcframe roofline collect` (e.g. --paper, --duration-seconds 5).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
svcframe roofline collect --output out/roofline "$@"
