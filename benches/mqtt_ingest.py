#!/usr/bin/env python3
"""MQTT ingest side by side with HTTP ingest, one run, same batches (issue 17).

Starts a Mosquitto of its own (a free loopback port, no persistence) and the release binary
(event clock, default durability `sync` unless DURABILITY is set) reading `bench/fixes/#`, then:

- HTTP: POSTs the batches one after another over one keep-alive connection, each answered only
  once durable (the service's ack);
- MQTT: `mosquitto_pub -l -q 1` publishes the same batches, one message per line (the broker's
  in-flight window, 20 for Mosquitto, pipelines them); timed until the server has counted every
  fix received over MQTT and no message waits for a batch (the last batch's commit, about a
  millisecond, can fall outside the time; geodwell acknowledges a message only after it).

Each side uses its own devices (same count, same shapes), so neither finds the other's fixes as
duplicates. Prints fixes/s for both and MQTT / HTTP.

    python3 benches/mqtt_ingest.py [BIN]          # 2,000 batches of 100 fixes
    BATCHES=200 python3 benches/mqtt_ingest.py    # a smoke run
"""
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/geodwell"
BATCHES = int(os.environ.get("BATCHES", "2000"))
PER = int(os.environ.get("PER_BATCH", "100"))
DEVICES = int(os.environ.get("DEVICES", "10000"))
DURABILITY = os.environ.get("DURABILITY", "sync")
T0 = 1_767_225_600_000


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def batches(prefix):
    out = []
    for b in range(BATCHES):
        fixes = []
        for i in range(PER):
            n = b * PER + i
            dev = f"{prefix}{n % DEVICES}"
            # Walks across a fence edge now and then: a realistic mix of ENTER/EXIT work.
            lat = 50.0 + (n % 7) * 0.002
            fixes.append({"device": dev, "ts": T0 + (n // DEVICES) * 1000 + b, "lat": lat, "lon": 10.005})
        out.append(json.dumps(fixes))
    return out


def metric(base, prefix):
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(prefix))


def main():
    for tool in ("mosquitto_pub",):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (apt-get install mosquitto-clients)")
    mosq = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    tmp = tempfile.mkdtemp(prefix="gd-mqtt-bench-")
    mport, hport = free_port(), free_port()
    conf = os.path.join(tmp, "m.conf")
    with open(conf, "w") as f:
        f.write(f"listener {mport} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\n")
    broker = subprocess.Popen([mosq, "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(os.environ, GEODWELL_MQTT_URL=f"mqtt://127.0.0.1:{mport}", GEODWELL_MQTT_TOPICS="bench/fixes/#",
               GEODWELL_MQTT_CLIENT_ID="gd-bench", GEODWELL_FENCES_FILE="", GEODWELL_DURABILITY=DURABILITY,
               GEODWELL_LOG="warn", GEODWELL_MAX_DEVICES="10000000")
    srv = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{hport}", "--clock", "event", "--lateness", "0s",
                            "--data-dir", os.path.join(tmp, "data")], env=env)
    base = f"http://127.0.0.1:{hport}"
    try:
        for _ in range(200):
            try:
                r = json.loads(urllib.request.urlopen(base + "/readyz").read())
                if r.get("mqtt", {}).get("connected"):
                    break
            except Exception:
                pass
            time.sleep(0.05)
        fence = {"type": "Feature", "id": "f", "properties": {"dwell": ["10m"]},
                 "geometry": {"type": "Polygon", "coordinates": [[[10.0, 50.0], [10.01, 50.0], [10.01, 50.007],
                                                                  [10.0, 50.007], [10.0, 50.0]]]}}
        req = urllib.request.Request(base + "/v1/fences/f", data=json.dumps(fence).encode(), method="PUT",
                                     headers={"content-type": "application/json"})
        urllib.request.urlopen(req).read()
        n = BATCHES * PER

        http_batches = batches("h")
        c = http.client.HTTPConnection("127.0.0.1", hport)
        t = time.perf_counter()
        for body in http_batches:
            c.request("POST", "/v1/fixes", body, {"content-type": "application/json"})
            r = c.getresponse()
            r.read()
            assert r.status == 200, r.status
        http_s = time.perf_counter() - t

        mqtt_batches = batches("m")
        before = metric(base, 'geodwell_fixes_received_total{transport="mqtt"}')
        t = time.perf_counter()
        pub = subprocess.Popen(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(mport), "-q", "1", "-l",
                                "-t", "bench/fixes/all"], stdin=subprocess.PIPE)
        pub.stdin.write(("\n".join(mqtt_batches) + "\n").encode())
        pub.stdin.close()
        pub.wait()
        while metric(base, 'geodwell_fixes_received_total{transport="mqtt"}') - before < n:
            time.sleep(0.005)
        # The last batch's acknowledgement follows its commit; wait until nothing is queued or
        # in a batch (the queue gauge at 0 and one more commit interval).
        while metric(base, "geodwell_mqtt_queued_messages") > 0:
            time.sleep(0.005)
        mqtt_s = time.perf_counter() - t

        print(f"durability={DURABILITY}, {BATCHES} batches x {PER} fixes ({n} fixes), {DEVICES} devices per side")
        print(f"HTTP (1 connection, each answer durable): {n / http_s:,.0f} fixes/s ({http_s:.2f} s)")
        print(f"MQTT (QoS 1, acked once durable):         {n / mqtt_s:,.0f} fixes/s ({mqtt_s:.2f} s)")
        print(f"MQTT / HTTP: {http_s / mqtt_s:.2f}x")
    finally:
        srv.terminate()
        srv.wait()
        broker.terminate()
        broker.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
