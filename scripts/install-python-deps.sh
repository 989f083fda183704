#!/usr/bin/env bash
# Install the project (editable) with its test and Spark extras into the given venv bin dir.
# python-qpid-proton is rebuilt when the installed one was built without Cyrus SASL.
set -euo pipefail
BIN="$1"
stamp="$BIN/../.deps-stamp"
# up to date unless the project's metadata or the C extension's source changed since
ext=src/amqp_policy_proxy/amqp/_relayscan.c
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt setup.py ] && \
   [ "$stamp" -nt "$ext" ]; then
    exit 0
fi
if "$BIN/python" -c 'import proton' 2>/dev/null && \
   ! "$BIN/python" -c 'import proton, sys; sys.exit(0 if proton.SASL.extended() else 1)'; then
    echo "python-qpid-proton lacks Cyrus SASL support: rebuilding it"
    "$BIN/pip" uninstall -q -y python-qpid-proton
    "$BIN/pip" install -q --no-cache-dir --no-binary python-qpid-proton python-qpid-proton
fi
# also builds the C extension (setup.py): optional, unless AMQP_PROXY_REQUIRE_ACCEL is set
"$BIN/pip" install -q -e ".[test,spark]"
if ! "$BIN/python" -c 'import amqp_policy_proxy.amqp._relayscan' 2>/dev/null; then
    if [ -n "${AMQP_PROXY_REQUIRE_ACCEL:-}" ] && [ "${AMQP_PROXY_REQUIRE_ACCEL}" != 0 ]; then
        echo "error: AMQP_PROXY_REQUIRE_ACCEL is set and the C relay scanner" \
             "(amqp_policy_proxy.amqp._relayscan) does not import:" >&2
        "$BIN/python" -c 'import amqp_policy_proxy.amqp._relayscan' >&2 || true
        exit 1
    fi
    echo "note: the C relay scanner was not built (no C compiler or Python headers?);" \
         "the proxy runs its pure-Python relay loop" >&2
fi
touch "$stamp"
