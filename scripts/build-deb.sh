#!/usr/bin/env bash
# Build the Debian package (dh-virtualenv) from an sdist: `make deb` runs it on dist/'s sdist.
#
#   scripts/build-deb.sh SDIST [OUTDIR [WORKDIR]]
#
# The sdist is unpacked into WORKDIR (default build/deb, emptied first) and built there with
# `dpkg-buildpackage -b`; the .deb is copied to OUTDIR (default: the sdist's directory) and
# its path printed last. Building from the sdist checks that the sdist carries what the
# package installs (debian/, systemd/, examples/etc/, docs/).
#
# The build is hermetic: pip inside it starts from an empty cache of its own (in WORKDIR), so
# no wheel built earlier by another interpreter (a pyenv Python's python-qpid-proton, with a
# RUNPATH into that interpreter's home) ends up in the package: binary wheels come from the
# registry or are built here by the packaged interpreter. Set DEB_PIP_CACHE_DIR to reuse a
# cache made by this same build (the packaging test does not). Build dependencies (dh-virtualenv,
# debhelper, libsasl2-dev, ...) come from scripts/install-system-deps.sh; dpkg-buildpackage
# names any that are missing.
set -euo pipefail

sdist=$(realpath "${1:?usage: build-deb.sh SDIST [OUTDIR [WORKDIR]]}")
outdir=$(realpath -m "${2:-$(dirname "$sdist")}")
workdir=$(realpath -m "${3:-build/deb}")

name=$(basename "$sdist" .tar.gz)           # amqp_policy_proxy-0.1.0
version=${name##*-}
rm -rf "$workdir"
mkdir -p "$workdir" "$outdir"
tar -xzf "$sdist" -C "$workdir"
src="$workdir/$name"
[ -d "$src/debian" ] || { echo "error: $sdist has no debian/ directory (MANIFEST.in)" >&2; exit 2; }

# debian/changelog's upstream version must be the project's version
deb_version=$(cd "$src" && dpkg-parsechangelog -S Version)
if [ "${deb_version%-*}" != "$version" ]; then
    echo "error: debian/changelog is at $deb_version but the project is $version:" \
         "add a changelog entry (dch -v $version-1)" >&2
    exit 2
fi

export PIP_CACHE_DIR="${DEB_PIP_CACHE_DIR:-$workdir/pip-cache}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
(cd "$src" && dpkg-buildpackage -b -us -uc) > "$workdir/build.log" 2>&1 || {
    tail -n 60 "$workdir/build.log" >&2
    echo "error: dpkg-buildpackage failed; full log: $workdir/build.log" >&2
    exit 1
}
arch=$(dpkg --print-architecture)
deb="amqp-policy-proxy_${deb_version}_${arch}.deb"
cp "$workdir/$deb" "$outdir/"
echo "$outdir/$deb"
