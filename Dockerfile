# syntax=docker/dockerfile:1
#
# geodwell container image (see docs/packaging.md).
#
#   docker build -t geodwell .
#   docker run --rm -p 127.0.0.1:8080:8080 -v geodwell-data:/var/lib/geodwell geodwell
#
# Two stages: the official Rust image compiles the release binary; a Debian slim image of the same
# release (same glibc) runs it as an unprivileged user. The runtime carries curl only for the
# HEALTHCHECK (the binary has no probe subcommand and the service speaks plain HTTP), plus the CA
# bundle for outbound HTTPS.

# Keep RUST_VERSION at the toolchain CI uses (`rustc --version` in .ci/run's output).
ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
WORKDIR /src
# The build context is filtered by .dockerignore (no target/, .git/, tests, docs).
COPY . .
# BuildKit cache mounts keep the registry and target dir between builds, so a source change
# recompiles geodwell, not its dependencies. `strip = "debuginfo"` drops the DWARF line tables that
# `[profile.release] debug = 1` adds for local profiling (tens of MB) but keeps symbol names, so
# panics and `perf` still show function names.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    CARGO_PROFILE_RELEASE_STRIP=debuginfo cargo build --release --locked --bin geodwell \
 && install -D -m 0755 target/release/geodwell /out/geodwell

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
# A fixed numeric uid/gid so that bind-mounted data dirs can be chowned to it (`chown 10001:10001`)
# and so that orchestrators can verify runAsNonRoot.
RUN groupadd --system --gid 10001 geodwell \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/geodwell --no-create-home \
      --shell /usr/sbin/nologin geodwell \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/geodwell
COPY --from=builder /out/geodwell /usr/local/bin/geodwell

# Configuration through GEODWELL_<KEY> variables (src/config.rs; an unknown GEODWELL_* variable
# is a startup error). The image listens on all interfaces inside the container; publish the port
# with care (see docs/packaging.md). No fences are preloaded: the embedded default points at
# config/fences.geojson relative to the working directory, which the image does not ship.
ENV GEODWELL_LISTEN=0.0.0.0:8080 \
    GEODWELL_DATA_DIR=/var/lib/geodwell \
    GEODWELL_FENCES_FILE=""
WORKDIR /var/lib/geodwell
USER 10001:10001
VOLUME ["/var/lib/geodwell"]
EXPOSE 8080

# Liveness over the real HTTP path. The port follows GEODWELL_LISTEN (whatever comes after its
# last ':'), so overriding the listen address does not break the probe. start-period covers a warm
# start: the listener accepts only once the store is restored, which takes seconds for millions of
# live pairs. scripts/check-packaging.sh runs this exact command against a live server.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:${GEODWELL_LISTEN##*:}/healthz" || exit 1

# SIGTERM starts a graceful shutdown (stop accepting, close subscribers with 1001, drain the
# shards, final commit) bounded by shutdown_grace (10 s); give `docker stop` more than that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/geodwell"]
CMD ["serve"]
