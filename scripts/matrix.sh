#!/usr/bin/env bash
# The failure matrix of issue 74 (not part of CI): on Apache Kafka with exactly-once on, each row of
# tests/matrix.rs (its `matrix_*` tests) LACUNA_MATRIX_RUNS times (5) with LACUNA_MATRIX_QUESTIONS
# questions (200), then tests/chaos.rs as it is, as many times. Prints one table: scenario, runs,
# questions, answer records, duplicates, lost, records repeated on the other topics. Every run's
# figures are in $OUT/runs.jsonl, each row's output in $OUT/<row>.log.
#
# Usage: scripts/matrix.sh [ROW...]    (default: every row and chaos; a row is a matrix_* test's
#                                       name without `matrix_`, or `chaos`)
# Ports: 127.0.0.1:19692-19693 (the shared node), 19592-19597 (the three-node rows), and free ones.
set -euo pipefail
cd "$(dirname "$0")/.."
export LACUNA_CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
setup_env=$(scripts/setup.sh --env)
eval "$setup_env"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$LACUNA_CACHE/target}"
OUT="${LACUNA_MATRIX_DIR:-$LACUNA_CACHE/matrix}"
RUNS="${LACUNA_MATRIX_RUNS:-5}"
export LACUNA_MATRIX_RUNS="$RUNS" LACUNA_MATRIX_QUESTIONS="${LACUNA_MATRIX_QUESTIONS:-200}"
ROWS=("$@")
if [ ${#ROWS[@]} = 0 ]; then
    ROWS=(sigkill_of_each_stage_with_work_in_flight a_broker_restart a_stage_paused_past_its_session_timeout
        a_record_over_its_topics_size_limit a_rolling_restart_of_every_stage_during_slow_llm_calls
        three_rebalances_during_one_records_life three_nodes_losing_the_answers_leader
        three_nodes_losing_the_transaction_coordinator chaos)
fi

scripts/kafka.sh install > /dev/null
cargo build --tests --locked
rm -rf "$OUT"; mkdir -p "$OUT"
port=19692
trap 'scripts/kafka.sh stop --port "$port" > /dev/null 2>&1 || true' EXIT
scripts/kafka.sh stop --port "$port" > /dev/null 2>&1 || true
scripts/kafka.sh start --port "$port"
export LACUNA_TEST_KAFKA="127.0.0.1:$port" LACUNA_MATRIX_OUT="$OUT/runs.jsonl"

for row in "${ROWS[@]}"; do
    echo "matrix $(date +%T): $row" >&2
    if [ "$row" = chaos ]; then
        for n in $(seq 1 "$RUNS"); do
            if cargo test --locked --test chaos >> "$OUT/chaos.log" 2>&1; then ok=true; else ok=false; fi
            printf '{"scenario": "chaos", "run": %s, "passed": %s}\n' "$n" "$ok" >> "$OUT/runs.jsonl"
        done
    else
        cargo test --locked --test matrix -- --ignored --exact "matrix_$row" --nocapture > "$OUT/$row.log" 2>&1 ||
            echo "matrix: $row failed (see $OUT/$row.log)" >&2
    fi
done

python3 - "$OUT/runs.jsonl" <<'EOF'
import collections, json, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    run = json.loads(line)
    rows.setdefault(run["scenario"], []).append(run)
print("| scenario | runs | questions | answer records | duplicates | lost | repeated on other topics | signals to a stage (with work in flight) | stage processes that exited on their own |")
print("|---|---|---|---|---|---|---|---|---|")
for scenario, runs in rows.items():
    if scenario == "chaos":
        passed = sum(r["passed"] for r in runs)
        print(f"| chaos (tests/chaos.rs: 100 questions, faults, kills, poison) | {len(runs)} | {100 * len(runs)} | passed {passed} of {len(runs)} | | | | | |")
        continue
    total = lambda key: sum(r[key] for r in runs)
    lost = total("lost") + total("lost_in_sink")
    signals = f"{total('signals')} ({total('signals_at_work')})" if total("signals") else ""
    print(f"| {scenario} | {len(runs)} | {total('questions')} | {total('answer_records')} | {total('duplicates')} | {lost} | {total('repeats_on_other_topics')} | {signals} | {total('exits')} |")
EOF
