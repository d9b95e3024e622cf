#!/usr/bin/env bash
# The compiled modules built with AddressSanitizer and UndefinedBehaviorSanitizer, and tests run against them.
#   bash tools/sanitize.sh [PYTEST ARGS...]   build, then test (default: the differential tests, the engine,
#                                             wire, protocol, bulk and hostile-peer tests)
#   bash tools/sanitize.sh build DIR          the build alone, in DIR (CI builds while other tests run)
#   bash tools/sanitize.sh test DIR [ARGS...] the tests alone, against DIR's build
# The repository's tracked files are copied to a directory and built there (the checkout's own modules are left
# as they are), with the venv of tools/env.sh. A memory error or undefined behaviour ends the run with the
# sanitizer's report (halt_on_error); leaks are not checked (the interpreter keeps memory at exit).
# PYTHONMALLOC=malloc lets ASan see every Python allocation; SVCFRAME_SANITIZERS=1 skips the tests that bound a
# process's RSS (ASan's shadow memory is in it). Also run in CI (.ci/run).
set -euo pipefail
source "$(dirname "$0")/env.sh"
CC_=$(python -c 'import shlex, sysconfig; print(shlex.split(sysconfig.get_config_var("CC") or "cc")[0])')
libasan=$("$CC_" -print-file-name=libasan.so)
libubsan=$("$CC_" -print-file-name=libubsan.so)
if [ ! -e "$libasan" ] || [ ! -e "$libubsan" ]; then
  echo "sanitize: $CC_ has no libasan/libubsan (Debian: apt-get install gcc)" >&2
  exit 1
fi

build() {  # build DIR: the tracked files copied to DIR, the compiled modules built there with the sanitizers
  local dir=$1
  mkdir -p "$dir"
  (cd "$ROOT" && git ls-files -z | xargs -0 cp --parents -t "$dir")
  echo "sanitize: building the compiled modules with -fsanitize=address,undefined in $dir"
  (cd "$dir" && CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g" \
    LDFLAGS="-fsanitize=address,undefined" SVCFRAME_PURE_BUILD=0 \
    python setup.py -q build_ext --inplace -j "$(nproc 2>/dev/null || echo 2)" >build.log 2>&1) \
    || { tail -40 "$dir/build.log" >&2; return 1; }
}

run_tests() {  # run_tests DIR [PYTEST ARGS...]: the tests in DIR against its build, the sanitizers preloaded
  local dir=$1
  shift
  cd "$dir"
  run() {
    SVCFRAME_SANITIZERS=1 PYTHONPATH="$dir" PYTHONMALLOC=malloc LD_PRELOAD="$libasan:$libubsan" \
      ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:exitcode=86 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87 "$@"
  }
  run python -c '
import svcframe.compiled as c
state = c.compiled_modules()
assert all(state.values()), f"not compiled: {[m for m, ok in state.items() if not ok]}"
print(f"sanitize: {len(state)} modules compiled with the sanitizers")'
  [ $# -gt 0 ] || set -- tests/test_compiled.py tests/test_wire.py tests/test_protocol.py tests/test_engine.py \
    tests/test_hostile_memory.py tests/test_hostile_bulk.py tests/test_bulk.py tests/test_into.py
  run python -m pytest -q -p no:cacheprovider -m "not one_interpreter" "$@"
}

case "${1:-}" in
  build)
    [ $# = 2 ] || { echo "usage: $0 build DIR" >&2; exit 2; }
    build "$2"
    ;;
  test)
    [ $# -ge 2 ] || { echo "usage: $0 test DIR [PYTEST ARGS...]" >&2; exit 2; }
    dir=$2
    shift 2
    run_tests "$dir" "$@"
    ;;
  *)
    dir=$(mktemp -d /tmp/svcframe-sanitize.XXXXXX)
    trap 'rm -rf "$dir"' EXIT
    build "$dir"
    run_tests "$dir" "$@"
    ;;
esac
