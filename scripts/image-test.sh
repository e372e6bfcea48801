#!/usr/bin/env bash
# Tests the image scripts/image.sh built, as a container runtime runs it: `umoci unpack` makes an OCI
# runtime bundle from the image (its entrypoint, user, environment and working directory), and runc
# runs it in fresh namespaces with no network but its own loopback. Checked: `lacuna --version`, then
# in-process MIGRES answering 3 HotpotQA questions with `lacuna run` against the built-in fake LLM
# (`lacuna bench fake-llm`, the container's main process) over the index `lacuna index` builds inside.
#
# Usage: sudo scripts/image-test.sh   (after scripts/image.sh; installs runc if missing)
# Environment: LACUNA_DATA (default ../shared/data), LACUNA_IMAGE_DIR (default $LACUNA_CACHE/image).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
OUT="${LACUNA_IMAGE_DIR:-$CACHE/image}"
DATA="${LACUNA_DATA:-$(pwd)/../shared/data}"
log() { echo "image-test: $*" >&2; }
fail() { echo "image-test: FAILED: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root (runc)"
[ -d "$OUT/oci" ] || fail "no image at $OUT/oci: run scripts/image.sh first"
# The layout holds the one tag scripts/image.sh wrote.
TAG=$(umoci ls --layout "$OUT/oci" | head -1)
command -v runc > /dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends runc >&2

work=$(mktemp -d)
id="lacuna-image-test-$$"
cleanup() {
    runc kill "$id" KILL 2> /dev/null || true
    runc delete --force "$id" 2> /dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

umoci unpack --image "$OUT/oci:$TAG" "$work/bundle" > /dev/null
# The test's files: the dataset read-only at /data, a writable /out for the answers.
mkdir -p "$work/out"
chown 10001:10001 "$work/out"

# The bundle's config.json as umoci derived it from the image, with the command's arguments after
# the image's entrypoint, no terminal, and the two mounts. Prints the image's user as UID:GID.
configure() {
    python3 - "$work/bundle/config.json" "$DATA/hotpotqa" "$work/out" "$@" <<'PY'
import json, sys
path, data, out, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
config = json.load(open(path + ".image")) if args else None
config = config or json.load(open(path))
process = config["process"]
entrypoint = process["args"][:1]  # umoci puts Entrypoint then Cmd; keep the entrypoint
assert entrypoint == ["/usr/local/bin/lacuna"], f"the image's entrypoint is {process['args']}"
process["args"] = entrypoint + args
process["terminal"] = False
namespaces = {n["type"]: n for n in config["linux"]["namespaces"]}
# A network namespace of its own with no path: only its loopback, nothing outside (--network none).
assert "network" in namespaces and "path" not in namespaces["network"], config["linux"]["namespaces"]
config["mounts"] += [
    {"destination": "/data", "type": "bind", "source": data, "options": ["rbind", "ro"]},
    {"destination": "/out", "type": "bind", "source": out, "options": ["rbind", "rw"]},
]
json.dump(config, open(path, "w"), indent=1)
print(f"{process['user']['uid']}:{process['user']['gid']}")
PY
}
cp "$work/bundle/config.json" "$work/bundle/config.json.image"

user=$(configure --version)
[ "$user" = "10001:10001" ] || fail "the image runs as $user, expected the non-root 10001:10001"
version=$(runc run --bundle "$work/bundle" "$id")
[ "$version" = "lacuna $TAG" ] || fail "lacuna --version printed '$version'"
log "lacuna --version: $version (as $user, no network)"

configure bench fake-llm --listen 127.0.0.1:8377 --ms 1 > /dev/null
runc run --detach --bundle "$work/bundle" "$id" > "$work/fake-llm.log" 2>&1 < /dev/null
in_container() {
    runc exec --user "$user" --cwd /home/lacuna \
        --env LACUNA__LLM__BASE_URL=http://127.0.0.1:8377/v1 --env LACUNA__SEARCH__INDEX_DIR=/home/lacuna/index \
        "$id" /usr/local/bin/lacuna "$@"
}
in_container index --corpus /data/corpus.jsonl >&2
in_container run --questions /data/questions.jsonl --limit 3 --out /out/answers.jsonl >&2
python3 - "$work/out/answers.jsonl" <<'PY' || fail "the run did not end in 3 answers over retrieved passages"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
assert len(records) == 3, f"{len(records)} records"
for record in records:
    assert record["status"] == "answered" and record["answer"], record
    # The fake LLM writes schema-valid nonsense, so citations are not guaranteed; retrieval and the
    # re-ranker (ONNX Runtime in the image) must have run.
    steps = json.dumps(record["trace"])
    assert "hotpotqa-" in steps, f"{record['question_id']}: no passage retrieved from the index"
print("image-test: 3 questions answered in the container:", [r["answer"][:30] for r in records], file=sys.stderr)
PY
log "passed"
