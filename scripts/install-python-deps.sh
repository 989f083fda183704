#!/usr/bin/env bash
# Install the project (editable) with its test and Spark extras into the given venv bin dir.
# python-qpid-proton is rebuilt when the installed one was built without Cyrus SASL.
set -euo pipefail
BIN="$1"
stamp="$BIN/../.deps-stamp"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
    exit 0
fi
if "$BIN/python" -c 'import proton' 2>/dev/null && \
   ! "$BIN/python" -c 'import proton, sys; sys.exit(0 if proton.SASL.extended() else 1)'; then
    echo "python-qpid-proton lacks Cyrus SASL support: rebuilding it"
    "$BIN/pip" uninstall -q -y python-qpid-proton
    "$BIN/pip" install -q --no-cache-dir --no-binary python-qpid-proton python-qpid-proton
fi
"$BIN/pip" install -q -e ".[test,spark]"
touch "$stamp"
