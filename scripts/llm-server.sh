#!/usr/bin/env bash
# Runs a local OpenAI-compatible LLM server (llama.cpp's server, embedded in
# the xllamacpp Python package installed by scripts/setup.sh) on 127.0.0.1.
#
# Usage: scripts/llm-server.sh start|stop|status [--model PATH] [--port N]
#
#   start   start the server in the background and wait until it answers
#           GET /health with 200; does nothing when it already runs healthy
#   stop    TERM, wait, TERM again, then KILL the server by its recorded PID
#   status  exit 0 when the server runs and is healthy, 1 otherwise
#
# The model defaults to $LACUNA_MODEL_PATH, else to what scripts/setup.sh
# installs for $LACUNA_MODEL. Endpoints: /v1/chat/completions (with
# response_format json_schema, logprobs, usage), /v1/models, /health, /metrics.
#
# Environment (defaults in brackets):
#   LACUNA_CACHE              cache root [~/.cache/lacuna]; pid and log files
#                             live in $LACUNA_CACHE/run/llm-server-<port>.*
#   LACUNA_LLM_PORT           [8377]
#   LACUNA_LLM_THREADS        CPU threads for generation and prompt [2]
#   LACUNA_LLM_CTX            total context, split evenly across slots [16384]
#   LACUNA_LLM_PARALLEL       parallel request slots [2]
#   LACUNA_LLM_START_TIMEOUT  seconds to wait for /health [180]
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
RUN="$CACHE/run"
VENV_PY="$CACHE/venv/bin/python"
HOST=127.0.0.1
PORT="${LACUNA_LLM_PORT:-8377}"
THREADS="${LACUNA_LLM_THREADS:-2}"
# 16384 over 2 slots gives each request 8192 tokens: room for a ~4k-token
# prompt plus the answer. Each slot's KV cache is allocated up front; for the
# 1.5B model that is ~28 KiB per token, ~450 MiB in all.
CTX="${LACUNA_LLM_CTX:-16384}"
PARALLEL="${LACUNA_LLM_PARALLEL:-2}"
START_TIMEOUT="${LACUNA_LLM_START_TIMEOUT:-180}"
MODEL=""

log() { echo "llm-server: $*" >&2; }
die() { echo "llm-server: ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 1 ] || usage
CMD=$1; shift
while [ $# -gt 0 ]; do
    case "$1" in
        --model) [ $# -ge 2 ] || usage; MODEL=$2; shift 2 ;;
        --model=*) MODEL=${1#*=}; shift ;;
        --port) [ $# -ge 2 ] || usage; PORT=$2; shift 2 ;;
        --port=*) PORT=${1#*=}; shift ;;
        -h|--help) usage ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done
[[ "$PORT" =~ ^[0-9]+$ ]] || die "bad port: $PORT"
MODEL=${MODEL:-${LACUNA_MODEL_PATH:-}}
# Canonical path, so "is the running server using this model?" compares equal.
[ -n "$MODEL" ] && [ -e "$MODEL" ] && MODEL=$(readlink -f "$MODEL")

# Per-port files, so a test server on another port can run beside a dev one.
PIDFILE="$RUN/llm-server-$PORT.pid"
LOGFILE="$RUN/llm-server-$PORT.log"
MODELFILE="$RUN/llm-server-$PORT.model"
LAUNCHER="$RUN/xllamacpp-server.py"
URL="http://$HOST:$PORT"

healthy() { curl -fsS -o /dev/null --max-time 2 "$URL/health" 2>/dev/null; }

# Anything (even an error page) answering on the port means it is taken.
port_answers() { curl -sS -o /dev/null --max-time 2 "$URL/health" 2>/dev/null; }

# The recorded PID, only if that process is still our launcher: PIDs get
# reused, and stop must never signal an unrelated process.
our_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid=$(cat "$PIDFILE")
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF "$LAUNCHER" || return 1
    echo "$pid"
}

# xllamacpp has no CLI: its Server object starts llama.cpp's HTTP server in
# background threads and returns once the model is loaded. This keeps the
# object alive until SIGTERM/SIGINT.
write_launcher() {
    mkdir -p "$RUN"
    cat > "$LAUNCHER.$$" <<'PY'
import os, signal, sys, threading

import xllamacpp as xlc

model, host, port, ctx, parallel, threads, alias = sys.argv[1:8]

# Own session: the server outlives the shell (and terminal) that started it.
try:
    os.setsid()
except OSError:
    pass

p = xlc.CommonParams()
p.model.path = model
p.model_alias = {alias}
p.hostnames = [host]
p.port = int(port)
p.n_ctx = int(ctx)
p.n_parallel = int(parallel)
p.cpuparams.n_threads = int(threads)
p.cpuparams_batch.n_threads = int(threads)
p.endpoint_metrics = True
p.ui = False

try:
    server = xlc.Server(p)
except Exception as e:
    print(f"xllamacpp-server: failed to start: {e}", file=sys.stderr, flush=True)
    sys.exit(1)

# llama.cpp installs its own SIGTERM/SIGINT handler, which only ends the
# inference loop and would leave this process idle but alive. Take the
# signals back so that a signal really ends the process.
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())
print(f"xllamacpp-server: serving {model} at {server.listening_address}", file=sys.stderr, flush=True)
while not stop.wait(1.0):
    pass
# Exit without destroying the Server: its destructor waits for in-flight
# requests and was seen to hang until SIGKILL. There is nothing to flush (the
# model is mmapped read-only), so a hard exit loses nothing.
print("xllamacpp-server: shutting down", file=sys.stderr, flush=True)
os._exit(0)
PY
    mv "$LAUNCHER.$$" "$LAUNCHER"
}

wait_healthy() {
    local pid=$1 deadline=$((SECONDS + START_TIMEOUT))
    while [ $SECONDS -lt $deadline ]; do
        healthy && return 0
        if ! alive "$pid"; then
            rm -f "$PIDFILE" "$MODELFILE"
            tail -n 30 "$LOGFILE" >&2
            die "server exited during startup (log: $LOGFILE)"
        fi
        sleep 0.5
    done
    return 1
}

cmd_start() {
    local pid
    if pid=$(our_pid); then
        local running
        running=$(cat "$MODELFILE" 2>/dev/null || true)
        if [ -n "$MODEL" ] && [ "$MODEL" != "$running" ]; then
            die "port $PORT already serves $running (pid $pid); stop it first to switch to $MODEL"
        fi
        # It may still be loading the model: wait rather than start another.
        wait_healthy "$pid" || die "server pid $pid on port $PORT is not healthy after ${START_TIMEOUT}s (log: $LOGFILE)"
        log "already running: pid $pid, $URL, model $running"
        return 0
    fi
    rm -f "$PIDFILE" "$MODELFILE"
    port_answers && die "port $PORT is in use by another process"

    # Without an explicit model (or without the venv), let setup.sh install
    # whatever is missing and tell us where the model is.
    if [ -z "$MODEL" ] || [ ! -x "$VENV_PY" ]; then
        local given_model=$MODEL env_lines
        env_lines=$("$SCRIPT_DIR/setup.sh" --env) || die "scripts/setup.sh failed"
        eval "$env_lines"
        MODEL=${given_model:-${LACUNA_MODEL_PATH:-}}
    fi
    [ -f "$MODEL" ] || die "model file not found: $MODEL"
    MODEL=$(readlink -f "$MODEL")
    local alias
    alias=$(basename "$MODEL" .gguf)

    write_launcher
    local cmd=("$VENV_PY" "$LAUNCHER" "$MODEL" "$HOST" "$PORT" "$CTX" "$PARALLEL" "$THREADS" "$alias")
    log "starting: ${cmd[*]}"
    # 9>&-: the server must not inherit (and so hold forever) the start lock.
    nohup "${cmd[@]}" > "$LOGFILE" 2>&1 < /dev/null 9>&- &
    pid=$!
    echo "$pid" > "$PIDFILE"
    echo "$MODEL" > "$MODELFILE"
    local t0=$SECONDS
    if ! wait_healthy "$pid"; then
        cmd_stop >/dev/null 2>&1 || true
        die "server did not become healthy within ${START_TIMEOUT}s (log: $LOGFILE)"
    fi
    log "running: pid $pid, $URL, model $alias (ready in $((SECONDS - t0))s)"
}

# A zombie counts as gone: once start's shell has exited the server's parent
# is init, which may take a while to reap it, and kill -0 still succeeds.
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }   # fields after "(comm) ", comm may contain spaces
    [ "${stat%% *}" != Z ]
}

# Waits up to $2 seconds for process $1 to exit.
wait_exit() {
    local pid=$1 n=$(($2 * 10))
    while [ $n -gt 0 ]; do
        alive "$pid" || return 0
        sleep 0.1
        n=$((n - 1))
    done
    ! alive "$pid"
}

cmd_stop() {
    local pid
    if ! pid=$(our_pid); then
        rm -f "$PIDFILE" "$MODELFILE"
        log "not running on port $PORT"
        return 0
    fi
    log "stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_exit "$pid" 10; then
        log "still running, sending TERM again"
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_exit "$pid" 5; then
            log "still running, sending KILL"
            kill -KILL "$pid" 2>/dev/null || true
            wait_exit "$pid" 5 || die "pid $pid survived SIGKILL"
        fi
    fi
    rm -f "$PIDFILE" "$MODELFILE"
    log "stopped"
}

cmd_status() {
    local pid
    if pid=$(our_pid) && healthy; then
        echo "running: pid $pid, $URL, model $(cat "$MODELFILE" 2>/dev/null || echo '?')"
        return 0
    fi
    if [ -n "${pid:-}" ]; then
        echo "pid $pid is alive but $URL/health is not OK (loading or stuck; log: $LOGFILE)"
    else
        echo "not running on port $PORT"
    fi
    return 1
}

# start and stop hold a per-port lock: test processes started in parallel may
# all call start, and only one of them must launch the server.
lock() {
    mkdir -p "$RUN"
    exec 9> "$RUN/llm-server-$PORT.lock"
    flock 9
}

case "$CMD" in
    start) lock; cmd_start ;;
    stop) lock; cmd_stop ;;
    status) cmd_status ;;
    *) usage ;;
esac
