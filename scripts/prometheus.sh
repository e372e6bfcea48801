#!/usr/bin/env bash
# Debian's Prometheus server and promtool (2.42, Apache-2.0) for the dashboard and alerting-rule tests
# (tests/prometheus.rs): the .deb is fetched with `apt-get download` from the machine's Debian mirror,
# checked against its sha256 and unpacked under $LACUNA_CACHE. No root, no service, nothing started:
# the tests start their own servers on 127.0.0.1. Safe to run again.
#
# Usage: eval "$(scripts/prometheus.sh --env)"   (exports LACUNA_PROMETHEUS, the folder of both binaries)
set -euo pipefail

CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
VERSION=2.42.0+ds-5+deb12u1
SHA256=81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55
DIR="$CACHE/prometheus-$VERSION"

log() { echo "prometheus: $*" >&2; }

if [ ! -x "$DIR/usr/bin/promtool" ]; then
    command -v apt-get > /dev/null || { log "apt-get not found: install Debian's prometheus $VERSION by hand"; exit 1; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    log "downloading prometheus=$VERSION"
    # -o APT::Sandbox::User=root: _apt cannot write into a private temporary folder.
    (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "prometheus=$VERSION" >&2) ||
        { log "apt-get download failed (is the Debian mirror reachable? try apt-get update)"; exit 1; }
    deb=$(ls "$tmp"/prometheus_*.deb)
    echo "$SHA256  $deb" | sha256sum -c --quiet - || { log "$deb: sha256 mismatch"; exit 1; }
    rm -rf "$DIR.partial"
    dpkg-deb -x "$deb" "$DIR.partial"
    rm -rf "$DIR"
    mv "$DIR.partial" "$DIR"
fi
"$DIR/usr/bin/promtool" --version > /dev/null

case "${1:-}" in
    --env) echo "export LACUNA_PROMETHEUS=\"$DIR/usr/bin\"" ;;
    *) echo "$DIR/usr/bin" ;;
esac
