#!/usr/bin/env bash
# One bench for a new host, offline: what the re-ranker and the pipeline do there, on its CPUs and,
# where it has one, its GPU.
#
# Usage:
#   scripts/host-bench.sh pack [--gpu] [--out DIR]   here, with the package registries: builds the
#       release binary and packs it with ONNX Runtime (and with --gpu its CUDA build and provider),
#       the re-ranker's int8 and float graphs, a test broker and HotpotQA into DIR/part-NN (at most
#       56 MiB each, so each fits one transfer) and DIR/SHA256SUMS. Default DIR: target/host-bench.
#   scripts/host-bench.sh run [DIR]                   on the host, with the parts in DIR: joins and
#       checks them, unpacks, and prints one table (under 8 minutes on 16 cores):
#       - `lacuna bench rerank` on the CPU, and on CUDA where a GPU is present;
#       - `lacuna bench pipeline` (300 ± 100 ms fake LLM, 64 questions open, 32 LLM slots, 50
#         passages per query) for each provider;
#       - sentence_filter in 1, 4 and 8 processes over Kafka (a local broker);
#       - how every process exited.
#
# Environment for run: HOST_BENCH_LIMIT (questions per pipeline run, default all 91),
# HOST_BENCH_PAIRS (pairs for bench rerank, 300), HOST_BENCH_REPLICAS ("1 4 8"), HOST_BENCH_STEPS
# (which of "rerank pipeline kafka" to run, default all: a lent machine's calls are capped at 10
# minutes each, so a slow host can take them in two calls), HOST_BENCH_CUDA_LIBS
# (folders holding the CUDA 13 libraries; default: the nvidia/*/lib folders of the host's Python
# packages), HOST_BENCH_OUT (where the figures go, default DIR/out).
set -euo pipefail

CMD="${1:-}"; shift || true
PART_BYTES=$((56 * 1024 * 1024))

log() { echo "host-bench: $*" >&2; }
die() { echo "host-bench: ERROR: $*" >&2; exit 1; }

pack() {
    local gpu=0 out repo
    repo="$(cd "$(dirname "$0")/.." && pwd)"
    out="$repo/target/host-bench"
    while [ $# -gt 0 ]; do
        case "$1" in
            --gpu) gpu=1; shift ;;
            --out) out=$2; shift 2 ;;
            *) die "pack: unknown argument $1" ;;
        esac
    done
    local cache="${LACUNA_CACHE:-$HOME/.cache/lacuna}" data="${LACUNA_DATA:-$repo/../shared/data}"
    export LACUNA_FLOAT_GRAPH=1 LACUNA_MODEL=none
    [ "$gpu" = 1 ] && export LACUNA_ORT=gpu LACUNA_CUDA_WHEELS=0
    eval "$("$repo/scripts/setup.sh" --env)"
    local target="${CARGO_TARGET_DIR:-$cache/target}"
    (cd "$repo" && CARGO_TARGET_DIR="$target" cargo build --release --locked >&2)
    local stage; stage=$(mktemp -d)
    trap 'rm -rf "$stage"' RETURN
    mkdir -p "$stage/bin" "$stage/ort/cpu" "$stage/reranker" "$stage/data/hotpotqa"
    cp "$target/release/lacuna" "$stage/bin/" && strip "$stage/bin/lacuna"
    cp "$repo/scripts/host-bench.sh" "$stage/bin/"
    cp "$cache/onnxruntime/libonnxruntime.so.1.31.1" "$stage/ort/cpu/"
    if [ "$gpu" = 1 ]; then
        mkdir -p "$stage/ort/gpu"
        cp "$cache/onnxruntime-gpu/"libonnxruntime*.so* "$stage/ort/gpu/"
    fi
    cp "$LACUNA_RERANKER_DIR/"{model.onnx,model.float.onnx,tokenizer.json,LICENSE,NOTICE} "$stage/reranker/"
    # The test broker, a static binary from scripts/broker.sh's venv.
    local noida
    noida=$("$cache/venv/bin/python" -c 'import noida_db, os; print(os.path.join(os.path.dirname(noida_db.__file__), "noida-db"))') \
        || die "no noida-db: run scripts/broker.sh start (and stop) once"
    cp "$noida" "$stage/bin/"
    cp "$data/hotpotqa/"*.jsonl "$stage/data/hotpotqa/"
    rm -rf "$out" && mkdir -p "$out"
    log "compressing $(du -sh "$stage" | cut -f1) into parts of 56 MiB"
    tar -C "$stage" -cf - . | xz -T0 -6 | split -b "$PART_BYTES" -d -a 2 - "$out/part-"
    (cd "$out" && sha256sum part-* > SHA256SUMS)
    cp "$repo/scripts/host-bench.sh" "$out/"
    log "packed $(ls "$out"/part-* | wc -l) parts into $out: on the host, scripts/host-bench.sh run $out"
    ls -l "$out" >&2
}

# The CUDA 13 libraries the GPU build of ONNX Runtime loads: the host's Python packages (nvidia-*).
cuda_libs() {
    if [ -n "${HOST_BENCH_CUDA_LIBS:-}" ]; then echo "$HOST_BENCH_CUDA_LIBS"; return; fi
    python3 - <<'PY' 2>/dev/null || true
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
print(":".join(sorted({d for r in roots for d in glob.glob(os.path.join(r, "nvidia", "*", "lib"))})))
PY
}

# The environment of a step on `cpu` or `cuda`, in the unpacked folder $1.
use_provider() {
    if [ "$2" = cuda ]; then
        export ORT_DYLIB_PATH="$1/ort/gpu/libonnxruntime.so.1.31.1"
        export LD_LIBRARY_PATH="$(cuda_libs):$1/ort/gpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export LACUNA__ONNX__EXECUTION_PROVIDER=cuda
    else
        export ORT_DYLIB_PATH="$1/ort/cpu/libonnxruntime.so.1.31.1"
    fi
}

# Runs one step, keeps its output, and records its exit status for the table.
step() {
    local name=$1; shift
    log "$name"
    local status=0
    "$@" > "$OUT/$name.out" 2> "$OUT/$name.err" || status=$?
    echo "$name $status" >> "$OUT/exits"
    [ "$status" = 0 ] || { log "$name exited $status:"; tail -5 "$OUT/$name.err" >&2; }
}

run() {
    local dir="${1:-$(cd "$(dirname "$0")/.." && pwd)/target/host-bench}"
    dir="$(cd "$dir" && pwd)"
    OUT="${HOST_BENCH_OUT:-$dir/out}"
    local root="$dir/unpacked"
    if [ ! -x "$root/bin/lacuna" ]; then
        (cd "$dir" && sha256sum -c --quiet SHA256SUMS) || die "a part is missing or damaged"
        mkdir -p "$root.part" && cat "$dir"/part-* | xz -d | tar -C "$root.part" -xf -
        mv "$root.part" "$root"
    fi
    rm -rf "$OUT" && mkdir -p "$OUT"
    local bin="$root/bin/lacuna" pairs="${HOST_BENCH_PAIRS:-300}" limit=()
    [ -n "${HOST_BENCH_LIMIT:-}" ] && limit=(--limit "$HOST_BENCH_LIMIT")
    export LACUNA_RERANKER_DIR="$root/reranker" LACUNA_DATA="$root/data" LACUNA_LOG="${LACUNA_LOG:-warn}"
    export LACUNA__METRICS__LISTEN=127.0.0.1:0
    local data="$root/data/hotpotqa" cores; cores=$(nproc)

    local providers=(cpu)
    if [ -d "$root/ort/gpu" ] && command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
        providers+=(cuda)
    else
        log "no GPU here, or no CUDA build of ONNX Runtime packed (pack --gpu): the CPU only"
    fi
    local pipeline=(bench pipeline --dataset "$data" "${limit[@]}" --fake-llm-ms 300,100 --open 64
        --llm-concurrency 32 --retrieve-top-n 50)
    local steps=" ${HOST_BENCH_STEPS:-rerank pipeline kafka} "
    for provider in "${providers[@]}"; do
        (
            use_provider "$root" "$provider"
            [[ "$steps" != *" rerank "* ]] \
                || step "rerank-$provider" "$bin" bench rerank --dataset "$data" --pairs "$pairs" --json "$OUT/rerank-$provider.json"
            [[ "$steps" != *" pipeline "* ]] \
                || step "pipeline-$provider" "$bin" "${pipeline[@]}" --json "$OUT/pipeline-$provider.json"
        )
    done
    touch "$OUT/exits"
    [[ "$steps" == *" kafka "* ]] || { table "$OUT"; return; }

    # sentence_filter over Kafka on the fastest provider, each count in its own run so each process
    # gets its share of the cores.
    local best=${providers[-1]} port=19492 broker_data
    broker_data=$(mktemp -d)
    "$root/bin/noida-db" start --data-dir "$broker_data" --only kafka --kafka-port "$port" --host 127.0.0.1 \
        > "$OUT/broker.log" 2>&1 &
    local broker=$!
    for _ in $(seq 1 120); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.5; done
    for n in ${HOST_BENCH_REPLICAS:-1 4 8}; do
        (
            export LACUNA__KAFKA__BROKERS=127.0.0.1:$port
            use_provider "$root" "$best"
            # On the CPU each process gets one session per core of its share.
            [ "$best" = cuda ] || export LACUNA__RERANK__SESSIONS=$(( cores / n > 0 ? cores / n : 1 )) LACUNA__RERANK__THREADS=1
            step "kafka-sentence_filter-$n-$best" "$bin" "${pipeline[@]}" --transport kafka \
                --stage-processes "sentence_filter=$n" --json "$OUT/kafka-$n.json"
        )
    done
    kill -TERM "$broker" 2>/dev/null || true
    wait "$broker" 2>/dev/null || true
    rm -rf "$broker_data"
    table "$OUT"
}

# The one table, from the JSON figures and the exit statuses.
table() {
    python3 - "$1" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
exits = dict(line.split() for line in open(os.path.join(out, "exits")))
print(f"# host bench: {os.cpu_count()} CPUs\n")
print("| step | provider | figure | exit |\n|---|---|---|---|")
for provider in ("cpu", "cuda"):
    r = load(f"rerank-{provider}.json")
    if f"rerank-{provider}" not in exits:
        continue
    if r:
        best = max(r["ways"], key=lambda w: w["pairs_per_second"])
        stage = next((w for w in r["ways"] if w["name"] == "stage path (as configured)"), best)
        print(f"| bench rerank, {r['pairs']} pairs | {r['execution_provider']} | stage path {stage['pairs_per_second']:.1f} pairs/s "
              f"({stage['sessions']}×{stage['threads']}); best way {best['pairs_per_second']:.1f} ({best['name']}) | {exits[f'rerank-{provider}']} |")
    else:
        print(f"| bench rerank | {provider} | no figures | {exits[f'rerank-{provider}']} |")
rows = [(f"pipeline-{p}", p, f"pipeline-{p}.json") for p in ("cpu", "cuda")]
rows += [(k, k.rsplit("-", 1)[1], f"kafka-{k.split('-')[2]}.json") for k in exits if k.startswith("kafka-")]
for key, provider, name in rows:
    if key not in exits:
        continue
    runs = load(name) or []
    for p in runs:
        procs = ", ".join(sorted({e for _, e in p.get("processes", [])})) or "-"
        print(f"| bench pipeline {p['label']}, {p['questions']} questions | {provider} | {p['questions_per_second']:.2f} questions/s, "
              f"LLM in flight {p['llm_in_flight']:.1f} of 32 ({100 * p['llm_concurrency']:.0f}%), p50/p95 {p['latency_p50']:.1f}/{p['latency_p95']:.1f} s, "
              f"re-ranker {p['rerank_pairs_per_second']:.0f} pairs/s, peak RSS {p['peak_rss_mib']:.0f} MiB, errors {p['errors']}; "
              f"stage processes: {procs} | {exits[key]} |")
    if not runs:
        print(f"| {key} | {provider} | no figures | {exits[key]} |")
PY
}

case "$CMD" in
    pack) pack "$@" ;;
    run) run "$@" ;;
    *) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
