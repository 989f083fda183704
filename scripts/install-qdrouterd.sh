#!/usr/bin/env bash
# Build (once) the real qdrouterd 1.19.0 the test suite runs behind the proxy, into a cache
# directory, from the checksummed release sources of the project's shared material.
#
#   prefix:  $AMQP_PROXY_QDR_PREFIX, default ~/.cache/amqp-policy-proxy/qdr-1.19.0
#   sources: the build recipe tools/build-qdrouterd.sh and vendor/ of the shared material,
#            found in $AMQP_PROXY_SHARED, ../shared beside the checkout, or /work/shared
#   result:  $prefix/qdr-env.sh (QDR_HOME, QDR_PYTHONPATH, QDR_LD_LIBRARY_PATH) which
#            tests/support/qdrouterd.py reads
#
# Without the sources the real-router tests are skipped (one line says why), unless
# AMQP_PROXY_REQUIRE_QDR=1 (set by .ci/run): then a missing router is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${AMQP_PROXY_QDR_PREFIX:-$HOME/.cache/amqp-policy-proxy/qdr-1.19.0}
if [ -f "$prefix/qdr-env.sh" ] && [ -x "$prefix/qdr/sbin/qdrouterd" ]; then
    exit 0
fi
recipe=""
for dir in "${AMQP_PROXY_SHARED:-}" "$PWD/../shared" /work/shared; do
    if [ -n "$dir" ] && [ -f "$dir/tools/build-qdrouterd.sh" ] && [ -d "$dir/vendor" ]; then
        recipe="$dir/tools/build-qdrouterd.sh"
        break
    fi
done
if [ -z "$recipe" ]; then
    msg="qdrouterd sources not found (no ../shared/tools/build-qdrouterd.sh): the real-router tests will be skipped"
    if [ "${AMQP_PROXY_REQUIRE_QDR:-0}" = 1 ]; then
        echo "error: $msg, and AMQP_PROXY_REQUIRE_QDR=1" >&2
        exit 1
    fi
    echo "note: $msg" >&2
    exit 0
fi
echo "building qdrouterd 1.19.0 under $prefix (about a minute, once)"
mkdir -p "$prefix"
log="$prefix/build.log"
# the recipe writes helper files into its working directory: keep them out of the checkout
if ! (cd "$prefix" && QDR_PREFIX="$prefix" bash "$recipe") >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "error: building qdrouterd failed (full log: $log)" >&2
    exit 1
fi
