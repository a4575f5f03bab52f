#!/usr/bin/env bash
# Cluster figures beside one process, in one run (docs/bench-cluster.md): throughput with 1, 2
# and 3 nodes, single-fix answer latency, ingest -> ENTER latency, takeover phases after a
# kill -9, ingest and events through a NATS server's kill -9 and restart beside a bare JetStream
# publisher, checkpoint size and time.
#
#   benches/cluster.sh [--quick]          --quick: 3 s runs, 16 partitions (CI smoke)
#   benches/cluster.sh --nats-kill [--quick]   only the NATS server's kill, on two nodes
#   E2E_BIN=path/to/geodwell benches/cluster.sh          measure that binary
#   NATS_SERVER=path/to/nats-server benches/cluster.sh   that NATS server (default: PATH's)
#
# It starts its own 3-server NATS JetStream cluster on free loopback ports (replicas 3).
# Output: JSON and a table on stdout, JSON in target/bench/cluster.json.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${E2E_BIN:-}" ]]; then
  BIN=$(realpath "$E2E_BIN")
else
  cargo build --release --quiet
  BIN="$PWD/target/release/geodwell"
fi
# The bare JetStream publisher and stream watcher (benches/nats/js_probe.rs), from this tree.
cargo build --release --quiet --example js_probe
PROBE="${CARGO_TARGET_DIR:-$PWD/target}/release/examples/js_probe"
NATS="${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}"
[[ -x "$NATS" ]] || { echo "no nats-server (apt-get install nats-server, or set NATS_SERVER)" >&2; exit 1; }
OUT="${CARGO_TARGET_DIR:-$PWD/target}/bench/cluster"
rm -rf "$OUT"
mkdir -p "$OUT"
echo "nats-server: $("$NATS" --version)"
python3 benches/cluster.py "$BIN" "$NATS" "$OUT" "$PROBE" "$@"
