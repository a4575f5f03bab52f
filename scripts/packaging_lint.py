#!/usr/bin/env python3
"""Static checks of the Docker packaging that need no Docker engine, and helpers for
scripts/check-packaging.sh.

    packaging_lint.py check                 Dockerfile + docker-compose.yml + provisioning checks
    packaging_lint.py env [--image-only]    the geodwell container's GEODWELL_* environment
                                            (Dockerfile ENV + compose environment), container
                                            paths mapped back to the repository through the bind
                                            mounts, one KEY=VALUE a line (--image-only: the
                                            Dockerfile's alone, as `docker run` would have it)
    packaging_lint.py healthcheck           the Dockerfile's HEALTHCHECK command (shell form)
    packaging_lint.py demo-command URL DUR  the compose demo simulator's arguments, one a line,
                                            with its server replaced by URL and --duration by DUR
    packaging_lint.py feed URL OUT          drives a live server (started as check-packaging.sh
                                            does) so that every metric exists, and writes a scrape
                                            of its /metrics to OUT
    packaging_lint.py context DEST          copies the Docker build context (the repository
                                            filtered by .dockerignore) to DEST

Paths are relative to the repository root (the parent of this script's directory). Needs PyYAML.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DATA_DIR = "/var/lib/geodwell"


# ---------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored by Docker
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    if buf:
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage(instrs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (w, _) in enumerate(instrs) if w == "FROM")
    return instrs[last_from:]


def dockerfile_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in stage:
        if word == "ENV":
            for item in shlex.split(args):
                key, sep, value = item.partition("=")
                if not sep:
                    raise SystemExit(f"Dockerfile: ENV {args!r}: use the KEY=VALUE form")
                env[key] = value
    return env


def healthcheck_command(stage: list[tuple[str, str]]) -> str:
    checks = [args for word, args in stage if word == "HEALTHCHECK"]
    if not checks:
        raise SystemExit("Dockerfile: the runtime stage has no HEALTHCHECK")
    m = re.search(r"(?:^|\s)CMD\s+(.*)$", checks[-1])
    if not m:
        raise SystemExit(f"Dockerfile: HEALTHCHECK without CMD: {checks[-1]!r}")
    cmd = m.group(1).strip()
    if cmd.startswith("["):
        return shlex.join(json.loads(cmd))
    return cmd


def check_dockerfile(problems: list[str]) -> dict[str, str]:
    instrs = dockerfile_instructions()
    froms = [a for w, a in instrs if w == "FROM"]
    if len(froms) < 2:
        problems.append("Dockerfile: not multi-stage (fewer than two FROM)")
    stage = final_stage(instrs)
    users = [a for w, a in stage if w == "USER"]
    if not users:
        problems.append("Dockerfile: the runtime stage has no USER (it would run as root)")
    elif users[-1].split(":")[0] in ("root", "0"):
        problems.append(f"Dockerfile: the runtime stage runs as {users[-1]!r}")
    env = dockerfile_env(stage)
    listen = env.get("GEODWELL_LISTEN", "")
    if not listen.startswith("0.0.0.0:") and not listen.startswith("[::]:"):
        problems.append(f"Dockerfile: GEODWELL_LISTEN={listen!r}; a container must listen on all interfaces")
    port = listen.rsplit(":", 1)[-1]
    exposed = " ".join(a for w, a in stage if w == "EXPOSE").split()
    if port not in [e.split("/")[0] for e in exposed]:
        problems.append(f"Dockerfile: EXPOSE {exposed} does not include the listen port {port}")
    if env.get("GEODWELL_DATA_DIR") != DATA_DIR:
        problems.append(f"Dockerfile: GEODWELL_DATA_DIR should be {DATA_DIR}")
    volumes = " ".join(a for w, a in stage if w == "VOLUME")
    if DATA_DIR not in volumes:
        problems.append(f"Dockerfile: no VOLUME {DATA_DIR}")
    try:
        hc = healthcheck_command(stage)
        if "/healthz" not in hc:
            problems.append(f"Dockerfile: HEALTHCHECK does not probe /healthz: {hc!r}")
    except SystemExit as e:
        problems.append(str(e))
    if not any(w == "ENTRYPOINT" and "geodwell" in a for w, a in stage):
        problems.append("Dockerfile: ENTRYPOINT is not the geodwell binary")
    return env


# ---------------------------------------------------------------------------------------------
# docker-compose.yml


def load_compose() -> dict:
    doc = yaml.safe_load(COMPOSE.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise SystemExit("docker-compose.yml: no services mapping")
    return doc


def mounts(service: dict) -> list[tuple[str, str, str]]:
    """(kind, source, target) of a service's volumes; kind is "bind" or "volume"."""
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            if len(parts) == 1:
                out.append(("anonymous", "", parts[0]))
                continue
            source, target = parts[0], parts[1]
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
            out.append((kind, source, target))
        elif isinstance(v, dict):
            out.append((v.get("type", "volume"), str(v.get("source", "")), str(v.get("target", ""))))
    return out


def repo_path(source: str) -> Path:
    return (COMPOSE.parent / os.path.expanduser(source)).resolve()


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def check_compose(problems: list[str], image_env: dict[str, str]) -> None:
    doc = load_compose()
    services = doc["services"]
    for name in ("geodwell", "prometheus", "grafana"):
        if name not in services:
            problems.append(f"docker-compose.yml: no service {name!r}")
    declared_volumes = set((doc.get("volumes") or {}).keys())
    for sname, svc in services.items():
        for kind, source, _target in mounts(svc):
            if kind == "bind":
                p = repo_path(source)
                if not p.exists():
                    problems.append(f"docker-compose.yml: {sname} mounts {source}, which does not exist")
                elif ROOT not in p.parents and p != ROOT:
                    problems.append(f"docker-compose.yml: {sname} mounts {source}, outside the repository")
            elif kind == "volume" and source not in declared_volumes:
                problems.append(
                    f"docker-compose.yml: {sname} uses volume {source!r}, not declared under volumes:"
                )
        build = svc.get("build")
        if build is not None:
            ctx = build if isinstance(build, str) else build.get("context", ".")
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            if not (repo_path(ctx) / dockerfile).is_file():
                problems.append(
                    f"docker-compose.yml: {sname} builds {ctx}/{dockerfile}, which does not exist"
                )

    listen_port = image_env.get("GEODWELL_LISTEN", ":").rsplit(":", 1)[-1]
    gd = services.get("geodwell") or {}
    gd_mounts = mounts(gd)
    if not any(t == DATA_DIR and k in ("volume", "bind") for k, _, t in gd_mounts):
        problems.append(f"docker-compose.yml: geodwell has no volume at {DATA_DIR}")
    container_ports = [str(p).rsplit(":", 1)[-1].split("/")[0] for p in gd.get("ports") or []]
    if listen_port not in container_ports:
        problems.append(
            f"docker-compose.yml: geodwell publishes {container_ports}, not the listen port {listen_port}"
        )

    prom = services.get("prometheus") or {}
    prom_cfg_target = None
    for kind, source, target in mounts(prom):
        if kind == "bind" and repo_path(source) == ROOT / "config" / "prometheus.yml":
            prom_cfg_target = target
    if prom_cfg_target is None:
        problems.append("docker-compose.yml: prometheus does not mount config/prometheus.yml")
    else:
        cmd = prom.get("command") or []
        cmd = shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]
        cfg_flags = [c.split("=", 1)[1] for c in cmd if c.startswith("--config.file=")]
        if cmd and cfg_flags != [prom_cfg_target]:
            problems.append(
                f"docker-compose.yml: prometheus --config.file {cfg_flags} "
                f"is not the mounted {prom_cfg_target}"
            )
        prom_cfg = yaml.safe_load((ROOT / "config" / "prometheus.yml").read_text()) or {}
        targets = [
            t
            for job in prom_cfg.get("scrape_configs") or []
            for sc in job.get("static_configs") or []
            for t in sc.get("targets") or []
        ]
        if f"geodwell:{listen_port}" not in targets:
            problems.append(f"config/prometheus.yml: no scrape target geodwell:{listen_port} (has {targets})")

    graf = services.get("grafana") or {}
    graf_binds = {target: repo_path(source) for kind, source, target in mounts(graf) if kind == "bind"}
    prov = ROOT / "config" / "grafana" / "provisioning"
    if graf_binds.get("/etc/grafana/provisioning") != prov:
        problems.append(
            "docker-compose.yml: grafana does not mount config/grafana/provisioning "
            "at /etc/grafana/provisioning"
        )
    for f in sorted((prov / "datasources").glob("*.y*ml")):
        for ds in (yaml.safe_load(f.read_text()) or {}).get("datasources") or []:
            host = re.sub(r"^https?://", "", str(ds.get("url", ""))).split(":")[0].split("/")[0]
            if ds.get("type") == "prometheus" and host not in services:
                problems.append(
                    f"{f.relative_to(ROOT)}: datasource url {ds.get('url')} is not a compose service"
                )
    dash_files = 0
    for f in sorted((prov / "dashboards").glob("*.y*ml")):
        for provider in (yaml.safe_load(f.read_text()) or {}).get("providers") or []:
            path = str((provider.get("options") or {}).get("path", ""))
            host_dir = graf_binds.get(path)
            if host_dir is None:
                problems.append(f"{f.relative_to(ROOT)}: dashboards path {path} is not a grafana bind mount")
            else:
                dash_files += len(list(host_dir.glob("*.json")))
    if dash_files == 0:
        problems.append("grafana: no dashboard JSON is provisioned")
    home = env_of(graf).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home and container_to_host(home, graf) is None:
        problems.append(f"docker-compose.yml: grafana home dashboard {home} is not in a bind mount")

    for sname, svc in services.items():
        if svc.get("image", "").startswith("geodwell") or sname == "geodwell":
            for key in env_of(svc):
                if key.startswith("GEODWELL_") and not key.isupper():
                    problems.append(f"docker-compose.yml: {sname}: {key} must be upper case")


def container_to_host(path: str, service: dict) -> Path | None:
    """The repository file behind a container path, through the service's bind mounts."""
    for kind, source, target in mounts(service):
        if kind != "bind":
            continue
        if path == target:
            return repo_path(source)
        if path.startswith(target.rstrip("/") + "/"):
            return repo_path(source) / path[len(target.rstrip("/")) + 1 :]
    return None


def geodwell_env(image_env: dict[str, str]) -> dict[str, str]:
    svc = load_compose()["services"]["geodwell"]
    env = {k: v for k, v in image_env.items() if k.startswith("GEODWELL_")}
    env.update({k: v for k, v in env_of(svc).items() if k.startswith("GEODWELL_")})
    for key, value in env.items():
        if value.startswith("/"):
            host = container_to_host(value, svc)
            if host is not None:
                env[key] = str(host)
    return env


# ---------------------------------------------------------------------------------------------
# .dockerignore


def dockerignore_rules() -> list[tuple[bool, re.Pattern]]:
    """(exclude?, regex) per rule, in order; the last matching rule wins (Docker's semantics)."""
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((not negate, re.compile(_glob_to_regex(pattern))))
    return rules


def _glob_to_regex(pattern: str) -> str:
    """Go filepath.Match plus `**` (any number of directories), as Docker's patternmatcher."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif c == "*":
            out += "[^/]*"
            i += 1
        elif c == "?":
            out += "[^/]"
            i += 1
        elif c == "[":
            j = pattern.find("]", i)
            if j < 0:
                out += re.escape(c)
                i += 1
            else:
                out += "[" + pattern[i + 1 : j].replace("\\", "\\\\") + "]"
                i = j + 1
        else:
            out += re.escape(c)
            i += 1
    return "^" + out + "$"


def excluded(rel: str, rules) -> bool:
    """A path is excluded if it, or a parent directory, is matched last by an excluding rule."""
    parts = rel.split("/")
    verdict = False
    for exclude, rx in rules:
        for n in range(1, len(parts) + 1):
            if rx.match("/".join(parts[:n])):
                verdict = exclude
                break
    return verdict


def copy_context(dest: Path) -> int:
    rules = dockerignore_rules()
    count = 0
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        rel_dir = "" if rel_dir == "." else rel_dir
        # Prune excluded directories (Docker still descends for '!' re-includes; we have none).
        has_negations = any(not ex for ex, _ in rules)
        if not has_negations:
            dirnames[:] = [d for d in dirnames if not excluded(f"{rel_dir}/{d}".lstrip("/"), rules)]
        for f in filenames:
            rel = f"{rel_dir}/{f}".lstrip("/")
            if excluded(rel, rules):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.join(dirpath, f), target)
            count += 1
    return count


# ---------------------------------------------------------------------------------------------
# feed: make a live server export every metric the dashboard queries


class WebSocket:
    """The smallest RFC 6455 client the feed needs (stdlib only): text frames in, close out."""

    def __init__(self, url: str, timeout: float = 5.0):
        u = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port or 80), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        path = u.path + (f"?{u.query}" if u.query else "")
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RuntimeError(f"{url}: connection closed during the handshake")
            buf += chunk
        head, self.buf = buf.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0].decode(errors="replace")
        if " 101 " not in status:
            raise RuntimeError(f"{url}: handshake refused: {status}")

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self) -> tuple[int, bytes]:
        """(opcode, payload) of the next frame; 1 = text, 8 = close."""
        b0, b1 = self._read(2)
        length = b1 & 0x7F
        if length == 126:
            length = int.from_bytes(self._read(2), "big")
        elif length == 127:
            length = int.from_bytes(self._read(8), "big")
        mask = self._read(4) if b1 & 0x80 else None
        payload = self._read(length)
        if mask:
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        return b0 & 0x0F, payload

    def close(self) -> None:
        try:
            mask = os.urandom(4)
            body = (1000).to_bytes(2, "big")
            self.sock.sendall(
                bytes([0x88, 0x80 | len(body)]) + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(body))
            )
        except OSError:
            pass
        self.sock.close()


def http(method: str, url: str, body=None, content_type: str = "application/json") -> tuple[int, str]:
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def feed(base: str, out: Path) -> int:
    """Drives a server started with clock=event, lateness=5s, subscriber_queue=1 (see
    check-packaging.sh) through ENTER, DWELL, EXIT, late, duplicate and rejected fixes, a
    subscriber that reads and one that lags, then writes a scrape of /metrics to `out` while a
    subscriber is connected."""
    t0 = 1767254400000  # 2026-01-01T08:00:00Z
    devices = [f"pkg-{i:02d}" for i in range(20)]
    inside = {"lat": 53.542, "lon": 9.993}
    outside = {"lat": 53.60, "lon": 10.10}
    log: list[str] = []

    def expect(what: str, status: int, body: str, ok=(200, 201)) -> dict:
        if status not in ok:
            raise RuntimeError(f"{what}: HTTP {status}: {body[:300]}")
        log.append(f"{what}: {status}")
        return json.loads(body) if body else {}

    def fixes(items, what, ok=(200,)):
        return expect(what, *http("POST", f"{base}/v1/fixes", items), ok=ok)

    def wait_events(n: int) -> list[dict]:
        deadline = time.monotonic() + 10
        while True:
            status, body = http("GET", f"{base}/v1/events?from_seq=0&limit=1000")
            events = expect("poll events", status, body)["events"]
            if len(events) >= n or time.monotonic() > deadline:
                return events
            time.sleep(0.05)

    fence = {
        "type": "Feature",
        "geometry": {
            "type": "Polygon",
            "coordinates": [
                [[9.990, 53.540], [9.996, 53.540], [9.996, 53.544], [9.990, 53.544], [9.990, 53.540]]
            ],
        },
        "properties": {"name": "packaging check", "dwell": "1m", "tags": {"check": "packaging"}},
    }
    expect("PUT fence", *http("PUT", f"{base}/v1/fences/pkg-yard", fence), ok=(200, 201))
    fixes([{"device": d, "ts": t0, **inside} for d in devices], "fixes at t0 (JSON array)")
    ndjson = "\n".join(json.dumps({"device": d, "ts": t0 + 30_000, **inside}) for d in devices)
    ndjson += "\n" + json.dumps({"device": "pkg-mover", "ts": t0 + 120_000, **outside}) + "\n"
    expect(
        "fixes at t0+30s (NDJSON)",
        *http("POST", f"{base}/v1/fixes", ndjson, "application/x-ndjson"),
        ok=(200,),
    )
    held = wait_events(2 * len(devices))  # ENTER at t0, DWELL at t0+1m (watermark t0+115s)
    if len(held) < 2 * len(devices):
        raise RuntimeError(f"expected {2 * len(devices)} ENTER+DWELL events, the log holds {len(held)}")

    late = fixes([{"device": devices[0], "ts": t0 + 10_000, **inside}], "a late fix")
    dup = fixes([{"device": "pkg-mover", "ts": t0 + 120_000, **outside}], "a duplicate fix")
    bad = fixes(
        [
            {"device": "pkg-bad", "ts": t0 + 120_000, "lat": 91, "lon": 9.99},
            {"device": "pkg-good", "ts": t0 + 120_000, **outside},
        ],
        "a batch with a rejected item",
    )
    if late.get("late", 0) < 1 or dup.get("duplicate", 0) < 1 or bad.get("rejected", 0) < 1:
        raise RuntimeError(f"late/duplicate/rejected not counted: {late} {dup} {bad}")

    # A subscriber that reads the log from the start: events sent. (A subscriber that asked for a
    # start seq is not checked for lag until it has caught up.)
    ws_base = base.replace("http", "ws", 1)
    reader = WebSocket(f"{ws_base}/v1/events/ws?from_seq=0")
    got = 0
    while got < len(held):
        op, payload = reader.recv()
        if op == 1:
            got += 1
    reader.close()
    log.append(f"subscriber read {got} events")

    # A live subscriber (no start seq: caught up from the first read) and a burst of EXITs larger
    # than subscriber_queue: it gets a "lagged" frame and is closed.
    laggard = WebSocket(f"{ws_base}/v1/events/ws")
    fixes(
        [{"device": d, "ts": t0 + 180_000, **outside} for d in devices]
        + [{"device": "pkg-mover", "ts": t0 + 240_000, **outside}],
        "fixes outside (EXIT burst)",
    )
    lagged = False
    try:
        while True:
            op, payload = laggard.recv()
            if op == 1 and b'"lagged"' in payload:
                lagged = True
            if op == 8:
                break
    except (EOFError, OSError):
        pass
    laggard.close()
    if not lagged:
        raise RuntimeError("the subscriber was not closed as lagged after a burst over subscriber_queue")
    log.append("live subscriber lagged and was closed")

    # A live subscriber stays connected while /metrics is scraped.
    live = WebSocket(f"{ws_base}/v1/events/ws")
    time.sleep(0.2)
    status, body = http("GET", f"{base}/metrics")
    live.close()
    if status != 200:
        raise RuntimeError(f"GET /metrics: HTTP {status}")
    out.write_text(body)
    print(f"  fed: {'; '.join(log)}; scraped {len(body.splitlines())} lines of /metrics")
    return 0


# ---------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else "check"
    problems: list[str] = []
    if cmd == "check":
        image_env = check_dockerfile(problems)
        check_compose(problems, image_env)
        rules = dockerignore_rules()
        for needed in ("Cargo.toml", "Cargo.lock", "src/main.rs", "config/geodwell.toml"):
            if excluded(needed, rules):
                problems.append(f".dockerignore excludes {needed}, which the build needs")
        for unwanted in ("target/release/geodwell", ".git/HEAD", "data/geodwell.redb"):
            if not excluded(unwanted, rules):
                problems.append(f".dockerignore lets {unwanted} into the build context")
        if problems:
            print(f"FAILED: {len(problems)} problem(s):")
            for p in problems:
                print(f"  - {p}")
            return 1
        services = ", ".join(load_compose()["services"])
        print(
            f"  ok: Dockerfile (multi-stage, non-root, HEALTHCHECK, VOLUME {DATA_DIR}), "
            f"docker-compose.yml (services: {services}; every mounted file exists), .dockerignore"
        )
        return 0
    if cmd == "env" and len(argv) in (2, 3):
        image_env = dockerfile_env(final_stage(dockerfile_instructions()))
        if argv[2:] == ["--image-only"]:
            env = {k: v for k, v in image_env.items() if k.startswith("GEODWELL_")}
        else:
            env = geodwell_env(image_env)
        for k, v in sorted(env.items()):
            print(f"{k}={v}")
        return 0
    if cmd == "healthcheck":
        print(healthcheck_command(final_stage(dockerfile_instructions())))
        return 0
    if cmd == "demo-command" and len(argv) == 4:
        url, duration = argv[2], argv[3]
        svc = load_compose()["services"].get("simulator")
        if svc is None:
            return 0
        args = [str(a) for a in svc.get("command") or []]
        for i, a in enumerate(args[:-1]):
            if a == "--server":
                args[i + 1] = url
            if a == "--duration":
                args[i + 1] = duration
        print("\n".join(args))
        return 0
    if cmd == "feed" and len(argv) == 4:
        try:
            return feed(argv[2].rstrip("/"), Path(argv[3]))
        except (RuntimeError, OSError, EOFError, ValueError) as e:
            print(f"FAILED: feeding the server: {e}")
            return 1
    if cmd == "context" and len(argv) == 3:
        n = copy_context(Path(argv[2]))
        print(f"  build context: {n} files copied to {argv[2]}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
