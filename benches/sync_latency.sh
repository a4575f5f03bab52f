#!/usr/bin/env bash
# The cost of `store.durability = "sync"` on latency, side by side in one run: the same paced
# traffic (`geodwell simulate`, HTTP NDJSON, one connection, event clock with lateness 0) against
# `none` and `sync` servers, and optionally against a second binary (an older build), rounds
# interleaved so that the machine's drift hits every variant alike. See docs/bench-durability.md.
#
#   benches/sync_latency.sh                                  this build, none and sync
#   BASE_BIN=path/to/old/geodwell benches/sync_latency.sh    and that binary's sync too
#   ROUNDS=3 RATES="50000 100000" DURATION=20s benches/sync_latency.sh
#   LINGER=2ms benches/sync_latency.sh      smaller batches (the simulator's --linger; default 10ms)
#
# Output: a markdown table per rate (median over rounds of ENTER p50 / p99 and all-events p99),
# reports in target/bench/sync_latency/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
RATES=${RATES:-"50000 100000"}
DURATION=${DURATION:-20s}
LINGER=${LINGER:-10ms}
DEVICES=${DEVICES:-100000}
SITES=${SITES:-1000}
cargo build --release --quiet
BIN=$PWD/target/release/geodwell
OUT=${CARGO_TARGET_DIR:-target}/bench/sync_latency
mkdir -p "$OUT"
# shellcheck source=benches/common/server.sh
source benches/common/server.sh

variants=("this:none:$BIN" "this:sync:$BIN")
if [[ -n "${BASE_BIN:-}" ]]; then
  variants+=("base:sync:$(realpath "$BASE_BIN")")
fi
for rate in $RATES; do
  for round in $(seq 1 "$ROUNDS"); do
    for v in "${variants[@]}"; do
      IFS=: read -r name durability bin <<<"$v"
      rm -rf "$OUT/data"
      GEODWELL_DURABILITY="$durability" GEODWELL_LOG=warn "$bin" serve --clock event \
        --lateness 0ms --listen "127.0.0.1:$PORT" --data-dir "$OUT/data" >"$OUT/server.log" 2>&1 &
      SERVER_PID=$!
      for _ in $(seq 1 100); do curl -sf "$URL/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
      "$BIN" simulate --server "$URL" --devices "$DEVICES" --sites "$SITES" --rate "$rate" \
        --duration "$DURATION" --batch 20000 --linger "$LINGER" --quiet \
        --report "$OUT/$name-$durability-$rate-$round.json" >/dev/null
      stop_server
      echo "done: $name $durability $rate round $round" >&2
    done
  done
done
python3 - "$OUT" "$RATES" "$ROUNDS" "${variants[@]}" <<'PY'
import json, statistics, sys
out, rates, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
variants = [v.split(":")[:2] for v in sys.argv[4:]]
for rate in rates:
    print(f"\n### {int(rate):,} fixes/s, {rounds} rounds (median, and each round)\n")
    print("| build | store | accepted/s | ENTER p50 ms | ENTER p99 ms | all events p99 ms | all events p99.9 ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, dur in variants:
        rs = [json.load(open(f"{out}/{name}-{dur}-{rate}-{k}.json")) for k in range(1, rounds + 1)]
        def col(f):
            vals = [f(r) for r in rs]
            return f"**{statistics.median(vals):.2f}** ({', '.join(f'{v:.2f}' for v in vals)})"
        acc = statistics.median(r["accepted_per_s"] for r in rs)
        print(f"| {name} | {dur} | {acc:,.0f} | "
              + col(lambda r: r["latency"]["enter"]["p50_us"] / 1000) + " | "
              + col(lambda r: r["latency"]["enter"]["p99_us"] / 1000) + " | "
              + col(lambda r: r["latency"]["all"]["p99_us"] / 1000) + " | "
              + col(lambda r: r["latency"]["all"]["p999_us"] / 1000) + " |")
PY
