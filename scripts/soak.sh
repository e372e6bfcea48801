#!/usr/bin/env bash
# The soak test (not part of CI): MIGRES's six stages as `lacuna stage` processes on Apache Kafka
# (three KRaft nodes from scripts/kafka.sh, every topic replicated three times with
# min.insync.replicas=2), two `lacuna serve` replicas and the answers sink, for a set time against the built-in fake
# LLM at 300 ± 100 ms that fails 5% of calls with HTTP 500, 3% with broken JSON and 1% cut at
# max_tokens. Meanwhile:
#   - 2 questions a second, one over HTTP (to either replica) and one over Kafka (`lacuna submit`);
#   - a process that exits is started again, as Kubernetes would, and counted;
#   - a 3-minute LLM outage in the middle, longer than the soak's llm.breaker.max_wait_ms (2 min);
#   - every 3 minutes a SIGKILL of a random stage at a moment its /metrics show work in flight, and
#     the time until it is ready again;
#   - one broker killed (SIGKILL) at a moment the leaf has work in flight, and started again on its
#     data (with one node, LACUNA_SOAK_NODES=1: that node);
#   - 100 slow clients holding connections to serve, and a GET every second timed under them;
#   - two document writers at once on the same 40 document ids: one through serve's document routes
#     (a write or a delete a second, to either replica), one `lacuna ingest --transport kafka` of three
#     documents and a delete every 5 seconds. The retrieve stage follows the documents topic into an
#     index of its own (built from the topic: the HotpotQA corpus is published first), and the first
#     kill is always its.
# serve.keep_finished is 500 (LACUNA_SOAK_KEEP), so the registry reaches its bound in the warm-up,
# which ends when that many questions are answered or after 5 minutes; the outage falls in the middle
# of the rest, the broker kill at its first quarter, and the kills every 3 minutes of it. Then it waits for every question submitted (up to 5
# minutes) and prints one table: submitted, ended, lost, duplicate lines in the sink, duplicates on
# the answers topic, errors by type, RSS and open files of every process, serve's p99 GET latency,
# each kill's time to ready, the document writes, and whether the retrieve stage's index is then
# exactly the topic's live documents, each at its last version (`lacuna verify-index`).
#
# Usage: scripts/soak.sh [--minutes N] [--out DIR]     (default 30 minutes, out: $LACUNA_CACHE/soak)
# LACUNA_SOAK_HOLD=1 keeps everything running after a drain with questions lost (see below).
# LACUNA_SOAK_DELIVERY=exactly_once|at_least_once (bus.delivery; default exactly_once),
# LACUNA_SOAK_NODES=3|1 (Kafka nodes; default 3).
# Ports: 127.0.0.1:19492-19497 (Kafka), 18390 (LLM), 18181-18182 (serve), 19901-19906 (stage metrics).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=30
export LACUNA_CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
OUT="$LACUNA_CACHE/soak"
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) MINUTES=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "soak: unknown argument $1" >&2; exit 2 ;;
    esac
done
eval "$(scripts/setup.sh --env)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$LACUNA_CACHE/target}"
PROFILE="${LACUNA_SOAK_PROFILE:-release}"
if [ "$PROFILE" = release ]; then cargo build --release --locked; else cargo build --locked; fi
lacuna="$CARGO_TARGET_DIR/$PROFILE/lacuna"

rm -rf "$OUT"; mkdir -p "$OUT/logs"
BROKER_PORT=19492 LLM_PORT=18390 SERVE_PORTS=(18181 18182)
NODES="${LACUNA_SOAK_NODES:-3}"
STAGES=(retrieve sentence_filter leaf verify main query_gen)
declare -A PID METRICS_PORT
log() { echo "soak $(date +%T): $*" | tee -a "$OUT/events.log" >&2; }
now() { date +%s; }

# Everything stops on exit, by PID.
cleanup() {
    for pid in "${PID[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    sleep 2
    for pid in "${PID[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    scripts/kafka.sh stop --port "$BROKER_PORT" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# The retrieve stage's index is a copy of the documents topic, built from it at start.
export LACUNA__SEARCH__INDEX_DIR="$OUT/index"
scripts/kafka.sh stop --port "$BROKER_PORT" >/dev/null 2>&1 || true
scripts/kafka.sh start --nodes "$NODES" --port "$BROKER_PORT"
brokers=""
for i in $(seq 0 $((NODES - 1))); do brokers="${brokers:+$brokers,}127.0.0.1:$((BROKER_PORT + 2 * i))"; done
export LACUNA__KAFKA__BROKERS="$brokers"
export LACUNA__KAFKA__REPLICATION_FACTOR="$NODES"
export LACUNA__BUS__DELIVERY="${LACUNA_SOAK_DELIVERY:-exactly_once}"
export LACUNA__KAFKA__TOPIC_PREFIX="soak$(now)."
export LACUNA__KAFKA__PARTITIONS=4
export LACUNA__LLM__BASE_URL="http://127.0.0.1:$LLM_PORT/v1"
export LACUNA__LLM__BREAKER__MAX_WAIT_MS=120000
export LACUNA__BUS__PROGRESS=true
KEEP="${LACUNA_SOAK_KEEP:-500}"
export LACUNA__SERVE__KEEP_FINISHED="$KEEP"
export LACUNA__MIGRES__RETRIEVE_TOP_N=4
# Answers from a fake model: the main module's checks would only send every question to the limit.
export LACUNA__MIGRES__ACCEPTANCE=flag LACUNA__MIGRES__GROUNDING_GATE=false LACUNA__MIGRES__COMPARE_OPTIONS=false
export LACUNA_SOAK_DOCUMENTS_TOKEN=soak-documents LACUNA__SERVE__DOCUMENTS_TOKEN_ENV=LACUNA_SOAK_DOCUMENTS_TOKEN
"$lacuna" ingest --transport kafka ../shared/data/hotpotqa/corpus.jsonl >> "$OUT/logs/ingest.log" 2>&1

start_llm() {
    "$lacuna" bench fake-llm --listen "127.0.0.1:$LLM_PORT" --ms 300,100 --faults 500=5,json=3,cut=1 \
        >> "$OUT/logs/llm.log" 2>&1 3>&- &
    PID[llm]=$!
    for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$LLM_PORT/v1/models" >/dev/null && return; sleep 0.1; done
}
start_stage() {
    local name=$1
    local follow=false
    [ "$name" = retrieve ] && follow=true
    # Static membership: a restarted stage takes its partitions back at once.
    LACUNA__METRICS__LISTEN="127.0.0.1:${METRICS_PORT[$name]}" LACUNA__KAFKA__INSTANCE_ID="soak-$name" \
        LACUNA__SEARCH__FOLLOW_DOCUMENTS=$follow "$lacuna" stage "$name" >> "$OUT/logs/$name.log" 2>&1 3>&- &
    PID[$name]=$!
}
ready() { curl -sf -o /dev/null "http://127.0.0.1:$1/readyz"; }
in_flight() {
    curl -sf "http://127.0.0.1:${METRICS_PORT[$1]}/metrics" 2>/dev/null |
        awk -v s="lacuna_stage_in_flight{stage=\"$1\"}" '$1 == s { print int($2) }'
}
rss_kb() { awk '/VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }

start_llm
i=1
for name in "${STAGES[@]}"; do METRICS_PORT[$name]=$((19900 + i)); i=$((i + 1)); start_stage "$name"; done
start_serve() {
    LACUNA__SERVE__LISTEN="127.0.0.1:${SERVE_PORTS[$1]}" LACUNA__SERVE__REPLICA_ID="soak-$1" \
        "$lacuna" serve --transport kafka --pipeline migres >> "$OUT/logs/serve-$1.log" 2>&1 3>&- &
    PID[serve$1]=$!
}
start_sink() {
    LACUNA_LOG=lacuna=info "$lacuna" answers --out "$OUT/answers.jsonl" --idle-timeout-s 100000 \
        >> "$OUT/logs/sink.log" 2>&1 3>&- &
    PID[sink]=$!
}
# What Kubernetes does for a Deployment: a process that exits is started again, and it is counted.
supervise() {
    local name
    for name in "${STAGES[@]}" serve0 serve1 sink; do
        kill -0 "${PID[$name]}" 2>/dev/null && continue
        wait "${PID[$name]}" 2>/dev/null && rc=0 || rc=$?
        log "$name exited (status $rc): started again"
        echo "$name $rc" >> "$OUT/restarts.txt"
        case "$name" in
            serve*) start_serve "${name#serve}" ;;
            sink) start_sink ;;
            *) start_stage "$name" ;;
        esac
    done
}
start_serve 0; start_serve 1; start_sink
# A process that exits while the cluster starts is started again here too, and counted.
for name in "${STAGES[@]}"; do until ready "${METRICS_PORT[$name]}"; do sleep 0.5; supervise; done; done
for port in "${SERVE_PORTS[@]}"; do until ready "$port"; do sleep 0.5; supervise; done; done
log "all ready"
for name in "${!PID[@]}"; do echo "$name $(rss_kb "${PID[$name]}") $(fds "${PID[$name]}")" >> "$OUT/start.txt"; done

# 100 slow clients on replica 0: each sends half a request header and waits; a closed one comes back.
python3 - "${SERVE_PORTS[0]}" > "$OUT/logs/slow.log" 2>&1 <<'EOF' &
import socket, sys, time
port = int(sys.argv[1])
def slow():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /v1/questions HTTP/1.1\r\nhost: soak\r\n")
    return s
clients = [slow() for _ in range(100)]
while True:
    time.sleep(1)
    for i, s in enumerate(clients):
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                clients[i] = slow()
        except BlockingIOError:
            pass
        except OSError:
            clients[i] = slow()
EOF
PID[slow]=$!

# 2 questions a second, one over each path, ids soak-h-N and soak-k-N.
mapfile -t QUESTIONS < <(python3 -c 'import json,sys
for l in open("../shared/data/hotpotqa/questions.jsonl"): print(json.loads(l)["question"].replace("\"", "'\''"))')
# One `lacuna submit` for the whole run, fed line by line through a FIFO (a process a second would
# spend the CPU the stages need on connecting to the broker).
mkfifo "$OUT/kafka-questions.fifo"
"$lacuna" submit --questions "$OUT/kafka-questions.fifo" >> "$OUT/logs/submit.log" 2>&1 &
PID[submit]=$!
exec 3> "$OUT/kafka-questions.fifo"
submit_loop() {
    local n=0 q
    while [ ! -f "$OUT/stop-submitting" ]; do
        q=${QUESTIONS[$((n % ${#QUESTIONS[@]}))]}
        submit_one "$n" "$q" &
        printf '{"id": "soak-k-%s", "question": "%s"}\n' "$n" "$q" >&3 && echo "soak-k-$n" >> "$OUT/submitted.txt"
        n=$((n + 1))
        sleep 1
    done
    wait
}
submit_one() {
    local n=$1 q=$2
    if curl -sf -o /dev/null -H 'content-type: application/json' \
            -d "{\"id\": \"soak-h-$n\", \"question\": \"$q\"}" "http://127.0.0.1:${SERVE_PORTS[$((n % 2))]}/v1/questions"; then
            echo "soak-h-$n" >> "$OUT/submitted.txt"
        else
            echo "soak-h-$n" >> "$OUT/refused.txt"
        fi
}
submit_loop &
PID[submitter]=$!

# Two document writers on the same 40 ids, each line of documents.txt: writer, what, id, outcome.
document() {
    printf '{"id": "%s", "title": "Soak document %s", "text": "Soak document %s, version %s. It was written by the %s writer."}' \
        "$1" "$1" "$1" "$2" "$3"
}
http_writer() {
    local n=0 id status
    while [ ! -f "$OUT/stop-submitting" ]; do
        id=soak-doc-$((RANDOM % 40)) port=${SERVE_PORTS[$((n % 2))]}
        if [ $((RANDOM % 5)) = 0 ]; then
            status=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE -H 'authorization: Bearer soak-documents' \
                "http://127.0.0.1:$port/v1/documents/$id")
            echo "http delete $id $status" >> "$OUT/documents.txt"
        else
            status=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
                -H 'authorization: Bearer soak-documents' -d "$(document "$id" "h-$n" HTTP)" \
                "http://127.0.0.1:$port/v1/documents")
            echo "http write $id $status" >> "$OUT/documents.txt"
        fi
        n=$((n + 1))
        sleep 1
    done
}
ingest_writer() {
    local n=0 ids file
    while [ ! -f "$OUT/stop-submitting" ]; do
        file="$OUT/ingest.jsonl" ids=()
        : > "$file"
        for _ in 1 2 3; do
            ids+=("soak-doc-$((RANDOM % 40))")
            document "${ids[-1]}" "i-$n" ingest >> "$file"; echo >> "$file"
        done
        gone=soak-doc-$((RANDOM % 40))
        if "$lacuna" ingest --transport kafka "$file" --delete "$gone" >> "$OUT/logs/ingest.log" 2>&1 3>&-; then
            status=ok
        else
            status=failed
        fi
        for id in "${ids[@]}"; do echo "ingest write $id $status" >> "$OUT/documents.txt"; done
        echo "ingest delete $gone $status" >> "$OUT/documents.txt"
        n=$((n + 1))
        sleep 5
    done
}
http_writer 3>&- &
PID[http_writer]=$!
ingest_writer 3>&- &
PID[ingest_writer]=$!

# A GET a second on the replica the slow clients hold, timed.
latency_loop() {
    while [ ! -f "$OUT/stop-submitting" ]; do
        curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:${SERVE_PORTS[0]}/v1/questions/soak-h-0" \
            >> "$OUT/get-latency.txt" || true
        sleep 1
    done
}
latency_loop 3>&- &
PID[latency]=$!

answered() { [ -f "$OUT/answers.jsonl" ] && wc -l < "$OUT/answers.jsonl" || echo 0; }
start=$(now)
until [ "$(answered)" -ge "$KEEP" ] || [ $(($(now) - start)) -ge 300 ]; do supervise; sleep 5; done
log "warm-up over after $(($(now) - start)) s, $(answered) answered"
for name in "${!PID[@]}"; do echo "$name $(rss_kb "${PID[$name]}")" >> "$OUT/warm.txt"; done

end=$((start + MINUTES * 60)) warm_end=$(now)
outage_at=$(((warm_end + end) / 2 - 90)) broker_at=$((warm_end + (end - warm_end) / 4)) next_kill=$((warm_end + 60))
outage_done=0 broker_done=0
while [ "$(now)" -lt "$end" ]; do
    t=$(now)
    if [ $outage_done = 0 ] && [ "$t" -ge "$outage_at" ]; then
        log "LLM outage: 3 minutes"
        kill -KILL "${PID[llm]}" 2>/dev/null || true
        for _ in $(seq 1 180); do sleep 1; supervise; done
        start_llm; log "LLM back"; outage_done=1
    fi
    if [ $broker_done = 0 ] && [ "$(now)" -ge "$broker_at" ]; then
        # At a busy moment: the leaf has work in flight (or after 30 s of waiting for one).
        for _ in $(seq 1 300); do [ "$(in_flight leaf)" -gt 0 ] 2>/dev/null && break; sleep 0.1; done
        node=$(( (RANDOM % NODES) + 1 ))
        log "broker node $node killed (SIGKILL) and started again"
        scripts/kafka.sh restart --node "$node" --crash --port "$BROKER_PORT" 3>&-; broker_done=1
    fi
    if [ "$(now)" -ge "$next_kill" ]; then
        name=${STAGES[$((RANDOM % ${#STAGES[@]}))]}
        [ -f "$OUT/kills.txt" ] || name=retrieve
        # Polled without a pause, and killed on the first sight of work in flight (the fast stages
        # hold an event for milliseconds).
        busy=0 deadline=$(($(now) + 120))
        while [ "$(now)" -lt "$deadline" ]; do
            busy=$(in_flight "$name"); busy=${busy:-0}
            [ "$busy" -gt 0 ] && break
        done
        kill -KILL "${PID[$name]}" 2>/dev/null || true; killed=$(date +%s.%N)
        # Reaped before its successor starts, so that its port is free.
        wait "${PID[$name]}" 2>/dev/null || true
        start_stage "$name"
        until ready "${METRICS_PORT[$name]}"; do sleep 0.1; supervise; done
        back=$(awk -v a="$(date +%s.%N)" -v b="$killed" 'BEGIN { printf "%.1f", a - b }')
        echo "$name $busy $back" >> "$OUT/kills.txt"
        log "SIGKILL $name with $busy in flight: ready again after ${back} s"
        next_kill=$(($(now) + 180))
    fi
    supervise
    sleep 1
done

touch "$OUT/stop-submitting"
wait "${PID[submitter]}" "${PID[http_writer]}" "${PID[ingest_writer]}" 2>/dev/null || true
exec 3>&-
wait "${PID[submit]}" 2>/dev/null || true
submitted=$(sort -u "$OUT/submitted.txt" | wc -l)
log "submission stopped at $submitted questions; waiting for the rest while they keep coming"
drain_start=$(now) last_progress=$(now) last_count=0
ended() { python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
sub = set(open(f"{out}/submitted.txt").read().split())
ids = [json.loads(l)["question_id"] for l in open(f"{out}/answers.jsonl")]
print(len(sub & set(ids)))
EOF
}
# Until every question has its record, or none came for 3 minutes (the backlog a 2-core machine
# builds up at 2 questions a second drains at its own pace), or 30 minutes.
while :; do
    count=$(ended)
    [ "$count" -ge "$submitted" ] && break
    [ "$count" -gt "$last_count" ] && last_count=$count last_progress=$(now)
    [ $(($(now) - last_progress)) -ge 180 ] || [ $(($(now) - drain_start)) -ge 1800 ] && break
    supervise; sleep 5
done
log "drained after $(($(now) - drain_start)) s: $(ended) of $submitted ended"
# LACUNA_SOAK_HOLD=1: with questions lost, everything stays up (broker, stages, serve) until
# $OUT/hold is removed, to read the topics and the processes while they still hold the loss.
if [ "${LACUNA_SOAK_HOLD:-0}" = 1 ] && [ "$(ended)" -lt "$submitted" ]; then
    touch "$OUT/hold"
    log "questions lost: holding until $OUT/hold is removed"
    while [ -e "$OUT/hold" ]; do sleep 5; done
fi
for name in "${!PID[@]}"; do echo "$name $(rss_kb "${PID[$name]}") $(fds "${PID[$name]}")" >> "$OUT/end.txt"; done

# The retrieve stage's index against the topic, once it has applied everything (lag 0, or 2 minutes).
lag() {
    curl -sf "http://127.0.0.1:${METRICS_PORT[retrieve]}/metrics" 2>/dev/null |
        awk '/^lacuna_index_lag\{/ { sum += $2; seen = 1 } END { print seen ? int(sum) : -1 }'
}
for _ in $(seq 1 120); do [ "$(lag)" = 0 ] && break; sleep 1; done
sleep 2
if "$lacuna" verify-index --index-dir "$OUT/index" > "$OUT/verify.txt" 2>> "$OUT/logs/verify.log"; then
    echo yes >> "$OUT/verify.txt"
else
    echo no >> "$OUT/verify.txt"
fi
log "index against the topic: $(tail -1 "$OUT/verify.txt")"

python3 - "$OUT" "$MINUTES" <<'EOF'
import collections, json, sys
out, minutes = sys.argv[1], sys.argv[2]
submitted = set(open(f"{out}/submitted.txt").read().split())
refused = open(f"{out}/refused.txt").read().split() if __import__("os").path.exists(f"{out}/refused.txt") else []
lines = [json.loads(l) for l in open(f"{out}/answers.jsonl")]
ids = [r["question_id"] for r in lines]
ended = submitted & set(ids)
errors = collections.Counter(r["error_type"] for r in lines if r.get("status") == "error")
copies = sum("already written: skipped" in l for l in open(f"{out}/logs/sink.log"))
def table(name):
    rows = {}
    for line in open(f"{out}/{name}"):
        parts = line.split()
        rows[parts[0]] = [int(p) for p in parts[1:]]
    return rows
start, end, warm = table("start.txt"), table("end.txt"), table("warm.txt")
lat = sorted(float(x) for x in open(f"{out}/get-latency.txt").read().split())
p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan")
print(f"| soak, {minutes} min | value |\n|---|---|")
print(f"| questions submitted (HTTP + Kafka) | {len(submitted)} |")
print(f"| submissions refused (429/503, retried by nobody) | {len(refused)} |")
print(f"| ended in a record | {len(ended)} |")
print(f"| lost | {len(submitted - ended)} |")
print(f"| duplicate lines in the sink | {len(ids) - len(set(ids))} |")
print(f"| duplicate records on the answers topic (skipped by the sink) | {copies} |")
print(f"| error records by type | {', '.join(f'{k} {v}' for k, v in errors.most_common()) or 'none'} |")
print(f"| serve GET p99 under 100 slow clients | {p99:.0f} ms over {len(lat)} GETs |")
for name in sorted(start):
    if name in end:
        w = f", after warm-up {warm[name][0] // 1024} MiB" if name in warm else ""
        print(f"| {name}: RSS start → end{' (warm-up)' if w else ''}, open files | {start[name][0] // 1024} → {end[name][0] // 1024} MiB{w}; {start[name][1]} → {end[name][1]} files |")
import os
restarts = collections.Counter(l.split()[0] for l in open(f"{out}/restarts.txt")) if os.path.exists(f"{out}/restarts.txt") else {}
print(f"| processes that exited on their own and were started again | {', '.join(f'{k} {v}' for k, v in restarts.items()) or 'none'} |")
for line in open(f"{out}/kills.txt") if os.path.exists(f"{out}/kills.txt") else []:
    name, busy, back = line.split()
    print(f"| SIGKILL {name} ({busy} in flight) | ready again after {float(back):.1f} s |")
writes = collections.Counter()
for line in open(f"{out}/documents.txt") if os.path.exists(f"{out}/documents.txt") else []:
    writer, what, _, outcome = line.split()
    writes[(writer, what, outcome == "ok" or outcome.startswith("2"))] += 1
for writer in ("http", "ingest"):
    done = ", ".join(f"{writes[(writer, what, True)]} {what}s" for what in ("write", "delete"))
    refused = writes[(writer, "write", False)] + writes[(writer, "delete", False)]
    print(f"| document changes by the {writer} writer (refused or failed) | {done} ({refused}) |")
verify = open(f"{out}/verify.txt").read().split("\n") if os.path.exists(f"{out}/verify.txt") else []
said = "; ".join(l for l in verify if l and l not in ("yes", "no"))
print(f"| retrieve's index equal to the topic (`lacuna verify-index`) | {verify[-2] if len(verify) > 1 else '?'}: {said} |")
EOF
