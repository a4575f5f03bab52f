#!/usr/bin/env python3
"""Cluster figures on this machine (docs/bench-cluster.md), with a one-process service beside them.

Starts its own 3-server NATS JetStream cluster (replicas 3) on free loopback ports and geodwell
nodes as separate processes, then measures, in one run:
  1. throughput: `geodwell simulate --max` (100k devices, 5,000-fix batches, 4 connections to
     the first node) against 1, 2 and 3 cluster nodes, and against one process on its embedded
     `sync` store;
  2. single-fix POSTs answered (after the PubAck): p50 / p99, cluster node vs one process;
  3. ingest -> ENTER latency from `geodwell simulate` (live pace, its WebSocket), p50 / p99;
  4. takeover after kill -9 of a node: detection, restore, suppress, replay per moved partition,
     and a survivor's answer times (p50 / p99 / max) from the kill until every partition is
     live again, beside the 5 s before the kill;
  5. a NATS server killed (the input stream's leader) and restarted: when ingest works again,
     beside a bare JetStream publisher to the same stream, when the streams had a leader again,
     and when each partition's events were stored again after that;
  6. checkpoint size and time (from the nodes' metrics).

  benches/cluster.py BIN NATS_SERVER OUT_DIR JS_PROBE [--quick] [--nats-kill]

--nats-kill runs only 5., on two nodes.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

BIN, NATS, OUT, PROBE = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
QUICK = "--quick" in sys.argv
NATS_KILL_ONLY = "--nats-kill" in sys.argv
DURATION = "3s" if QUICK else "10s"
SINGLE = 300 if QUICK else 2000
PARTITIONS = "16" if QUICK else "64"
procs = []


def _port_range():
    # Outside the kernel's ephemeral range: an outgoing connection's source port (a route
    # dialling out) can never take a port chosen here between its release and the server's bind.
    # Below the range, or above it when below leaves fewer than 2,000 ports.
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            start, end = (int(p) for p in f.read().split()[:2])
    except (OSError, ValueError):
        start, end = 32768, 60999
    if start >= 12000:
        return 10000, start
    if end <= 63535:
        return end + 1, 65535
    return 10000, 12000


_LO, _HI = _port_range()
# Processes started together have close pids: spread their starting points.
_next = [_LO + os.getpid() * 40503 % (_HI - _LO)]


def free_port():
    for _ in range(_HI - _LO):
        p = _LO + (_next[0] - _LO) % (_HI - _LO)
        _next[0] = p + 1
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            return p
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError(f"no free loopback port in {_LO}..{_HI}")


def get(port, path, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read()


def wait_ok(port, path, within=90):
    t0 = time.time()
    while time.time() - t0 < within:
        try:
            if get(port, path)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"127.0.0.1:{port}{path} not ready within {within}s")


class NatsCluster:
    def __init__(self, n=3):
        self.dir = os.path.join(OUT, "nats")
        self.p = [None] * n
        # A port found free can be taken before the server binds it (another process, or an
        # outgoing connection's local port): a server that exits at start is a failed attempt,
        # and the cluster starts again on fresh ports.
        for attempt in range(3):
            if self.try_start(n):
                return
            print(f"NATS cluster: a server did not start (attempt {attempt + 1}); new ports", file=sys.stderr)
            self.stop_all()
        raise SystemExit("the NATS cluster did not start in 3 attempts; logs in " + self.dir)

    def try_start(self, n):
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.ports = [free_port() for _ in range(n)]
        self.routes = [free_port() for _ in range(n)]
        self.mon = [free_port() for _ in range(n)]
        for i in range(n):
            self.start(i)
        t0 = time.time()
        while True:
            if any(p.poll() is not None for p in self.p):
                return False
            try:
                # Ours (a foreign process could hold the monitor port), with a meta leader.
                ours = json.loads(get(self.mon[0], "/varz")[1]).get("server_name") == "n0"
                if ours and json.loads(get(self.mon[0], "/jsz")[1]).get("meta_cluster", {}).get("leader"):
                    return True
            except (OSError, ValueError):
                pass
            if time.time() - t0 > 90:
                raise SystemExit("the NATS cluster elected no meta leader within 90 s")
            time.sleep(0.2)

    def stop_all(self):
        for i, p in enumerate(self.p):
            if p is not None and p.poll() is None:
                self.kill(i)

    def conf(self, i):
        routes = ", ".join(f"nats-route://127.0.0.1:{r}" for r in self.routes)
        path = os.path.join(self.dir, f"n{i}.conf")
        with open(path, "w") as f:
            f.write(
                f'server_name: n{i}\nlisten: 127.0.0.1:{self.ports[i]}\nhttp: 127.0.0.1:{self.mon[i]}\n'
                f'jetstream {{\n  store_dir: "{self.dir}/n{i}"\n}}\n'
                f"cluster {{\n  name: bench\n  listen: 127.0.0.1:{self.routes[i]}\n  routes: [{routes}]\n}}\n"
            )
        return path

    def start(self, i):
        log = open(os.path.join(self.dir, f"n{i}.log"), "a")
        self.p[i] = subprocess.Popen([NATS, "-c", self.conf(i)], stdout=log, stderr=log)
        procs.append(self.p[i])

    def kill(self, i):
        self.p[i].send_signal(signal.SIGKILL)
        self.p[i].wait()

    def urls(self):
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.ports)


def env(extra=None):
    e = dict(os.environ, GEODWELL_LOG="info")
    e.update(extra or {})
    return e


def node(nats, i, data):
    port = free_port()
    log = open(os.path.join(OUT, f"g{i}.log"), "a")
    p = subprocess.Popen(
        [BIN, "serve", "--clock", "event", "--lateness", "0s", "--listen", f"127.0.0.1:{port}",
         "--fences-file", "", "--data-dir", data, "--nats", nats.urls(), "--node", f"g{i}"],
        env=env({"GEODWELL_PARTITIONS": PARTITIONS, "GEODWELL_LEASE_TTL": "3s",
                 "GEODWELL_CLUSTER_CHECKPOINT_INTERVAL": "5s"}),
        stdout=log, stderr=log)
    procs.append(p)
    return p, port


def single(data):
    port = free_port()
    shutil.rmtree(data, ignore_errors=True)
    log = open(os.path.join(OUT, "single.log"), "a")
    p = subprocess.Popen(
        [BIN, "serve", "--clock", "event", "--lateness", "0s", "--listen", f"127.0.0.1:{port}",
         "--fences-file", "", "--data-dir", data],
        env=env({"GEODWELL_DURABILITY": "sync"}), stdout=log, stderr=log)
    procs.append(p)
    wait_ok(port, "/readyz")
    return p, port


def settled(port, within=120, without=None):
    """The cluster view once every partition has a live owner (other than `without`)."""
    t0 = time.time()
    while time.time() - t0 < within:
        try:
            s, b = get(port, "/v1/cluster")
            v = json.loads(b)
            if s == 200 and v["unowned"] == 0 and all(
                    p["status"] and p["status"]["phase"] == "live" and p["owner"] != without
                    for p in v["partition_owners"]):
                return v
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise SystemExit("cluster did not settle")


def stable(port, quiet=6.0, within=120):
    """Waits until no partition has changed owner for `quiet` seconds (two lease lifetimes):
    the nodes started one after the other, and the first one up takes every partition and hands
    the others their share once membership has settled. Measuring during those handovers would
    measure the start, not the cluster."""
    t0 = time.time()
    last, since = None, time.time()
    while time.time() - t0 < within:
        v = settled(port)
        owners = tuple(p["owner"] for p in v["partition_owners"])
        if owners != last:
            last, since = owners, time.time()
        elif time.time() - since >= quiet:
            return v
        time.sleep(0.5)
    raise SystemExit("partitions kept moving")


def simulate(port, extra):
    """Runs the simulator against one node over 4 connections (the simulator's device ids do
    not vary, so two simulators would send the same devices; the node that takes the HTTP
    requests publishes every partition's part, and the partitions' engines run on their owners)."""
    p = subprocess.run(
        [BIN, "simulate", "--server", f"http://127.0.0.1:{port}", "--connections", "4"] + extra,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return [p.stdout]


def rate_of(outs):
    total = 0
    for o in outs:
        m = re.search(r"= ([0-9]+) accepted/s", o)
        total += int(m.group(1)) if m else 0
    return total


def single_fix(port, n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    lat, refused = [], 0
    t0 = 1767225600000
    for i in range(n):
        body = json.dumps({"device": f"s{i % 1000}", "ts": t0 + i * 1000, "lat": 50.0, "lon": 10.0})
        s = time.perf_counter()
        c.request("POST", "/v1/fixes", body, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        lat.append(time.perf_counter() - s)
        refused += r.status != 200
    lat.sort()
    q = lambda x: round(lat[min(len(lat) - 1, int(len(lat) * x))] * 1000, 2)
    return {"p50_ms": q(0.5), "p99_ms": q(0.99), "refused": refused}


def post_loop(port, stop, log, t0):
    """Posts 20-fix batches to `port` one after another until `stop`; logs (start, end, status,
    error code) (status 0: no answer; code "" on success)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    i = 0
    while not stop.is_set():
        body = json.dumps([{"device": f"w{i % 50}-{k}", "ts": t0 + i * 1000, "lat": 50.0, "lon": 10.0}
                           for k in range(20)])
        s = time.time()
        try:
            c.request("POST", "/v1/fixes", body, {"content-type": "application/json"})
            r = c.getresponse()
            b = r.read()
            code = ""
            if r.status != 200:
                try:
                    code = json.loads(b)["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    code = "?"
            log.append((s, time.time(), r.status, code))
        except OSError:
            log.append((s, time.time(), 0, "no answer"))
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        i += 1


def answer_times(log, since, until):
    """p50 / p99 / max answer time (ms) of the requests that started in [since, until)."""
    lat = sorted(e - s for s, e, _, _ in log if since <= s < until)
    if not lat:
        return None
    q = lambda x: round(1000 * lat[min(len(lat) - 1, int(len(lat) * x))], 1)
    return {"requests": len(lat), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(1000 * lat[-1], 1),
            "not_2xx": sum(1 for s, _, st, _ in log if since <= s < until and st != 200)}


def e2e(port):
    o = subprocess.run(
        [BIN, "simulate", "--server", f"http://127.0.0.1:{port}", "--devices", "2000", "--sites", "100",
         "--duration", DURATION, "--quiet"], capture_output=True, text=True).stdout
    m = re.search(r"^\s+enter\s+(\d+)\s+([\d.]+)\s+([\d.]+)", o, re.M)
    return {"enter_count": int(m.group(1)), "p50_ms": float(m.group(2)), "p99_ms": float(m.group(3))} if m else {"raw": o[-400:]}


def metric(port, name):
    _, b = get(port, "/metrics")
    vals = []
    for line in b.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            vals.append(float(line.rsplit(" ", 1)[1]))
    return vals


def hist_buckets(port, name):
    _, b = get(port, "/metrics")
    buckets = {}
    for line in b.decode().splitlines():
        m = re.match(name + r'_bucket\{.*le="([^"]+)".*\} ([0-9.e+]+)', line)
        if m:
            buckets[float("inf") if m.group(1) == "+Inf" else float(m.group(1))] = float(m.group(2))
    return buckets


def hist_quantiles(after, before, qs=(0.5, 0.99)):
    """Quantiles (ms: the upper bound of the bucket they fall in) of the samples between two
    snapshots of a histogram's buckets."""
    buckets = sorted((le, c - before.get(le, 0)) for le, c in after.items())
    total = buckets[-1][1] if buckets else 0
    out = {"count": int(total)}
    for q in qs:
        le = next((le for le, c in buckets if total and c >= q * total), None)
        out[f"p{int(q * 100)}_ms_at_most"] = None if le is None else round(le * 1000, 3)
    return out


def recovered(ops, kill_at):
    """When operations `(start, end, ok)` worked again after `kill_at`: the end of the first
    success among those started after the last failure (or after the kill, if none failed), in
    seconds after the kill; plus the failures and the slowest operation after the kill."""
    after = [(s, e, ok) for s, e, ok in ops if e >= kill_at]
    bad = [(s, e) for s, e, ok in after if not ok]
    since = max((e for _, e in bad), default=kill_at)
    first = min((e for s, e, ok in after if ok and s >= since), default=None)
    return {
        "operations_after_kill": len(after),
        "failed_after_kill": len(bad),
        "slowest_after_kill_s": round(max((e - s for s, e, _ in after), default=0), 2),
        "working_again_after_s": round(first - kill_at, 2) if first else None,
    }


def nats_kill(nats, nodes):
    """kill -9 of the NATS server leading the input stream, restarted 10 s later, while a client
    posts 20-fix batches to node g0 and the simulator sends live load with events to g1; beside
    it, a bare JetStream publisher to the same stream (a subject no partition reads), through the
    same leader election (benches/nats/js_probe.rs)."""
    probe = subprocess.Popen([PROBE, "--servers", nats.urls(), "--seconds", "30"],
                             stdout=subprocess.PIPE, text=True)
    procs.append(probe)
    leader = json.loads(probe.stdout.readline())["leader"]
    k = int(leader.lstrip("n"))
    load = subprocess.Popen(
        [BIN, "simulate", "--server", f"http://127.0.0.1:{nodes[1][1]}", "--devices", "20000",
         "--sites", "200", "--rate", "10000", "--duration", "32s", "--quiet", "--no-measure"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(load)
    stop, log = threading.Event(), []
    t = threading.Thread(target=post_loop, args=(nodes[0][1], stop, log, 1767225600000 + 10**9))
    t.start()
    time.sleep(5)
    kill_at = time.time()
    nats.kill(k)
    time.sleep(10)
    nats.start(k)
    restart_at = time.time()
    out, _ = probe.communicate(timeout=120)
    stop.set()
    t.join()
    load.wait()
    v = json.loads(out)
    ours = recovered([(s, e, st == 200) for s, e, st, _ in log], kill_at)
    codes = {}
    for _, e, st, code in log:
        if e >= kill_at and st != 200:
            codes[f"{st} {code}"] = codes.get(f"{st} {code}", 0) + 1
    ours["failures_by_answer"] = codes
    bare = recovered([tuple(x) for x in v["bare"]], kill_at)
    # When each stream had a leader again (not the killed server).
    back = {}
    for name, polls in v["leaders"].items():
        back[name] = min((t for t, l in polls if t >= kill_at and l and l != leader), default=None)
    # A partition publishes events only while it can renew its lease: the streams it needs are
    # the input, the events and the lease bucket's.
    ev_leader = max((back[n] for n in ("GEODWELL_IN", "GEODWELL_EVENTS", "KV_geodwell_leases")
                     if back.get(n)), default=None)
    resumed, slow = [], []
    for p, times in v["events"].items():
        first = min((x for x in times if ev_leader and x >= ev_leader), default=None)
        if first is None:
            continue
        resumed.append(first - ev_leader)
        # The partition's own longest pause between events in the 5 s before the kill: events
        # come when fixes make them, so a pause after the election is only a stall where it is
        # longer than the partition's pauses without one.
        before = sorted(x for x in times if kill_at - 5 <= x < kill_at)
        gap = max((b - a for a, b in zip(before, before[1:])), default=None)
        if first - ev_leader > 2:
            slow.append({"partition": p, "after_s": round(first - ev_leader, 2),
                         "longest_pause_before_kill_s": round(gap, 2) if gap is not None else None})
    return {
        "killed": leader,
        "restarted_after_s": round(restart_at - kill_at, 2),
        "geodwell_ingest": ours,
        "bare_jetstream_publisher": bare,
        "window_difference_s": round(ours["working_again_after_s"] - bare["working_again_after_s"], 2)
        if ours["working_again_after_s"] is not None and bare["working_again_after_s"] is not None else None,
        "leader_again_after_s": {n: round(x - kill_at, 2) if x else None for n, x in back.items()},
        "events_flowing_after_leader_s": {
            "partitions": len(resumed),
            "median": round(statistics.median(resumed), 2) if resumed else None,
            "max": round(max(resumed), 2) if resumed else None,
            "over_2s": slow,
        },
    }


def stop(nodes, nats):
    """Stops the geodwell nodes still running, then the NATS servers still running."""
    for p in [p for p, _ in nodes] + nats.p:
        if p.poll() is None:
            p.terminate()
            p.wait()


def nats_kill_only():
    """Scenario 5 alone, on a cluster of two nodes (the full run kills a node before it)."""
    nats = NatsCluster(3)
    nodes = [node(nats, i, os.path.join(OUT, f"d-{i}")) for i in range(2)]
    for _, port in nodes:
        wait_ok(port, "/readyz")
    stable(nodes[0][1])
    res = {"quick": QUICK, "partitions": int(PARTITIONS), "nats_kill": nats_kill(nats, nodes)}
    stop(nodes, nats)
    json.dump(res, open(os.path.join(OUT, "..", "cluster.json"), "w"), indent=1)
    print(json.dumps(res, indent=1))


def main():
    if NATS_KILL_ONLY:
        return nats_kill_only()
    os.makedirs(OUT, exist_ok=True)
    res = {"quick": QUICK}
    load = ["--devices", "100000", "--sites", "200", "--max", "--batch", "5000", "--duration", DURATION]
    # One process, embedded sync store: the alternative.
    # Latency first, on a quiet service: measured after the saturating throughput run, the
    # cluster's ENTER p99 was 73 ms (the partitions still working off that load) against 7 ms
    # on a fresh one.
    p, port = single(os.path.join(OUT, "single-data"))
    res["single_process_single_fix"] = single_fix(port, SINGLE)
    res["single_process_e2e"] = e2e(port)
    res["single_process_fixes_per_s"] = rate_of(simulate(port, load))
    p.terminate()
    p.wait()
    # The cluster with 1, 2, 3 nodes (a fresh NATS cluster each).
    res["cluster_fixes_per_s"] = {}
    for n in (1, 2, 3):
        nats = NatsCluster(3)
        nodes = [node(nats, i, os.path.join(OUT, f"d{n}-{i}")) for i in range(n)]
        for _, port in nodes:
            wait_ok(port, "/readyz")
        stable(nodes[0][1])
        if n == 3:
            h0 = hist_buckets(nodes[0][1], "geodwell_cluster_ingest_ack_seconds")
            res["cluster_single_fix"] = single_fix(nodes[0][1], SINGLE)
            res["cluster_single_fix_puback"] = hist_quantiles(
                hist_buckets(nodes[0][1], "geodwell_cluster_ingest_ack_seconds"), h0)
            res["cluster_e2e"] = e2e(nodes[0][1])
        res["cluster_fixes_per_s"][n] = rate_of(simulate(nodes[0][1], load))
        if n == 3:
            res["cluster_e2e_after_load"] = e2e(nodes[0][1])
            time.sleep(6)
            res["checkpoint_bytes_per_partition"] = sum(
                sum(metric(pt, "geodwell_cluster_checkpoint_bytes")) for _, pt in nodes) / int(PARTITIONS)
            secs = [(sum(metric(pt, "geodwell_cluster_checkpoint_seconds_sum")),
                     sum(metric(pt, "geodwell_cluster_checkpoint_seconds_count"))) for _, pt in nodes]
            s, c = sum(x for x, _ in secs), sum(y for _, y in secs)
            res["checkpoint_mean_ms"] = round(1000 * s / c, 1) if c else None
            # Takeover: kill -9 of node 2; the others take its partitions.
            before = settled(nodes[0][1])
            moved = [p["partition"] for p in before["partition_owners"] if p["owner"] == "g2"]
            # Under load (20k fixes/s to node g0), so that there is input to replay.
            bg = subprocess.Popen(
                [BIN, "simulate", "--server", f"http://127.0.0.1:{nodes[0][1]}", "--devices", "20000",
                 "--sites", "200", "--rate", "20000", "--duration", "30s", "--quiet", "--no-measure"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # A survivor's answers (20-fix batches to g0, one after another), quiet before the
            # kill and through the takeover.
            survivor_stop, survivor_log = threading.Event(), []
            survivor = threading.Thread(target=post_loop,
                                        args=(nodes[0][1], survivor_stop, survivor_log, 1767225600000 + 2 * 10**9))
            survivor.start()
            time.sleep(8)
            killed_at = time.time()
            nodes[2][0].send_signal(signal.SIGKILL)
            nodes[2][0].wait()
            after = settled(nodes[0][1], without="g2")
            detected = time.time() - killed_at
            survivor_stop.set()
            survivor.join()
            res["survivor_answers"] = {
                "quiet_before_kill": answer_times(survivor_log, killed_at - 5, killed_at),
                "kill_to_all_live": answer_times(survivor_log, killed_at, killed_at + detected),
            }
            bg.wait()
            tk = [p["status"].get("takeover") or {} for p in after["partition_owners"] if p["partition"] in moved]
            med = lambda k: statistics.median([t.get(k, 0) for t in tk]) if tk else None
            mx = lambda k: max([t.get(k, 0) for t in tk]) if tk else None
            res["takeover"] = {
                "partitions_moved": len(moved),
                "lease_ttl_s": 3,
                "all_live_again_s": round(detected, 2),
                "restore_ms": {"median": med("restore_ms"), "max": mx("restore_ms")},
                "suppress_ms": {"median": med("suppress_ms"), "max": mx("suppress_ms")},
                "replay_ms": {"median": med("replay_ms"), "max": mx("replay_ms")},
                "replayed_records": {"median": med("replayed_records"), "max": mx("replayed_records")},
            }
            res["nats_kill"] = nats_kill(nats, nodes)
        stop(nodes, nats)
    json.dump(res, open(os.path.join(OUT, "..", "cluster.json"), "w"), indent=1)
    print(json.dumps(res, indent=1))
    sp = res["single_process_fixes_per_s"] or 1
    print()
    print("| setup | fixes/s | vs one process (sync) |")
    print("| --- | ---: | ---: |")
    print(f"| one process, embedded sync store | {res['single_process_fixes_per_s']} | 1.00x |")
    for n, r in res["cluster_fixes_per_s"].items():
        print(f"| cluster, {n} node(s), NATS R3 | {r} | {r / sp:.2f}x |")


try:
    main()
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
