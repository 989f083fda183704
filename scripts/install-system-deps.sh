#!/usr/bin/env bash
# Install the Debian packages the project needs, only when something is missing.
set -euo pipefail
need=()
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
[ -e /usr/include/sasl/sasl.h ] || need+=(libsasl2-dev)
command -v saslpasswd2 >/dev/null || need+=(sasl2-bin)
[ -e /usr/lib/x86_64-linux-gnu/sasl2/libplain.so ] || [ -n "$(ls /usr/lib/*/sasl2/libplain.so 2>/dev/null)" ] || need+=(libsasl2-modules)
command -v rabbitmq-server >/dev/null || [ -x /usr/sbin/rabbitmq-server ] || need+=(rabbitmq-server)
# the fleet ledger's store (ledger = "auto" runs it; tests start their own)
command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ] || need+=(redis-server)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v openssl >/dev/null || need+=(openssl)
# the capacity report's page is checked in headless Chromium (tests/spark/test_trends_report.py)
command -v chromium >/dev/null || [ -x /usr/bin/chromium ] || need+=(chromium)
# `make deb` (and the packaging test): dh-virtualenv with debhelper builds the package from
# the sdist; python-qpid-proton is compiled in it against Cyrus SASL and OpenSSL
# (libsasl2-dev above, libssl-dev); adduser runs in its postinst; lintian checks the .deb.
# bench/realrouter.py builds its C load client (bench/loadgen/amqpload.c) against proton-c.
installed libqpid-proton11-dev || need+=(libqpid-proton11-dev)
for pkg in dh-virtualenv debhelper dpkg-dev build-essential python3-dev python3-venv \
           libssl-dev pkg-config adduser lintian; do
    installed "$pkg" || need+=("$pkg")
done
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
echo "installing Debian packages: ${need[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
# Another apt-get (unattended-upgrades, a second terminal) may hold the dpkg or lists lock:
# wait for it, at most APT_LOCK_WAIT seconds (default 300), instead of failing at once.
wait_s=${APT_LOCK_WAIT:-300}
lock=(-o "DPkg::Lock::Timeout=$wait_s")
deadline=$((SECONDS + wait_s))
until $SUDO apt-get "${lock[@]}" update -qq; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "apt-get update failed (another apt holds its lock for more than ${wait_s}s?)" >&2
        exit 1
    fi
    echo "apt-get update failed; trying again in ${APT_RETRY_SLEEP:-5} s (another apt may hold its lock)" >&2
    sleep "${APT_RETRY_SLEEP:-5}"
done
DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${lock[@]}" install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
