#!/usr/bin/env bash
# The wheel on its own: build the wheel and the sdist of this checkout, install the WHEEL into a fresh
# venv in a temporary directory and, from there (the checkout is nowhere on sys.path), run what a user would:
# --version, the config tools with the libraries' repository names, launch from the shipped self-test config,
# a short self-test, then with the plot extra a short roofline collect. Says each step; exits non-zero at the
# first failure (the servers' logs are printed). About 30-40 s, most of it pip installing the dependencies.
#   PYTHON  the interpreter of the fresh venv (default python3)
#   BUILD   the Python that has `build` (default: the checkout's .venv, which tools/env.sh sets up)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
BUILD="${BUILD:-$ROOT/.venv/bin/python}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/svcframe-wheel.XXXXXX")"
LAUNCH_PID=""
cleanup() {
  if [ -n "$LAUNCH_PID" ] && kill -0 "$LAUNCH_PID" 2>/dev/null; then
    kill -TERM "$LAUNCH_PID" 2>/dev/null || true
    wait "$LAUNCH_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
START=$EPOCHREALTIME
step() { awk -v t0="$START" -v t1="$EPOCHREALTIME" -v what="$*" 'BEGIN { printf "wheel smoke: [%5.1f s] %s\n", t1 - t0, what }'; }

step "build the sdist, then the wheel from it"
"$BUILD" -m build --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
WHEEL="$(ls "$WORK"/dist/svcframe-*.whl)"
ls "$WORK"/dist/svcframe-*.tar.gz >/dev/null
"$BUILD" -c 'import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(not any(n.startswith("svcframe/decoder.cpython") and n.endswith(".so") for n in names))' "$WHEEL" \
  || { echo "wheel smoke: $(basename "$WHEEL") holds no compiled modules"; exit 1; }

step "auditwheel show: the manylinux tag the wheel's compiled modules allow (cibuildwheel repairs to it)"
"$BUILD" -m pip install -q --disable-pip-version-check "auditwheel>=6" 2>&1 | grep -v "^WARNING: Location" || true
"$BUILD" -m auditwheel show "$WHEEL" | tr -s ' \n' ' ' | fold -s -w 100 | sed 's/^/  /'
echo

step "install $(basename "$WHEEL") into a fresh venv ($("$PY" --version))"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check "$WHEEL" 2>&1 | grep -v "^WARNING: Location" || true
"$WORK/venv/bin/python" -c 'import svcframe' # the install above is judged here, not by pip's warnings
cd "$WORK"
export PATH="$WORK/venv/bin:$PATH"
unset PYTHONPATH
SVCFRAME_SECRET="$(python -c 'import secrets; print(secrets.token_hex(16))')"
export SVCFRAME_SECRET

step "installed names: svcframe, svcframe_providers, svcframe_selftest; no 'providers' nor 'selftest'"
python - <<'EOF'
import importlib.util, sys
from pathlib import Path
import svcframe, svcframe_providers, svcframe_selftest
site = Path(svcframe.__file__).parent.parent
assert "site-packages" in str(site), site
taken = [n for n in ("providers", "selftest") if importlib.util.find_spec(n) is not None]
assert not taken, f"the wheel installed {taken}"
assert (site / "svcframe" / "py.typed").is_file()
assert (site / "svcframe_selftest" / "selftest.json").is_file()
# the hot paths are compiled in the wheel wherever the build found a compiler (setup.py)
import shlex, shutil, sysconfig
from svcframe import compiled
built = compiled.build()
assert built == "compiled" or not shutil.which(shlex.split(sysconfig.get_config_var("CC") or "cc")[0]), built
print("  hot paths:", built)
EOF
svcframe --version

step "config check: libraries by their repository names (providers.kv, selftest.provider)"
cat >kv.json <<'EOF'
{"libraries": ["providers.kv", "selftest.provider"],
 "providers": [{"name": "store", "type": "kv", "provider_id": 1, "config": {"path": "kv.sqlite"}},
               {"name": "selftest", "type": "selftest", "provider_id": 2}]}
EOF
svcframe config check kv.json >/dev/null
svcframe config schema | python -c 'import json, sys; d = json.load(sys.stdin)["$defs"]; assert {"KvProviderSpec", "BlobProviderSpec", "SelftestProviderSpec"} <= set(d), list(d)'

step "launch from the shipped config: $(svcframe selftest config)"
svcframe launch "$(svcframe selftest config)" --procs 1 --group-file group.json 2>launch.log &
LAUNCH_PID=$!
for _ in $(seq 300); do  # the group file appears once every server is ready (at most 30 s)
  [ -s group.json ] && break
  kill -0 "$LAUNCH_PID" 2>/dev/null || { cat launch.log; exit 1; }
  sleep 0.1
done
[ -s group.json ] || { cat launch.log; echo "no group file after 30 s" >&2; exit 1; }
svcframe status -g group.json >/dev/null

step "a short self-test"
svcframe selftest run -g group.json --clients 1 --duration-seconds 0.5 -o noop.json >/dev/null
python -c 'import json; a = json.load(open("noop.json"))["aggregate"]; assert a["ops"] > 0, a; print("  calls:", a["ops"])'
svcframe shutdown -g group.json >/dev/null
wait "$LAUNCH_PID" || { cat launch.log; exit 1; }
LAUNCH_PID=""

step "a short roofline collect (with the plot extra)"
python -m pip install -q --no-compile --disable-pip-version-check "$WHEEL[plot]" 2>&1 | grep -v "^WARNING: Location" || true
svcframe roofline collect -o roofline --metric rpc_rate --duration-seconds 0.2 --repeats 1 --grid-servers 1 \
  --grid-clients 1 --sweep-max-servers 0 --store results.sqlite >collect.log 2>&1 || { cat collect.log; exit 1; }
test -s roofline/roofline.json && test -s roofline/rpc_rate.png
step "ok"
