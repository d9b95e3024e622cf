#!/usr/bin/env bash
# The test suite: set up, then run pytest. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
python -m pytest "$@"
