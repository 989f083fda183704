#!/usr/bin/env sh
# Sign a DDS Security permissions document with the permissions CA, the way DDS tools do:
# an S/MIME (multipart/signed) message, content prefixed with "Content-Type: text/plain".
#
#   examples/dds/sign.sh CA_CERT CA_KEY [IN.xml] [OUT.p7s]
#
# IN defaults to permissions.xml beside this script, OUT to IN with .p7s. Then checks the
# result exactly as the proxy will (only CA_CERT trusted) and prints the grants it found.
# Keep CA_KEY off the proxy host: the proxy only needs CA_CERT (permissionsCa) and OUT
# (permissionsDocument).
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 CA_CERT CA_KEY [IN.xml] [OUT.p7s]" >&2
    exit 2
fi
ca_cert=$1
ca_key=$2
in=${3:-$(dirname "$0")/permissions.xml}
out=${4:-${in%.xml}.p7s}

openssl smime -sign -text -in "$in" -signer "$ca_cert" -inkey "$ca_key" -out "$out"
openssl smime -verify -in "$out" -CAfile "$ca_cert" -no-CApath -no-CAstore \
    -partial_chain -purpose any >/dev/null
echo "signed: $out"
grep -o '<grant name="[^"]*"' "$out" | sed 's/<grant name=/  grant /'
