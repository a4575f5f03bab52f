#!/usr/bin/env bash
# Durable ingest against no store, side by side in one run (docs/bench-durability.md):
#
#   1. throughput: the same 5,000-fix NDJSON batches (100k devices, 200 fence sites) from
#      `geodwell simulate --max` over 1 and over 4 connections, `none` and `sync` alternating,
#      two rounds each; reports accepted fixes/s and sync / none;
#   2. single-fix POSTs (one connection, keep-alive, one after another): the answer's latency
#      p50 / p99 / p99.9, `none` and `sync`.
#
#   benches/durable_ingest.sh [--quick]      --quick: 3 s runs, one round (CI smoke)
#   E2E_BIN=path/to/geodwell benches/durable_ingest.sh   measure that binary
#
# Output: markdown on stdout, JSON in target/bench/durable_ingest.json.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
if [[ -n "${E2E_BIN:-}" ]]; then
  BIN=$(realpath "$E2E_BIN")
else
  cargo build --release --quiet
  BIN="$PWD/target/release/geodwell"
fi
OUT="${CARGO_TARGET_DIR:-$PWD/target}/bench/durable_ingest"
rm -rf "$OUT"
mkdir -p "$OUT"
# shellcheck source=benches/common/server.sh
source benches/common/server.sh

start_server() {
  local mode=$1
  rm -rf "$OUT/data"
  GEODWELL_DURABILITY="$mode" GEODWELL_LOG=warn "$BIN" serve --clock event --lateness 0s \
    --listen "127.0.0.1:$PORT" --data-dir "$OUT/data" --fences-file "" \
    >"$OUT/server-$mode.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 100); do
    curl -sf "$URL/healthz" >/dev/null && return 0
    sleep 0.1
  done
  echo "server did not start" >&2
  exit 1
}

DURATION=10s
ROUNDS=2
SINGLE=5000
if [[ $QUICK == 1 ]]; then DURATION=3s; ROUNDS=1; SINGLE=500; fi

: >"$OUT/rates.txt"
echo "## Durable ingest: sync vs none (same batches, one run)"
echo
for conns in 1 4; do
  for round in $(seq 1 $ROUNDS); do
    order="none sync"
    (( round % 2 == 0 )) && order="sync none"
    for mode in $order; do
      start_server "$mode"
      line=$("$BIN" simulate --server "$URL" --devices 100000 --sites 200 --max --batch 5000 \
        --connections "$conns" --duration "$DURATION" 2>&1 | grep -E '^fixes:' || true)
      stop_server
      rate=$(sed -E 's/.*= ([0-9]+) accepted\/s.*/\1/' <<<"$line")
      echo "  $conns connection(s), round $round, $mode: $rate fixes/s"
      echo "$conns $mode $rate" >>"$OUT/rates.txt"
    done
  done
done

python3 - "$OUT" "$SINGLE" "$BIN" "$PORT" <<'PY' > "$OUT/single.json"
import http.client, json, os, subprocess, sys, time, shutil
out, n, binary, port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
res = {}
for mode in ["none", "sync", "none", "sync"]:
    d = os.path.join(out, "data")
    shutil.rmtree(d, ignore_errors=True)
    env = dict(os.environ, GEODWELL_DURABILITY=mode, GEODWELL_LOG="warn")
    p = subprocess.Popen([binary, "serve", "--clock", "event", "--lateness", "0s", "--listen",
                          f"127.0.0.1:{port}", "--data-dir", d, "--fences-file", ""],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/healthz"); c.getresponse().read(); break
        except OSError:
            time.sleep(0.1)
    lat = []
    t0 = 1767225600000
    for i in range(n):
        body = json.dumps({"device": f"d{i % 1000}", "ts": t0 + i * 1000, "lat": 50.0, "lon": 10.0})
        s = time.perf_counter()
        c.request("POST", "/v1/fixes", body, {"content-type": "application/json"})
        r = c.getresponse(); r.read()
        lat.append(time.perf_counter() - s)
        assert r.status == 200, r.status
    p.terminate(); p.wait()
    lat.sort()
    q = lambda x: round(lat[min(len(lat) - 1, int(len(lat) * x))] * 1000, 3)
    res.setdefault(mode, []).append({"p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999)})
print(json.dumps(res))
PY

python3 - "$OUT" <<'PY'
import json, sys, statistics
out = sys.argv[1]
rates = {}
for line in open(out + "/rates.txt"):
    conns, mode, rate = line.split()
    rates.setdefault(conns + "-" + mode, []).append(int(rate))
single = json.load(open(out + "/single.json"))
print()
print("| connections | none fixes/s (rounds) | sync fixes/s (rounds) | sync / none | goal >= 0.8 |")
print("| ---: | --- | --- | ---: | --- |")
summary = {"throughput": {}, "single_fix": single}
for conns in ("1", "4"):
    n = rates.get(conns + "-none", [])
    s = rates.get(conns + "-sync", [])
    mn, ms = statistics.mean(n), statistics.mean(s)
    ratio = ms / mn
    summary["throughput"][conns] = {"none": n, "sync": s, "ratio": round(ratio, 3)}
    print(f"| {conns} | **{mn:.0f}** ({', '.join(map(str, n))}) | **{ms:.0f}** ({', '.join(map(str, s))}) | **{ratio:.2f}x** | {'met' if ratio >= 0.8 else 'MISSED'} |")
print()
print("Single-fix POST, answered (with sync: durable), one connection, one request after another:")
print()
print("| store | p50 ms | p99 ms | p99.9 ms | goal p99 <= 2 ms (sync) |")
print("| --- | ---: | ---: | ---: | --- |")
for mode in ("none", "sync"):
    for r in single[mode]:
        goal = ("met" if r["p99_ms"] <= 2.0 else "MISSED") if mode == "sync" else ""
        print(f"| {mode} | {r['p50_ms']} | {r['p99_ms']} | {r['p999_ms']} | {goal} |")
json.dump(summary, open(out + "/../durable_ingest.json", "w"), indent=1)
print()
print("JSON: target/bench/durable_ingest.json")
PY
