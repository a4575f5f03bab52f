#!/usr/bin/env bash
# End-to-end benchmark: the release server and `geodwell simulate` on this machine (client and
# server share its cores). See docs/bench-e2e.md.
#
#   benches/e2e.sh            full run (about 10 minutes)
#   benches/e2e.sh --quick    smoke run: short steps, small fleets (CI)
#   benches/e2e.sh --rss-only part 3 only (memory)
#   E2E_BIN=path/to/geodwell benches/e2e.sh ...   measure that binary (e.g. an older build)
#
# Parts:
#   1. sustained rate: for HTTP NDJSON and WebSocket ingest, store off (`none`) and on (`sync`),
#      rates rise until a step misses; a step is sustained when >= 95 % of the target rate is
#      accepted, nothing is late or lost, and p99 ingest-to-event latency is <= 10 ms.
#   2. ingest -> ENTER latency at 50,000 fixes/s with lateness 0.
#   3. RSS per live pair at 100k, 1M and 1.9M live pairs (whole process).
# Output: markdown tables on stdout, JSON in target/bench/e2e.json, per-run reports and server
# logs in target/bench/e2e/.
set -euo pipefail

cd "$(dirname "$0")/.."
QUICK=0
RSS_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --rss-only) RSS_ONLY=1 ;;
    *) echo "usage: benches/e2e.sh [--quick] [--rss-only]" >&2; exit 2 ;;
  esac
done

if [[ -n "${E2E_BIN:-}" ]]; then
  BIN=$(realpath "$E2E_BIN")
else
  cargo build --release --quiet
  BIN="$PWD/target/release/geodwell"
fi
OUT="${CARGO_TARGET_DIR:-$PWD/target}/bench/e2e"
rm -rf "$OUT"
mkdir -p "$OUT"
# shellcheck source=benches/common/server.sh
source benches/common/server.sh

# start_server NAME DURABILITY LATENESS
start_server() {
  local name=$1 durability=$2 lateness=$3
  rm -rf "$OUT/data-$name"
  GEODWELL_DURABILITY="$durability" GEODWELL_LOG=warn "$BIN" serve --clock event \
    --lateness "$lateness" --listen "127.0.0.1:$PORT" --data-dir "$OUT/data-$name" \
    >"$OUT/server-$name.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 100); do
    if curl -sf "$URL/readyz" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "server did not become ready; log:" >&2
  cat "$OUT/server-$name.log" >&2
  exit 1
}

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status"; }
metric_sum() { curl -s "$URL/metrics" | awk -v m="$1" '$1 ~ "^"m"({|$)" {s += $2} END {printf "%d", s}'; }

# json FILE EXPR: evaluate a Python expression over the report `r`.
json() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1"; }

if [[ $QUICK == 1 ]]; then
  STEP=2s; DEVICES=20000; SITES=300; RATES="20000 50000"; LAT_DUR=3s; RSS_SIZES="20000"; RSS_SYNC_SIZE=20000
else
  STEP=8s; DEVICES=100000; SITES=1000; RATES="50000 100000 150000 200000 250000 300000 400000"
  LAT_DUR=20s; RSS_SIZES="100000 1000000 1900000"; RSS_SYNC_SIZE=1000000
fi

echo "# geodwell end-to-end benchmark ($(date -u +%FT%TZ), $(nproc) cores, quick=$QUICK)"
echo
SUSTAINED_JSON=""
LAT_JSON=""
if [[ $RSS_ONLY == 0 ]]; then
echo "## 1. Sustained rate (event clock, lateness 0, one connection, $DEVICES devices, $SITES sites, ${STEP} per step)"
echo
echo "| transport | store | target/s | accepted/s | late | errors | p50 ms | p99 ms | p99.9 ms | max ms | sustained |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
for transport in http ws; do
  for durability in none sync; do
    start_server "$transport-$durability" "$durability" 0ms
    best=0
    for rate in $RATES; do
      rep="$OUT/rate-$transport-$durability-$rate.json"
      # A step that loses fixes exits non-zero after writing its report: that is a missed step
      # (judged below), not a failed benchmark; no report at all is.
      "$BIN" simulate --server "$URL" --transport "$transport" --devices "$DEVICES" --sites "$SITES" \
        --rate "$rate" --duration "$STEP" --batch 20000 --quiet --report "$rep" >/dev/null \
        || [[ -s $rep ]]
      ok=$(json "$rep" "int(r['accepted_per_s'] >= 0.95*$rate and r['late']==0 and not r['errors'] and r['latency']['all']['count']>0 and r['latency']['all']['p99_us'] <= 10000)")
      json "$rep" "'| $transport | $durability | $rate | %.0f | %d | %d | %.2f | %.2f | %.2f | %.2f | %s |' % (r['accepted_per_s'], r['late'], sum(r['errors'].values()), r['latency']['all']['p50_us']/1000, r['latency']['all']['p99_us']/1000, r['latency']['all']['p999_us']/1000, r['latency']['all']['max_us']/1000, 'yes' if $ok else 'no')"
      if [[ $ok == 1 ]]; then best=$rate; else break; fi
    done
    SUSTAINED_JSON="$SUSTAINED_JSON\"$transport-$durability\": $best, "
    stop_server
  done
done
echo
echo "Highest sustained rate (fixes/s): {${SUSTAINED_JSON%, }}"
echo

echo "## 2. Ingest -> ENTER latency at 50,000 fixes/s, lateness 0 ($LAT_DUR, HTTP NDJSON, one connection)"
echo
echo "| store | accepted/s | ENTERs | p50 ms | p99 ms | p99.9 ms | max ms | unmatched |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for durability in none sync; do
  start_server "lat-$durability" "$durability" 0ms
  rep="$OUT/latency-$durability.json"
  "$BIN" simulate --server "$URL" --devices "$DEVICES" --sites "$SITES" --rate 50000 \
    --duration "$LAT_DUR" --batch 20000 --quiet --report "$rep" >/dev/null
  json "$rep" "'| $durability | %.0f | %d | %.2f | %.2f | %.2f | %.2f | %d |' % (r['accepted_per_s'], r['latency']['enter']['count'], r['latency']['enter']['p50_us']/1000, r['latency']['enter']['p99_us']/1000, r['latency']['enter']['p999_us']/1000, r['latency']['enter']['max_us']/1000, r['latency']['enter']['unmatched'])"
  LAT_JSON="$LAT_JSON\"$durability\": $(json "$rep" "json.dumps(r['latency']['enter'])"), "
  stop_server
done
echo

fi

echo "## 3. Memory: RSS per live pair (whole process; 0.9 n devices parked inside fences, one fix each)"
echo
echo "| store | devices | live pairs | RSS MiB | empty RSS MiB | event log | RSS / pair B | (RSS - empty) / pair B |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
RSS_JSON=""
for durability in none sync; do
  sizes=$RSS_SIZES
  # With the store on, one size: what it adds is its page cache, not a per-pair cost.
  if [[ $durability == sync ]]; then sizes=$RSS_SYNC_SIZE; fi
  for n in $sizes; do
    start_server "rss-$durability-$n" "$durability" 0ms
    base=$(rss_kb)
    # One fix from each of 0.9 n parked devices (a fixed 30 s interval puts every device's first
    # report before anyone's second); about 11 % of sites hold a nested dock fence, so the live
    # pairs come out near n.
    devs=$(( n * 9 / 10 ))
    "$BIN" simulate --server "$URL" --devices "$devs" --sites 2000 --parked 1 --fixes "$devs" --max \
      --interval-min 30s --interval-max 30s --no-measure --batch 5000 --quiet \
      --report "$OUT/rss-$durability-$n.json" >/dev/null
    sleep 2
    if [[ $durability == sync ]]; then
      # Measured at rest: once the checkpoint rounds that write the load's devices are done
      # (a round in progress holds its chunks and redb's write buffer for a moment).
      done_rounds=$(metric_sum geodwell_store_checkpoints_total)
      for _ in $(seq 1 60); do
        sleep 0.5
        now=$(metric_sum geodwell_store_checkpoints_total)
        (( now >= done_rounds + 2 )) && break
      done
      sleep 1
    fi
    rss=$(rss_kb)
    pairs=$(metric_sum geodwell_pairs_live)
    devices=$(metric_sum geodwell_devices)
    logged=$(metric_sum geodwell_event_log_events)
    per=$(( rss * 1024 / (pairs > 0 ? pairs : 1) ))
    marg=$(( (rss - base) * 1024 / (pairs > 0 ? pairs : 1) ))
    echo "| $durability | $devices | $pairs | $((rss / 1024)) | $((base / 1024)) | $logged | $per | $marg |"
    RSS_JSON="$RSS_JSON{\"store\": \"$durability\", \"devices\": $devices, \"pairs\": $pairs, \"rss_kib\": $rss, \"empty_rss_kib\": $base, \"event_log\": $logged, \"bytes_per_pair\": $per, \"marginal_bytes_per_pair\": $marg}, "
    stop_server
  done
done

mkdir -p "$(dirname "$OUT")"
cat >"$OUT/../e2e.json" <<EOF
{"quick": $QUICK, "sustained_fixes_per_s": {${SUSTAINED_JSON%, }}, "enter_latency_50k": {${LAT_JSON%, }}, "rss": [${RSS_JSON%, }]}
EOF
echo
echo "JSON: $OUT/../e2e.json"
