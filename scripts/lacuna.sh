#!/usr/bin/env bash
# Runs `lacuna` on the embedded default, installing what it needs first: ONNX Runtime, the re-ranker
# and the LLM (LACUNA_MODEL, default qwen1.5b) under $LACUNA_CACHE, a release build, the local LLM
# server on 127.0.0.1:8377, and, when no index exists yet, a BM25 index of LACUNA_CORPUS (default:
# the HotpotQA corpus in ../shared/data). Arguments go to `lacuna` unchanged.
#
#   scripts/lacuna.sh ask "Which team does Hugo Rodríguez Romero play for?"
#   scripts/lacuna.sh run --questions ../shared/data/hotpotqa/questions.jsonl --limit 5 --out answers.jsonl
#
# The LLM server keeps running afterwards (it takes seconds to load a model); stop it with
# `scripts/llm-server.sh stop`.
set -euo pipefail
cd "$(dirname "$0")/.."

export LACUNA_CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
eval "$(scripts/setup.sh --env)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$LACUNA_CACHE/target}"
cargo build --release --locked
lacuna="$CARGO_TARGET_DIR/release/lacuna"

index_dir="${LACUNA__SEARCH__INDEX_DIR:-lacuna-index}"
if [ ! -f "$index_dir/meta.json" ]; then
    "$lacuna" index --corpus "${LACUNA_CORPUS:-../shared/data/hotpotqa/corpus.jsonl}" --index-dir "$index_dir"
fi
scripts/llm-server.sh start --model "$LACUNA_MODEL_PATH"
exec "$lacuna" "$@"
