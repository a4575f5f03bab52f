#!/usr/bin/env bash
# Runs schemathesis (property-based API testing, from PyPI) against a live geodwell with the
# OpenAPI document it serves at /openapi.json (docs/api.md).
#
#   scripts/schemathesis.sh                  build with `cargo build`, use target/debug/geodwell
#   scripts/schemathesis.sh path/to/geodwell
#   ST_MAX_TIME=300 ST_SEED=123 scripts/schemathesis.sh   longer run / reproduce a seed
#
# The server runs with API keys on (schemathesis sends an admin key; its auth checks send none or a
# wrong one), the default `sync` store in a temporary directory, and the event clock. Checks: all
# of schemathesis's, with tests/schemathesis/schemathesis.toml's per-operation exceptions.
# Not exercised: the two WebSocket endpoints (schemathesis speaks HTTP only; tests/it/ covers them)
# and `POST /v1/webhooks`, whose generated URLs would make the server call arbitrary hosts
# (tests/it/webhooks.rs covers it against a local receiver). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="$ROOT/target/schemathesis"
mkdir -p "$OUT"
ST_VERSION=4.32.5

if ! command -v st >/dev/null || [[ "$(st --version 2>/dev/null)" != *"$ST_VERSION"* ]]; then
  echo "== pip install schemathesis==$ST_VERSION"
  python3 -m pip install --quiet --disable-pip-version-check "schemathesis==$ST_VERSION"
fi

if [[ $# -ge 1 ]]; then
  BIN=$(realpath "$1")
else
  echo "== cargo build"
  cargo build --quiet --bin geodwell
  BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/geodwell"
fi

DATA=$(mktemp -d)
KEY="schemathesis-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
LOG="$OUT/server.log"
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
cleanup() {
  geodwell_stop
  rm -rf "$DATA"
}
trap cleanup EXIT
geodwell_start "$LOG" env GEODWELL_API_KEYS="schemathesis:admin:$KEY" GEODWELL_FENCES_FILE="" \
  GEODWELL_LOG=warn,geodwell=info \
  "$BIN" serve --clock event --lateness 0s --listen 127.0.0.1:0 --data-dir "$DATA"

echo "== schemathesis against 127.0.0.1:$PORT (max ${ST_MAX_TIME:-60}s)"
SEED_ARGS=()
[[ -n "${ST_SEED:-}" ]] && SEED_ARGS=(--seed "$ST_SEED")
cd tests/schemathesis
set +e
st --no-color run "http://127.0.0.1:$PORT/openapi.json" \
  -H "Authorization: Bearer $KEY" \
  --max-time "${ST_MAX_TIME:-60}" --workers 1 \
  --exclude-path-regex '/ws$' \
  --exclude-name 'POST /v1/webhooks' \
  "${SEED_ARGS[@]}" \
  --report junit --report-dir "$OUT" 2>&1 | tee "$OUT/run.txt"
rc=${PIPESTATUS[0]}
set -e
if ! kill -0 "$SERVER_PID" 2>/dev/null; then
  echo "schemathesis.sh: the server died during the run; its log:" >&2
  tail -50 "$LOG" >&2
  exit 1
fi
if grep -q "panicked" "$LOG"; then
  echo "schemathesis.sh: the server logged a panic:" >&2
  grep -A5 "panicked" "$LOG" >&2
  exit 1
fi
exit "$rc"
