#!/usr/bin/env bash
# Runs a Kafka-protocol broker on 127.0.0.1 for the broker tests and local trials: the static binary
# shipped in the PyPI wheel noida-db==0.2.3 (MIT), installed into Lacuna's venv. Production uses any
# Kafka-protocol cluster (Apache Kafka, Redpanda); this one only serves tests and demos.
#
# Usage: scripts/broker.sh start|stop|status [--port N]
#   start   starts the broker with a fresh data directory and waits for its port
#   stop    TERM by PID (it can take tens of seconds), then KILL; deletes the data directory
#   status  exit 0 when the broker's port answers
#
# Environment: LACUNA_CACHE [~/.cache/lacuna], LACUNA_BROKER_PORT [19092].
set -euo pipefail

CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
PORT="${LACUNA_BROKER_PORT:-19092}"
NOIDA_VERSION=0.2.3
CMD="${1:-}"; shift || true
while [ $# -gt 0 ]; do
    case "$1" in
        --port) PORT=$2; shift 2 ;;
        *) echo "broker: unknown argument $1" >&2; exit 2 ;;
    esac
done
RUN="$CACHE/run"
PIDFILE="$RUN/broker-$PORT.pid"
DATAFILE="$RUN/broker-$PORT.data"
LOG="$RUN/broker-$PORT.log"
mkdir -p "$RUN"

log() { echo "broker: $*" >&2; }

binary() {
    local venv="$CACHE/venv"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    local bin
    bin=$("$venv/bin/python" -c 'import noida_db, os; print(os.path.join(os.path.dirname(noida_db.__file__), "noida-db"))' 2>/dev/null || true)
    if [ -z "$bin" ] || [ ! -x "$bin" ]; then
        log "installing noida-db==$NOIDA_VERSION"
        "$venv/bin/pip" install -q --disable-pip-version-check "noida-db==$NOIDA_VERSION" >&2
        bin=$("$venv/bin/python" -c 'import noida_db, os; print(os.path.join(os.path.dirname(noida_db.__file__), "noida-db"))')
    fi
    echo "$bin"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

running_pid() {
    [ -f "$PIDFILE" ] || return 1
    local pid; pid=$(cat "$PIDFILE")
    kill -0 "$pid" 2>/dev/null && grep -q noida-db "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

case "$CMD" in
    start)
        if pid=$(running_pid) && port_open; then log "already running: pid $pid, 127.0.0.1:$PORT"; exit 0; fi
        port_open && { log "port $PORT is taken by another process"; exit 1; }
        bin=$(binary)
        # A fresh data directory per start: the broker rewrites its whole state to one file that grows.
        data=$(mktemp -d "${TMPDIR:-/tmp}/lacuna-broker.XXXXXX")
        echo "$data" > "$DATAFILE"
        nohup "$bin" start --data-dir "$data" --only kafka --kafka-port "$PORT" --host 127.0.0.1 > "$LOG" 2>&1 < /dev/null &
        echo $! > "$PIDFILE"
        for _ in $(seq 1 120); do
            port_open && { log "running: pid $(cat "$PIDFILE"), 127.0.0.1:$PORT"; exit 0; }
            kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { tail -20 "$LOG" >&2; log "failed to start"; exit 1; }
            sleep 0.5
        done
        log "port $PORT did not open in 60 s"; tail -20 "$LOG" >&2; exit 1 ;;
    stop)
        if pid=$(running_pid); then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
            kill -KILL "$pid" 2>/dev/null || true
            log "stopped pid $pid"
        fi
        [ -f "$DATAFILE" ] && rm -rf "$(cat "$DATAFILE")"
        rm -f "$PIDFILE" "$DATAFILE" ;;
    status) running_pid > /dev/null && port_open ;;
    *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
