#!/usr/bin/env bash
# Arize Phoenix (https://arize.com/docs/phoenix), a real OpenTelemetry backend: it receives OTLP over
# HTTP (/v1/traces on its web port) and gRPC, keeps spans in SQLite, and serves a web UI and an HTTP
# API that returns them. The trace tests (tests/traces.rs) and the screenshot in docs/operations.md
# run against it. Installed, pinned, into its own venv under the cache and reused; bound to 127.0.0.1;
# stopped by PID.
#
# Usage:
#   scripts/phoenix.sh install                 the venv only (idempotent)
#   scripts/phoenix.sh start [--port P] [--grpc-port G] [--dir D]
#                                              installs if needed, starts in the background, waits
#                                              until it answers; prints its base URL
#   scripts/phoenix.sh stop [--port P]         stops the one started on that port
#
# Environment (defaults in brackets):
#   LACUNA_CACHE   cache root [~/.cache/lacuna]; the venv is phoenix-venv there, each server's state
#                  and log phoenix-run/<port>
#   PYTHON         the Python that makes the venv [python3]
set -euo pipefail

PHOENIX_VERSION=20.26.1
CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
PYTHON="${PYTHON:-python3}"
VENV="$CACHE/phoenix-venv"

log() { echo "phoenix: $*" >&2; }
die() { echo "phoenix: ERROR: $*" >&2; exit 1; }

install() {
    mkdir -p "$CACHE"
    # The lock is held for the install only: a Phoenix started later must not inherit it (the next
    # start would wait for that server to stop).
    exec 9> "$CACHE/.phoenix.lock"
    flock 9
    install_locked
    exec 9>&-
}

install_locked() {
    if [ "$(cat "$VENV/.lacuna-version" 2> /dev/null)" = "$PHOENIX_VERSION" ] && [ -x "$VENV/bin/phoenix" ]; then
        return
    fi
    local t0=$SECONDS
    log "installing arize-phoenix $PHOENIX_VERSION into $VENV (wheels only)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >&2 || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: "arize-phoenix==$PHOENIX_VERSION" >&2 ||
        die "pip install arize-phoenix==$PHOENIX_VERSION failed"
    echo "$PHOENIX_VERSION" > "$VENV/.lacuna-version"
    log "installed in $((SECONDS - t0)) s"
}

PORT=16006
GRPC_PORT=
DIR=
parse() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --port) PORT="$2"; shift 2 ;;
            --grpc-port) GRPC_PORT="$2"; shift 2 ;;
            --dir) DIR="$2"; shift 2 ;;
            *) die "unknown option $1" ;;
        esac
    done
    GRPC_PORT="${GRPC_PORT:-$((PORT + 1))}"
    DIR="${DIR:-$CACHE/phoenix-run/$PORT}"
}

start() {
    install
    local pidfile="$DIR/phoenix.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2> /dev/null; then
        die "a Phoenix is already running on port $PORT (pid $(cat "$pidfile")); stop it first"
    fi
    mkdir -p "$DIR"
    # Its own SQLite file per start: a test reads only the spans of its own run.
    rm -f "$DIR"/phoenix.db*
    (
        export PHOENIX_WORKING_DIR="$DIR" PHOENIX_HOST=127.0.0.1 PHOENIX_PORT="$PORT" \
            PHOENIX_GRPC_PORT="$GRPC_PORT" PHOENIX_SQL_DATABASE_URL="sqlite:///$DIR/phoenix.db" \
            PHOENIX_TELEMETRY_ENABLED=false DO_NOT_TRACK=1
        exec "$VENV/bin/phoenix" serve > "$DIR/phoenix.log" 2>&1
    ) &
    echo $! > "$pidfile"
    local deadline=$((SECONDS + 120))
    until curl -sf "http://127.0.0.1:$PORT/healthz" > /dev/null 2>&1; do
        kill -0 "$(cat "$pidfile")" 2> /dev/null || { tail -30 "$DIR/phoenix.log" >&2; die "Phoenix exited; log above"; }
        [ $SECONDS -lt $deadline ] || { tail -30 "$DIR/phoenix.log" >&2; die "Phoenix did not answer in 120 s"; }
        sleep 1
    done
    log "up on http://127.0.0.1:$PORT (OTLP HTTP /v1/traces; gRPC on $GRPC_PORT), pid $(cat "$pidfile")"
    echo "http://127.0.0.1:$PORT"
}

stop() {
    local pidfile="$DIR/phoenix.pid"
    [ -f "$pidfile" ] || return 0
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2> /dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2> /dev/null || true
    rm -f "$pidfile"
}

command="${1:-}"
[ $# -gt 0 ] && shift
case "$command" in
    install) install ;;
    start) parse "$@"; start ;;
    stop) parse "$@"; stop ;;
    *) die "usage: scripts/phoenix.sh install | start [--port P] [--grpc-port G] [--dir D] | stop [--port P]" ;;
esac
