#!/usr/bin/env bash
# Point and occupancy queries, geodwell (HTTP) side by side with PostGIS (psql), issue 16.
# See benches/queries_postgis.py for what is asked and docs/bench-postgis.md for the results.
#
#   benches/queries_postgis.sh                       # 10,000 fences, 5,000 points, 100,000 inside
#   N_FENCES=2000 N_POINTS=500 N_INSIDE=5000 benches/queries_postgis.sh   # a smoke run
#
# Installs PostGIS from the distribution's packages if the server lacks it (as
# benches/postgis.sh does), builds the release binary (or takes E2E_BIN), starts it (event
# clock, no store, 2 shards), runs the queries, stops it. Exit status: 0 when every answer was
# identical on both sides, 1 when some differ, other non-zero on failures.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGET=${CARGO_TARGET_DIR:-target}
export PGUSER=${PGUSER:-postgres}
export DB=${DB:-geodwell_bench}
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
die() {
  echo "queries_postgis.sh: error: $*" >&2
  exit 3
}
pg() { psql -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
pg_admin() { psql -X -q -v ON_ERROR_STOP=1 -d "${PGADMINDB:-postgres}" "$@"; }
# shellcheck source=benches/common/postgis.sh
source benches/common/postgis.sh
ensure_postgis
if [[ -z "${E2E_BIN:-}" ]]; then
  cargo build --release --quiet
fi
BIN=${E2E_BIN:-$TARGET/release/geodwell}
# shellcheck source=benches/common/server.sh
source benches/common/server.sh
mkdir -p "$TARGET/bench"
GEODWELL_DURABILITY=none GEODWELL_LOG=warn "$BIN" serve --clock event --lateness 0s --shards 2 \
  --listen "127.0.0.1:$PORT" --fences-file "" >"$TARGET/bench/queries_postgis-server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
  curl -sf "$URL/healthz" >/dev/null && break
  kill -0 "$SERVER_PID" 2>/dev/null || die "the server did not start: $(cat "$TARGET/bench/queries_postgis-server.log")"
  sleep 0.1
done
GEODWELL_ADDR=127.0.0.1:$PORT OUT=$TARGET/bench/queries_postgis.json \
  WORK=$TARGET/bench/queries-postgis-data python3 benches/queries_postgis.py
