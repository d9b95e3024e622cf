# Sourced by tools/demo.sh and tools/test.sh: create a venv and install svcframe with its test extras.
# Idempotent: a second run only re-checks the install.
#   PYTHON  the interpreter the venv is made from (default python3)
#   VENV    where the venv lives (default .venv; a relative path is relative to the repository), e.g.
#           PYTHON=python3.13 VENV=.venv-3.13 bash tools/test.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
[[ "$VENV" = /* ]] || VENV="$ROOT/$VENV"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "svcframe needs Python >= 3.11 (found: $("$PY" --version 2>&1))" >&2
  exit 1
fi
_py_version() { "$1" -c 'import sys; print(sys.version.split()[0])'; }
if [ -n "${PYTHON:-}" ] && [ -x "$VENV/bin/python" ] && [ "$(_py_version "$VENV/bin/python")" != "$(_py_version "$PY")" ]; then
  echo "$VENV has Python $(_py_version "$VENV/bin/python"), not $PYTHON's $(_py_version "$PY"): remove it, or set VENV" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    echo "$PY -m venv failed; installing python3-venv with apt-get" >&2
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    "$PY" -m venv "$VENV"
  fi
fi
# A C compiler builds svcframe's compiled modules at install (setup.py; without one, pure Python).
if ! command -v "$("$PY" -c 'import shlex, sysconfig; print(shlex.split(sysconfig.get_config_var("CC") or "cc")[0])')" \
    >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "no C compiler: installing gcc with apt-get (for svcframe's compiled modules)" >&2
  apt-get update -qq && apt-get install -y -qq gcc >/dev/null || echo "gcc unavailable: svcframe installs pure Python" >&2
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The dependencies and the editable install, without compiling (SVCFRAME_PURE_BUILD=1): the compiled modules are
# built once below, in place, where a second run recompiles only what changed (pip builds in a fresh directory
# every time). editable_mode=compat puts the repository on sys.path, where providers/ and selftest/ import by
# their own names (the wheel installs them as svcframe_providers and svcframe_selftest: svcframe/packages.py).
EXTRAS=test
# CI also installs the mpi-wheel extra (mpi4py + the MPICH wheel with its mpiexec; a cluster uses the mpi extra
# and its own MPI): tests/test_ranks.py starts servers under a real mpiexec. Without it those tests skip.
[ "${CI:-}" != "true" ] || EXTRAS=test,mpi-wheel
PYTHONWARNINGS="ignore:Compat editable" SVCFRAME_PURE_BUILD=1 "$VENV/bin/python" -m pip install -q -e "$ROOT[$EXTRAS]" --config-settings editable_mode=compat \
  || { [ "$EXTRAS" = test ] && exit 1; echo "MPI wheels unavailable: the mpiexec tests skip" >&2
       PYTHONWARNINGS="ignore:Compat editable" SVCFRAME_PURE_BUILD=1 "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" --config-settings editable_mode=compat; }
# CI also exercises the hwloc topology backend: pyhwloc 3.x declares Python >= 3.12 but imports on 3.11.
# The project's dependency keeps that honest marker (python_version >= '3.12'); only CI overrides it.
if [ "${CI:-}" = "true" ] && ! "$VENV/bin/python" -c 'import pyhwloc' 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --ignore-requires-python "pyhwloc>=3"
fi
# The compiled modules (setup.py: every svcframe module with a .pxd), built in place with the test extra's
# setuptools and Cython; SVCFRAME_PURE_BUILD=1 in the environment skips them (svcframe then runs as pure Python).
if [ "${SVCFRAME_PURE_BUILD:-0}" = 0 ]; then
  build_log=$(mktemp)
  if ! (cd "$ROOT" && "$VENV/bin/python" setup.py -q build_ext --inplace -j "$(nproc 2>/dev/null || echo 2)") \
      >"$build_log" 2>&1; then
    cat "$build_log" >&2
    rm -f "$build_log"
    echo "building svcframe's compiled modules failed (SVCFRAME_PURE_BUILD=1 skips them)" >&2
    exit 1
  fi
  rm -f "$build_log"
fi
# Byte-compile the repository's packages (an editable install leaves them as source): where
# PYTHONDONTWRITEBYTECODE is set, as on this project's CI machines, every process would compile them again
# as it imports them, about 0.2 s a process, and the tests start hundreds (tests/test_cli_admin.py and
# tests/test_cli_conventions.py: 70 s without, 55 s with).
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/svcframe" "$ROOT/selftest" "$ROOT/providers" "$ROOT/tools" >/dev/null
export PATH="$VENV/bin:$PATH"
export MPLBACKEND=Agg
