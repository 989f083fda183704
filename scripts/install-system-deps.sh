#!/usr/bin/env bash
# Install the Debian packages the project needs, only when something is missing.
set -euo pipefail
need=()
[ -e /usr/include/sasl/sasl.h ] || need+=(libsasl2-dev)
command -v saslpasswd2 >/dev/null || need+=(sasl2-bin)
[ -e /usr/lib/x86_64-linux-gnu/sasl2/libplain.so ] || [ -n "$(ls /usr/lib/*/sasl2/libplain.so 2>/dev/null)" ] || need+=(libsasl2-modules)
command -v rabbitmq-server >/dev/null || [ -x /usr/sbin/rabbitmq-server ] || need+=(rabbitmq-server)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
echo "installing Debian packages: ${need[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
