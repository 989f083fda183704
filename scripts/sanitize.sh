#!/usr/bin/env bash
# make sanitize: the C accelerator (amqp/_relayscan.c) built with AddressSanitizer and
# UndefinedBehaviorSanitizer, installed with a copy of the package in build/sanitize/, then the
# accelerator, amqp, core and property tests run against that build (slow tests included: the
# random-byte runs are what the sanitizers are for). Any finding aborts the test process.
# Usage: scripts/sanitize.sh VENV_BIN [pytest arguments...]
set -euo pipefail
BIN="$1"
shift
out=build/sanitize
rm -rf "$out"
# setup.py adds -Wall -Wextra -Werror; -Wconversion is clean too, keep it so. pip builds in
# its isolated environment (pyproject's setuptools) and installs a copy of the package in $out.
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
CFLAGS="$san -g -O1 -Wconversion" LDFLAGS="$san" AMQP_PROXY_REQUIRE_ACCEL=1 \
    "$BIN/pip" install -q --no-deps --no-compile --target "$out" . 2>&1 |
    { grep -v '^WARNING: Location' || true; }
asan=$(${CC:-cc} -print-file-name=libasan.so)
[ -f "$asan" ] || { echo "error: libasan.so not found (gcc's ASan runtime)" >&2; exit 1; }
export PYTHONPATH="$PWD/$out${PYTHONPATH:+:$PYTHONPATH}"
export LD_PRELOAD="$asan"
# CPython frees little at exit: leak reports would be its, not ours
# every object through malloc, so ASan sees the bounds of small buffers too (not pymalloc arenas)
export PYTHONMALLOC=malloc
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export AMQP_PROXY_REQUIRE_ACCEL=1
export HYPOTHESIS_PROFILE=sanitize  # no deadlines (tests/conftest.py)
"$BIN/python" - "$PWD/$out" <<'PY'
import sys
import amqp_policy_proxy.amqp._relayscan as m
if not m.__file__.startswith(sys.argv[1]):
    sys.exit(f"error: imported {m.__file__}, not the sanitized build in {sys.argv[1]}")
print("sanitized build:", m.__file__)
PY
exec "$BIN/python" -m pytest -p no:cacheprovider tests/unit/amqp tests/unit/core tests/property "$@"
