#!/usr/bin/env bash
# The test command: installs what the tests need (ONNX Runtime, the re-ranker, the small LLM and its
# server, Apache Kafka from Maven Central, helm, Prometheus, Phoenix, all cached under $LACUNA_CACHE; as
# root, Debian's chromium for the live page's browser test), builds, checks the Helm chart, starts a
# test LLM server and Apache Kafka on 127.0.0.1, runs every test, and stops them by PID. Safe to run
# again: installed parts are reused.
set -euo pipefail
cd "$(dirname "$0")/.."

export LACUNA_CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
# The 0.5B model is enough to check the loop's structure and ~3x faster than the 1.5B default.
export LACUNA_MODEL="${LACUNA_TEST_MODEL:-qwen0.5b}"
# The re-ranker's float graph (the CUDA provider's), derived from the int8 one: its agreement is tested.
export LACUNA_FLOAT_GRAPH=1
# Each install's exports are taken in two steps: `eval "$(...)"` alone would go on past a failed install.
setup_env=$(scripts/setup.sh --env)
eval "$setup_env"
# Debian's Prometheus and promtool, for the dashboard and alerting-rule tests (tests/prometheus.rs).
prometheus_env=$(scripts/prometheus.sh --env)
eval "$prometheus_env"

# Apache Kafka 4.4.0, the broker of every broker test: its jars from Maven Central, checked against
# scripts/kafka/jars.sha256 (a second run resolves nothing). A failure stops here, naming the artifact:
# no other broker stands in.
scripts/kafka.sh install > /dev/null

# strace, which holds a process's exec for tests/broker.rs, as a loaded machine can (Debian's package).
command -v strace > /dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends strace >&2

# Arize Phoenix, the OpenTelemetry backend the trace tests export to (tests/traces.rs): a venv of
# wheels under the cache, about a minute the first time.
scripts/phoenix.sh install

# Headless Chromium and chromedriver for the live page's browser test (tests/serve_page.rs): Debian's
# packages, installed when missing if we are root; without them that test says SKIPPED.
if ! command -v chromedriver > /dev/null && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >&2 ||
        echo "test: could not install chromium (is the Debian mirror reachable?): the browser test will skip" >&2
fi

# Build artefacts live outside the repo, so a fresh clone reuses an earlier build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$LACUNA_CACHE/target}"
# Compile everything before the LLM starts: the model slows down 10x beside a compile.
cargo build --tests --locked
# The Helm chart: lint, render with helm/lacuna/ci/*.yaml, validate against the Kubernetes schemas.
scripts/chart-test.sh

port="${LACUNA_TEST_LLM_PORT:-18377}"
# Its own ports (19292 clients, 19293 its controller): not those of a test broker or trial left running.
kafka_port="${LACUNA_TEST_KAFKA_PORT:-19292}"
trap 'scripts/llm-server.sh stop --port "$port" || true; scripts/kafka.sh stop --port "$kafka_port" || true' EXIT
export LACUNA_LLM_PORT="$port" LACUNA_LLM_THREADS="${LACUNA_LLM_THREADS:-2}"
scripts/llm-server.sh start --model "$LACUNA_MODEL_PATH"
export LACUNA_TEST_LLM_URL="http://127.0.0.1:$port/v1"
# One combined Apache Kafka broker and controller (KRaft) for the broker tests, with fresh storage each
# run; tests that stop or crash a broker start one of their own (tests/support/cluster.rs).
scripts/kafka.sh stop --port "$kafka_port" || true
scripts/kafka.sh start --port "$kafka_port"
export LACUNA_TEST_KAFKA="127.0.0.1:$kafka_port"

cargo test --locked "$@"

# Schemathesis against `lacuna serve`'s OpenAPI document, with and without a token: the document and
# the server must agree on every route, status, header and body (scripts/schemathesis.sh).
if command -v python3 > /dev/null; then
    scripts/schemathesis.sh
else
    echo "test: SKIPPED the Schemathesis runs: no python3" >&2
fi

# The container image: built from a debootstrap root with umoci (a release build), then run with runc
# without network (scripts/image-test.sh). Both need root; LACUNA_SKIP_IMAGE=1 leaves them out.
if [ "${LACUNA_SKIP_IMAGE:-0}" = 1 ]; then
    echo "test: SKIPPED the image build and test (LACUNA_SKIP_IMAGE=1)" >&2
elif [ "$(id -u)" != 0 ]; then
    echo "test: SKIPPED the image build and test: debootstrap and runc need root (run sudo scripts/image.sh && sudo scripts/image-test.sh)" >&2
else
    scripts/image.sh
    scripts/image-test.sh
fi
