#!/usr/bin/env python3
"""Point and occupancy queries, geodwell over HTTP side by side with PostGIS over psql (issue 16).

Run by benches/queries_postgis.sh (which builds geodwell, makes sure PostGIS is installed and
starts the server); see docs/bench-postgis.md. Each side is asked the same questions about the
same data, one query at a time over its own protocol (HTTP keep-alive; one psql session), and
every answer is compared: a difference makes the exit status 1.

- contains: which of 10,000 small polygon fences cover a point (geodwell:
  GET /v1/fences?contains=LAT,LON; PostGIS: ST_Covers over a GiST index).
- occupancy: who is inside one fence that 100,000 devices are in, among 200,000 devices
  (geodwell: GET /v1/fences/{id}/devices paged to the end, and the `inside` count of
  GET /v1/fences/{id}; PostGIS: the same from a table of last positions by ST_Covers, and from
  a table of (fence, device) rows a trigger would maintain, keyset-paged on its primary key).
"""

import http.client
import json
import os
import random
import subprocess
import sys
import time

BASE_HOST, BASE_PORT = os.environ["GEODWELL_ADDR"].split(":")
DB = os.environ.get("DB", "geodwell_bench")
N_FENCES = int(os.environ.get("N_FENCES", "10000"))
N_POINTS = int(os.environ.get("N_POINTS", "5000"))
N_INSIDE = int(os.environ.get("N_INSIDE", "100000"))
OUT = os.environ.get("OUT", "target/bench/queries_postgis.json")
WORK = os.environ.get("WORK", "target/bench/queries-postgis-data")
T0 = 1_767_225_600_000
rng = random.Random(16)


def pcts(xs):
    xs = sorted(xs)
    at = lambda q: xs[min(len(xs) - 1, int((len(xs) - 1) * q))]
    return {"n": len(xs), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": xs[-1]}


# ---- data ----------------------------------------------------------------------------------
def polygon(cx, cy, r):
    k = rng.randint(4, 9)
    pts = []
    for i in range(k):
        a = 2 * 3.141592653589793 * i / k + rng.uniform(-0.2, 0.2)
        rr = r * rng.uniform(0.5, 1.0)
        import math

        pts.append([round(cx + rr * math.cos(a) / math.cos(math.radians(cy)), 7), round(cy + rr * math.sin(a), 7)])
    pts.append(pts[0])
    return pts


fences = []
for i in range(N_FENCES):
    cx, cy = rng.uniform(9.0, 11.0), rng.uniform(53.0, 54.0)
    fences.append((f"f{i:05}", polygon(cx, cy, rng.uniform(0.0005, 0.004))))
points = []
for i in range(N_POINTS):
    if i % 2 == 0:
        _, ring = fences[rng.randrange(len(fences))]
        xs, ys = [p[0] for p in ring], [p[1] for p in ring]
        points.append((round(rng.uniform(min(xs), max(xs)), 7), round(rng.uniform(min(ys), max(ys)), 7)))
    else:
        points.append((round(rng.uniform(9.0, 11.0), 7), round(rng.uniform(53.0, 54.0), 7)))
YARD = [[20.0, 10.0], [21.0, 10.0], [21.0, 11.0], [20.0, 11.0], [20.0, 10.0]]
inside = [(f"d{i:06}", round(rng.uniform(20.001, 20.999), 7), round(rng.uniform(10.001, 10.999), 7)) for i in range(N_INSIDE)]
outside = [(f"o{i:06}", round(rng.uniform(9.0, 11.0), 7), round(rng.uniform(53.0, 54.0), 7)) for i in range(N_INSIDE)]


# ---- geodwell ------------------------------------------------------------------------------
conn = http.client.HTTPConnection(BASE_HOST, int(BASE_PORT), timeout=120)


def call(method, path, body=None):
    headers = {"content-type": "application/json"} if body is not None else {}
    t = time.perf_counter()
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    data = r.read()
    ms = (time.perf_counter() - t) * 1000
    if r.status >= 300:
        sys.exit(f"{method} {path}: {r.status} {data[:300]!r}")
    return json.loads(data) if data else None, ms


def feature(fid, ring):
    return {"type": "Feature", "id": fid, "properties": {}, "geometry": {"type": "Polygon", "coordinates": [ring]}}


print(f"loading {N_FENCES} fences and {2 * N_INSIDE} devices into geodwell", file=sys.stderr)
for k in range(0, len(fences), 1000):
    fc = {"type": "FeatureCollection", "features": [feature(f, r) for f, r in fences[k : k + 1000]]}
    call("POST", "/v1/fences", json.dumps(fc))
call("PUT", "/v1/fences/yard", json.dumps(feature("yard", YARD)))
devs = inside + outside
for k in range(0, len(devs), 20000):
    body = "\n".join(json.dumps({"device": d, "ts": T0, "lat": lat, "lon": lon}) for d, lon, lat in devs[k : k + 20000])
    conn.request("POST", "/v1/fixes", body=body, headers={"content-type": "application/x-ndjson"})
    r = conn.getresponse()
    rep = json.loads(r.read())
    if r.status != 200 or rep["accepted"] != len(devs[k : k + 20000]):
        sys.exit(f"fixes: {r.status} {rep}")

# Warm-up, then the timed point queries.
for lon, lat in points[:200]:
    call("GET", f"/v1/fences?contains={lat},{lon}&limit=10000")
g_contains, g_answers = [], []
for lon, lat in points:
    page, ms = call("GET", f"/v1/fences?contains={lat},{lon}&limit=10000")
    g_contains.append(ms)
    g_answers.append(",".join(f["id"] for f in page["features"]))

g_count = []
for _ in range(30):
    f, ms = call("GET", "/v1/fences/yard")
    g_count.append(ms)
    assert f["inside"] == N_INSIDE, f["inside"]


def g_pages(limit):
    out, times, after = [], [], None
    while True:
        path = f"/v1/fences/yard/devices?limit={limit}" + (f"&after={after}" if after else "")
        page, ms = call("GET", path)
        times.append(ms)
        out.extend(d["device"] for d in page["devices"])
        after = page["next_after"]
        if after is None:
            return out, times


g_walk = {}
for limit in (1000, 10000):
    for _ in range(2):  # the second walk is timed
        devices, times = g_pages(limit)
    g_walk[limit] = (sorted(devices), times)

# ---- PostGIS -------------------------------------------------------------------------------
os.makedirs(WORK, exist_ok=True)


def psql(sql_file, timing=True):
    args = ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", DB, "-f", sql_file]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return out


def load():
    path = os.path.join(WORK, "load.sql")
    with open(path, "w") as f:
        f.write("DROP TABLE IF EXISTS q_fences, q_positions, q_inside;\n")
        f.write("CREATE TABLE q_fences (id text PRIMARY KEY, geom geometry(Polygon, 4326) NOT NULL);\n")
        f.write("CREATE TABLE q_positions (device text PRIMARY KEY, geom geometry(Point, 4326) NOT NULL);\n")
        f.write("CREATE TABLE q_inside (fence text, device text, entered_at timestamptz, PRIMARY KEY (fence, device));\n")
        f.write("COPY q_fences FROM STDIN;\n")
        for fid, ring in fences + [("yard", YARD)]:
            wkt = "POLYGON((" + ",".join(f"{x} {y}" for x, y in ring) + "))"
            f.write(f"{fid}\tSRID=4326;{wkt}\n")
        f.write("\\.\n")
        f.write("COPY q_positions FROM STDIN;\n")
        for d, lon, lat in devs:
            f.write(f"{d}\tSRID=4326;POINT({lon} {lat})\n")
        f.write("\\.\n")
        f.write("CREATE INDEX ON q_fences USING gist (geom);\nCREATE INDEX ON q_positions USING gist (geom);\n")
        f.write("INSERT INTO q_inside SELECT f.id, p.device, to_timestamp(%d / 1000.0) FROM q_fences f JOIN q_positions p ON ST_Covers(f.geom, p.geom);\n" % T0)
        f.write("VACUUM ANALYZE q_fences; VACUUM ANALYZE q_positions; VACUUM ANALYZE q_inside;\n")
    psql(path)


print("loading the same into PostGIS", file=sys.stderr)
load()


def timed(name, queries):
    """Runs `queries` in one psql session with \\timing; returns (times ms, answers)."""
    path = os.path.join(WORK, f"{name}.sql")
    with open(path, "w") as f:
        f.write("\\timing on\n")
        for q in queries:
            f.write(q.rstrip(";") + ";\n")
    args = ["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", DB, "-f", path]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout.splitlines()
    times, answers, cur = [], [], []
    for line in out:
        if line.startswith("Time: "):
            times.append(float(line.split()[1]))
            answers.append("\n".join(cur))
            cur = []
        elif line.startswith("Timing is"):
            continue
        else:
            cur.append(line)
    return times, answers


cq = [
    f"SELECT coalesce(string_agg(id, ',' ORDER BY id), '') FROM q_fences WHERE ST_Covers(geom, ST_SetSRID(ST_MakePoint({lon}, {lat}), 4326))"
    for lon, lat in points
]
timed("contains_warm", cq[:200])
p_contains, p_answers = timed("contains", cq)
mismatch = sum(1 for a, b in zip(g_answers, p_answers) if a != b.strip())

p_count_spatial, ans = timed(
    "count_spatial",
    ["SELECT count(*) FROM q_positions p JOIN q_fences f ON ST_Covers(f.geom, p.geom) WHERE f.id = 'yard'"] * 30,
)
assert all(int(a) == N_INSIDE for a in ans), ans[:3]
p_count_state, ans = timed("count_state", ["SELECT count(*) FROM q_inside WHERE fence = 'yard'"] * 30)
assert all(int(a) == N_INSIDE for a in ans), ans[:3]

all_inside = sorted(d for d, _, _ in inside)
p_walk = {}
for limit in (1000, 10000):
    starts = [""] + [all_inside[k - 1] for k in range(limit, len(all_inside), limit)]
    spatial = [
        f"SELECT string_agg(device, ',' ORDER BY device) FROM (SELECT p.device FROM q_positions p JOIN q_fences f ON ST_Covers(f.geom, p.geom) WHERE f.id = 'yard' AND p.device > '{s}' ORDER BY p.device LIMIT {limit}) x"
        for s in starts
    ]
    state = [
        f"SELECT string_agg(device, ',' ORDER BY device) FROM (SELECT device FROM q_inside WHERE fence = 'yard' AND device > '{s}' ORDER BY device LIMIT {limit}) x"
        for s in starts
    ]
    ts, ans = timed(f"walk_spatial_{limit}", spatial)
    got = sorted(d for a in ans for d in a.strip().split(",") if d)
    ts2, ans2 = timed(f"walk_state_{limit}", state)
    got2 = sorted(d for a in ans2 for d in a.strip().split(",") if d)
    p_walk[limit] = (ts, got, ts2, got2)

# ---- report --------------------------------------------------------------------------------
ok = mismatch == 0
rows = []


def row(q, g, p, note=""):
    gs, ps = pcts(g), pcts(p)
    rows.append({"query": q, "geodwell": gs, "postgis": ps, "note": note})
    print(
        f"| {q} | {gs['p50_ms']:.2f} / {gs['p99_ms']:.2f} | {ps['p50_ms']:.2f} / {ps['p99_ms']:.2f} | {ps['p50_ms'] / gs['p50_ms']:.1f}x / {ps['p99_ms'] / gs['p99_ms']:.1f}x | {note} |"
    )


print(f"\n{N_FENCES} polygon fences, {N_POINTS} points; {N_INSIDE} devices inside `yard` of {2 * N_INSIDE}")
print("| query | geodwell p50 / p99 ms | PostGIS p50 / p99 ms | PostGIS / geodwell (p50 / p99) | note |")
print("| --- | --- | --- | --- | --- |")
row("contains (point query)", g_contains, p_contains, f"answers differ: {mismatch}")
row("inside count, PostGIS by ST_Covers over positions", g_count, p_count_spatial)
row("inside count, PostGIS from a (fence, device) table", g_count, p_count_state)
for limit in (1000, 10000):
    devices, times = g_walk[limit]
    ts, got, ts2, got2 = p_walk[limit]
    same = devices == all_inside and got == all_inside and got2 == all_inside
    ok = ok and same
    row(f"occupancy page of {limit}, PostGIS by ST_Covers", times, ts, f"same devices: {same}")
    row(f"occupancy page of {limit}, PostGIS from the table", times, ts2, f"same devices: {same}")
    print(
        f"| whole walk, pages of {limit} (total ms) | {sum(times):.0f} ({len(times)} pages) | {sum(ts):.0f} / {sum(ts2):.0f} ({len(ts)} pages) | {sum(ts) / sum(times):.1f}x / {sum(ts2) / sum(times):.1f}x | ST_Covers / table |"
    )
os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    json.dump({"fences": N_FENCES, "points": N_POINTS, "inside": N_INSIDE, "rows": rows, "identical": ok}, f, indent=1)
sys.exit(0 if ok else 1)
