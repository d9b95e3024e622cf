#!/usr/bin/env bash
# The test suite: set up, then run pytest on every core (pytest-xdist: one worker per core, each test file on
# one worker, so that a file's module fixtures start once). Extra arguments go to pytest; `-n 0` runs it in
# one process.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
python -m pytest -n auto --dist loadfile "$@"
