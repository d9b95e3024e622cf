# Sourced by tools/demo.sh and tools/test.sh: create .venv and install svcframe with its test extras.
# Idempotent: a second run only re-checks the install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "svcframe needs Python >= 3.11 (found: $("$PY" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  if ! "$PY" -m venv "$ROOT/.venv" 2>/dev/null; then
    echo "python3 -m venv failed; installing python3-venv with apt-get" >&2
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    "$PY" -m venv "$ROOT/.venv"
  fi
fi
VENV="$ROOT/.venv"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
export PATH="$VENV/bin:$PATH"
export MPLBACKEND=Agg
