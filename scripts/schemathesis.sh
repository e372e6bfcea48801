#!/usr/bin/env bash
# Fuzzes `lacuna serve`'s HTTP API against the OpenAPI document it serves (/openapi.json) with
# Schemathesis (https://schemathesis.readthedocs.io), every check on (`--checks all`): twice, once with
# an API token (serve.token_env set; Schemathesis sends `Authorization: Bearer <token>`; the document
# routes are on with the same token, writing a scratch copy of the index) and once without one (the
# document routes off). The server runs in process on 127.0.0.1 in front of the built-in fake LLM
# (`lacuna bench fake-llm`), serving every pipeline, over a BM25 index of the HotpotQA corpus built
# once under the cache.
# Schemathesis is installed, pinned, into its own venv under the cache and reused. Both servers are
# stopped by PID on exit. Exits non-zero when either run reports a failure or an error.
#
# Usage: scripts/schemathesis.sh   (after a debug build; scripts/test.sh calls it when Python is present)
#
# Environment (defaults in brackets):
#   LACUNA_CACHE                      cache root [~/.cache/lacuna]; the venv is schemathesis-venv
#                                     there, the index schemathesis-index
#   LACUNA_BIN                        the lacuna binary [${CARGO_TARGET_DIR:-$LACUNA_CACHE/target}/debug/lacuna]
#   LACUNA_CORPUS                     the corpus to index [../shared/data/hotpotqa/corpus.jsonl]
#   LACUNA_SCHEMATHESIS_MAX_EXAMPLES  test cases per operation and phase (--max-examples) [25]
#   LACUNA_SCHEMATHESIS_SEED          a seed (--seed) for other inputs than the default's
#                                     [none: --generation-deterministic, the same inputs every run]
#   LACUNA_SCHEMATHESIS_REPORTS       where each run's JUnit and NDJSON reports go
#                                     [$LACUNA_CACHE/schemathesis-report]
#   LACUNA_SCHEMATHESIS_ARGS          more options for `schemathesis run`, e.g. --continue-on-failure
#   PYTHON                            the Python that makes the venv [python3]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

SCHEMATHESIS_VERSION=4.32.5
CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
BIN="${LACUNA_BIN:-${CARGO_TARGET_DIR:-$CACHE/target}/debug/lacuna}"
CORPUS="${LACUNA_CORPUS:-../shared/data/hotpotqa/corpus.jsonl}"
MAX_EXAMPLES="${LACUNA_SCHEMATHESIS_MAX_EXAMPLES:-25}"
SEED="${LACUNA_SCHEMATHESIS_SEED:-}"
REPORTS="${LACUNA_SCHEMATHESIS_REPORTS:-$CACHE/schemathesis-report}"
PYTHON="${PYTHON:-python3}"
VENV="$CACHE/schemathesis-venv"
INDEX="$CACHE/schemathesis-index"
# One run's bound: Schemathesis past it counts as failed.
RUN_TIMEOUT_S=900

log() { echo "schemathesis: $*" >&2; }
die() { echo "schemathesis: ERROR: $*" >&2; exit 1; }

[ -x "$BIN" ] || die "no lacuna binary at $BIN (cargo build first, or set LACUNA_BIN)"
command -v "$PYTHON" > /dev/null || die "$PYTHON not found"
command -v curl > /dev/null || die "curl not found"
mkdir -p "$CACHE"

# Schemathesis, pinned, in a venv of its own; the marker is written only after a successful install.
exec 9> "$CACHE/.schemathesis.lock"
flock 9
if [ "$(cat "$VENV/.lacuna-version" 2> /dev/null)" != "$SCHEMATHESIS_VERSION" ] || [ ! -x "$VENV/bin/schemathesis" ]; then
    log "installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION" >&2 ||
        die "pip install schemathesis==$SCHEMATHESIS_VERSION failed"
    echo "$SCHEMATHESIS_VERSION" > "$VENV/.lacuna-version"
fi
# The index is rebuilt when the binary is newer than it (its format may have changed).
if [ ! -f "$INDEX/meta.json" ] || [ "$BIN" -nt "$INDEX/meta.json" ]; then
    log "indexing $CORPUS into $INDEX"
    rm -rf "$INDEX"
    "$BIN" index --corpus "$CORPUS" --index-dir "$INDEX" > /dev/null
fi
flock -u 9

# ONNX Runtime and the re-ranker (no LLM: the fake one answers).
eval "$(LACUNA_MODEL=none scripts/setup.sh --env)"

work=$(mktemp -d "${TMPDIR:-/tmp}/lacuna-schemathesis.XXXXXX")
pids=()
stop() {
    local pid
    for pid in "$@"; do
        kill -TERM "$pid" 2> /dev/null || continue
        for _ in $(seq 50); do
            kill -0 "$pid" 2> /dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
    done
}
cleanup() {
    stop "${pids[@]}"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until $1 answers (any HTTP status), for at most $2 seconds, while PID $3 lives.
wait_for() {
    local url=$1 seconds=$2 pid=$3
    for _ in $(seq $((seconds * 5))); do
        curl -sS -o /dev/null --max-time 2 "$url" 2> /dev/null && return 0
        kill -0 "$pid" 2> /dev/null || return 1
        sleep 0.2
    done
    return 1
}

llm_port=$(free_port)
"$BIN" bench fake-llm --listen "127.0.0.1:$llm_port" --ms 1 > "$work/fake-llm.log" 2>&1 &
llm_pid=$!
pids+=("$llm_pid")
wait_for "http://127.0.0.1:$llm_port/v1/models" 30 "$llm_pid" ||
    { cat "$work/fake-llm.log" >&2; die "the fake LLM did not answer on 127.0.0.1:$llm_port"; }

# Deterministic by default (that mode uses no seed and no example database); a seed varies the inputs.
if [ -n "$SEED" ]; then
    generation=(--seed "$SEED" --generation-database none)
else
    generation=(--generation-deterministic)
fi
# `--checks all` limits every response to 10 s. POST /v1/answer waits for the record by design (at
# most serve.answer_timeout_ms, set to 30 s below, unless the body's timeout_ms says otherwise).
cat > "$work/schemathesis.toml" << 'TOML'
[[operations]]
include-name = "POST /v1/answer"
checks.max_response_time = 60.0
TOML

# Runs `lacuna serve` with the token $2 ("" for none) and Schemathesis against it, as run $1; adds
# a summary line to $work/summary and returns Schemathesis's exit status.
fuzz() {
    local name=$1 token=$2 port serve_pid st_pid tail_pid started rc=0 auth=() result
    port=$(free_port)
    (
        export LACUNA__LLM__BASE_URL="http://127.0.0.1:$llm_port/v1"
        export LACUNA__SEARCH__INDEX_DIR="$INDEX"
        export LACUNA__METRICS__LISTEN=""
        export LACUNA__SERVE__ANSWER_TIMEOUT_MS=30000
        if [ -n "$token" ]; then
            export LACUNA__SERVE__TOKEN_ENV=LACUNA_SCHEMA_TOKEN LACUNA_SCHEMA_TOKEN="$token"
            # The document routes as well (the same token here), on a copy of the index: they write it.
            export LACUNA__SERVE__DOCUMENTS_TOKEN_ENV=LACUNA_SCHEMA_TOKEN
            cp -r "$INDEX" "$work/index-$name"
            export LACUNA__SEARCH__INDEX_DIR="$work/index-$name"
        else
            export LACUNA__SERVE__TOKEN_ENV=""
        fi
        # Every pipeline, so that each value the document's `pipeline` enum allows is served here.
        exec "$BIN" serve --listen "127.0.0.1:$port" --pipeline migres --pipeline vanilla \
            --pipeline vanilla-s --pipeline qpaug --pipeline raisf --pipeline rqrag
    ) > "$work/serve-$name.log" 2>&1 &
    serve_pid=$!
    pids+=("$serve_pid")
    wait_for "http://127.0.0.1:$port/healthz" 120 "$serve_pid" ||
        { cat "$work/serve-$name.log" >&2; die "lacuna serve ($name) did not answer on 127.0.0.1:$port"; }
    if [ -n "$token" ]; then
        auth=(-H "Authorization: Bearer $token")
    fi
    rm -rf "${REPORTS:?}/$name"
    mkdir -p "$REPORTS/$name"
    log "$name: schemathesis $SCHEMATHESIS_VERSION against http://127.0.0.1:$port/openapi.json"
    started=$SECONDS
    # From the work directory, so that Schemathesis's own cache (.schemathesis/) goes there. In the
    # background, and its output copied by tail, so that a signal reaches the trap at once.
    : > "$work/$name.out"
    # shellcheck disable=SC2086 # LACUNA_SCHEMATHESIS_ARGS is a list of options
    # The hooks drop generated batches that repeat an id: a rule the schema cannot state.
    (cd "$work" && SCHEMATHESIS_HOOKS="$ROOT/scripts/schemathesis_hooks.py" \
        exec timeout --kill-after=10 "$RUN_TIMEOUT_S" "$VENV/bin/schemathesis" \
        --config-file "$work/schemathesis.toml" run "http://127.0.0.1:$port/openapi.json" \
        --checks all "${auth[@]}" --max-examples "$MAX_EXAMPLES" "${generation[@]}" \
        --workers 1 --request-timeout 90 --no-color \
        --report junit,ndjson --report-dir "$REPORTS/$name" ${LACUNA_SCHEMATHESIS_ARGS:-}) \
        > "$work/$name.out" 2>&1 &
    st_pid=$!
    tail -n +1 -f --pid="$st_pid" "$work/$name.out" &
    tail_pid=$!
    pids+=("$st_pid" "$tail_pid")
    wait "$st_pid" || rc=$?
    wait "$tail_pid" || true
    stop "$serve_pid"
    pids=("$llm_pid")
    cp "$work/serve-$name.log" "$REPORTS/$name/serve.log"
    # Schemathesis's last line, e.g. "==== 27 failures in 136.01s ====".
    result=$(grep -E '^=+ .+ =+$' "$work/$name.out" | tail -n 1 | sed -E 's/^=+ (.*) =+$/\1/')
    result="$name: $( ((rc == 0)) && echo PASSED || echo "FAILED (exit $rc)"): ${result:-no summary}; $((SECONDS - started)) s in all"
    log "$result; the reports and serve's log are in $REPORTS/$name"
    echo "$result" >> "$work/summary"
    return "$rc"
}

status=0
fuzz with-token "lacuna-schemathesis-token" || status=1
fuzz without-token "" || status=1
echo "schemathesis $SCHEMATHESIS_VERSION (--checks all --max-examples $MAX_EXAMPLES ${generation[*]}):" >&2
sed 's/^/  /' "$work/summary" >&2
exit "$status"
