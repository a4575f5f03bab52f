#!/usr/bin/env python3
"""Checks that a Grafana dashboard only queries metrics and labels that geodwell really exports.

    check_dashboard.py --metrics METRICS.txt --dashboard DASHBOARD.json
                       [--datasources DIR] [--prometheus-config prometheus.yml]
                       [--telemetry src/telemetry.rs]

METRICS.txt is a scrape of a live /metrics (Prometheus text format). Every PromQL expression of the
dashboard (panel targets and templating queries) is scanned for `geodwell_*` names:

- a name must be a series the scrape holds. Histograms are exported as `<name>_bucket`, `_sum` and
  `_count`: the bare family name of a histogram is not a series, and `_bucket`/`_sum`/`_count` on
  a counter or gauge is not one either; both are reported with the family's type.
- label names in `name{...}` matchers must be labels of that series, and label names in
  `by (...)` / `without (...)` and `label_values(..., label)` must be labels of a geodwell series
  of the same expression; target labels Prometheus adds (`job`, `instance`, and static labels of
  --prometheus-config) are allowed everywhere.
- with --datasources, every datasource uid the dashboard names must be provisioned there.

With --rules-out FILE, the expressions are also written as Prometheus recording rules (Grafana
variables replaced) for `promtool check rules`, which checks their PromQL syntax.

With --telemetry, metric constants of src/telemetry.rs that the dashboard does not show are
listed (information, not an error). Exits 1 listing every problem, 0 otherwise. Needs only the
standard library, plus PyYAML for --datasources / --prometheus-config.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
GEODWELL_RE = re.compile(r"(?<![a-zA-Z0-9_:])geodwell_[a-zA-Z0-9_:]*")
STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
GROUPING_RE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LABEL_VALUES_RE = re.compile(
    r"label_values\s*\(\s*(?:([a-zA-Z_:][a-zA-Z0-9_:]*)[^,]*,)?\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)"
)
MATCHER_LABEL_RE = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
BASE_TARGET_LABELS = {"job", "instance"}


def parse_exposition(text: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Returns (family -> type from `# TYPE`, series name -> label names seen on its samples)."""
    types: dict[str, str] = {}
    series: dict[str, set[str]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        m = NAME_RE.match(line)
        if not m:
            raise ValueError(f"metrics line {lineno}: no metric name: {raw!r}")
        labels: set[str] = set()
        rest = line[m.end() :]
        if rest.startswith("{"):
            labels = parse_label_names(rest, lineno)
        series.setdefault(m.group(0), set()).update(labels)
    return types, series


def parse_label_names(rest: str, lineno: int) -> set[str]:
    """Label names of a `{k="v",...}` block (values may hold escaped quotes, commas, braces)."""
    names: set[str] = set()
    i = 1
    while True:
        while i < len(rest) and rest[i] in " ,":
            i += 1
        if i >= len(rest):
            raise ValueError(f"metrics line {lineno}: unterminated label set")
        if rest[i] == "}":
            return names
        m = NAME_RE.match(rest, i)
        if not m or m.end() >= len(rest) or rest[m.end()] != "=" or rest[m.end() + 1 : m.end() + 2] != '"':
            raise ValueError(f"metrics line {lineno}: bad label at column {i}")
        names.add(m.group(0))
        i = m.end() + 2
        while i < len(rest) and rest[i] != '"':
            i += 2 if rest[i] == "\\" else 1
        i += 1


def family_of(name: str, types: dict[str, str]) -> tuple[str, str | None]:
    """(family, suffix) for a series name: `x_bucket` of histogram `x` is ("x", "_bucket")."""
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and base in types:
            return base, suffix
    return name, None


def explain_missing(name: str, types: dict[str, str], series: dict[str, set[str]]) -> str:
    """Why `name` is not a series of the scrape, as precisely as the scrape allows."""
    family, suffix = family_of(name, types)
    if suffix is not None:
        kind = types[family]
        if kind == "histogram" or (kind == "summary" and suffix != "_bucket"):
            return f"{name}: {kind} {family} has this series, but the scrape holds no sample of it"
        return f"{name}: {family} is a {kind}; a {kind} has no {suffix} series"
    if name in types:
        kind = types[name]
        if kind == "histogram":
            return f"{name}: a histogram; query {name}_bucket, {name}_sum or {name}_count"
        return f"{name}: declared as a {kind} but the scrape has no sample of it"
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in series:
            return f"{name}: {name[: -len(suffix)]} is not a histogram; it has no {suffix} series"
    close = sorted(s for s in series if s.startswith("geodwell_") and _similar(s, name))
    hint = f" (did you mean {', '.join(close[:3])}?)" if close else ""
    return f"{name}: not exported by the service{hint}"


def _similar(a: str, b: str) -> bool:
    """Cheap typo hint: same family stem or small edit distance."""
    if a.removesuffix("_total") == b.removesuffix("_total"):
        return True
    if abs(len(a) - len(b)) > 3:
        return False
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1] <= 3


def collect_queries(node, where: str, out: list[tuple[str, str]]) -> None:
    """Every PromQL string of the dashboard with a human-readable location."""
    if isinstance(node, dict):
        title = node.get("title")
        here = f"{where} > {title}" if isinstance(title, str) and title else where
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                out.append((f"{here} [{node.get('refId', '?')}]", value))
            elif key in ("query", "definition") and isinstance(value, str) and "geodwell_" in value:
                out.append((f"{here} ({key})", value))
            else:
                collect_queries(value, here, out)
    elif isinstance(node, list):
        for item in node:
            collect_queries(item, where, out)


def collect_datasource_uids(node, out: set[str]) -> None:
    if isinstance(node, dict):
        ds = node.get("datasource")
        if isinstance(ds, dict) and isinstance(ds.get("uid"), str):
            out.add(ds["uid"])
        for value in node.values():
            collect_datasource_uids(value, out)
    elif isinstance(node, list):
        for item in node:
            collect_datasource_uids(item, out)


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, matcher text) for every `geodwell_x{...}` (matcher text may be empty)."""
    found = []
    for m in GEODWELL_RE.finditer(expr):
        rest = expr[m.end() :]
        stripped = rest.lstrip()
        block = ""
        if stripped.startswith("{"):
            depth_end = _matching_brace(stripped)
            block = stripped[1:depth_end]
        found.append((m.group(0), block))
    return found


def _matching_brace(s: str) -> int:
    i = 1
    while i < len(s):
        c = s[i]
        if c in "\"'`":
            j = i + 1
            while j < len(s) and s[j] != c:
                j += 2 if s[j] == "\\" and c != "`" else 1
            i = j + 1
            continue
        if c == "}":
            return i
        i += 1
    return len(s)


def check(args) -> int:
    types, series = parse_exposition(Path(args.metrics).read_text())
    dashboard = json.loads(Path(args.dashboard).read_text())
    target_labels = set(BASE_TARGET_LABELS)
    if args.prometheus_config:
        target_labels |= static_target_labels(Path(args.prometheus_config))

    queries: list[tuple[str, str]] = []
    collect_queries(dashboard, dashboard.get("title", "dashboard"), queries)
    problems: list[str] = []
    used: set[str] = set()
    if not queries:
        problems.append("the dashboard has no PromQL expressions")

    for where, expr in queries:
        names = GEODWELL_RE.findall(STRING_RE.sub('""', expr))
        if not names:
            problems.append(f"{where}: no geodwell_* metric in {expr!r}")
        expr_labels: set[str] = set()
        for name in names:
            used.add(family_of(name, types)[0])
            if name not in series:
                problems.append(f"{where}: {explain_missing(name, types, series)}")
            else:
                expr_labels |= series[name]
        for name, block in selectors(expr):
            if name not in series:
                continue
            for label in MATCHER_LABEL_RE.findall(STRING_RE.sub('""', block)):
                if label not in series[name] and label not in target_labels and label != "__name__":
                    problems.append(
                        f"{where}: {name} has no label {label!r} "
                        f"(it has: {', '.join(sorted(series[name])) or 'none'})"
                    )
        grouped = [
            label.strip() for g in GROUPING_RE.findall(STRING_RE.sub('""', expr)) for label in g.split(",")
        ]
        grouped += [m.group(2) for m in LABEL_VALUES_RE.finditer(expr)]
        for label in grouped:
            if label and label not in expr_labels and label not in target_labels:
                problems.append(
                    f"{where}: grouping label {label!r} is on none of its metrics "
                    f"({', '.join(sorted(set(names)))}: {', '.join(sorted(expr_labels)) or 'no labels'})"
                )

    if args.datasources:
        provisioned = provisioned_uids(Path(args.datasources))
        named: set[str] = set()
        collect_datasource_uids(dashboard, named)
        for uid in sorted(named - provisioned):
            if not uid.startswith("$") and uid not in ("-- Grafana --", "grafana"):
                problems.append(
                    f"datasource uid {uid!r} is not provisioned in {args.datasources} "
                    f"(provisioned: {', '.join(sorted(provisioned)) or 'none'})"
                )

    print(
        f"dashboard {args.dashboard}: {len(queries)} queries, {len(used)} metric families; "
        f"scrape: {len([s for s in series if s.startswith('geodwell_')])} geodwell series"
    )
    if args.telemetry:
        declared = set(
            re.findall(
                r'pub const [A-Z0-9_]+: &str = "(geodwell_[a-z0-9_]+)"', Path(args.telemetry).read_text()
            )
        )
        unseen = sorted(declared - used)
        if unseen:
            print(f"  not on the dashboard (information): {', '.join(unseen)}")
    if args.rules_out:
        write_rules(queries, Path(args.rules_out))
    if problems:
        print(f"FAILED: {len(problems)} problem(s):")
        for p in problems:
            print(f"  - {p}")
        return 1
    print("  ok: every metric and label the dashboard queries is exported")
    return 0


def write_rules(queries: list[tuple[str, str]], path: Path) -> None:
    """Writes the panel expressions as Prometheus recording rules, with Grafana's variables
    replaced by plain values, so that `promtool check rules` parses every one of them."""
    rules = []
    for i, (where, expr) in enumerate(queries):
        if "label_values(" in expr:
            continue  # a Grafana templating function, not PromQL
        promql = re.sub(
            r"\$__(?:rate_interval|interval|range)\b|\$\{__(?:rate_interval|interval|range)\}", "5m", expr
        )
        promql = re.sub(
            r"\$\{[a-zA-Z0-9_]+(?::[a-z]+)?\}|\$[a-zA-Z_][a-zA-Z0-9_]*|\[\[[a-zA-Z0-9_]+\]\]", ".*", promql
        )
        rules.append({"record": f"dashboard:query_{i}", "expr": promql, "labels": {"panel": where[:200]}})
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}, indent=1))


def static_target_labels(path: Path) -> set[str]:
    import yaml

    labels: set[str] = set()
    cfg = yaml.safe_load(path.read_text()) or {}
    for job in cfg.get("scrape_configs") or []:
        for sc in job.get("static_configs") or []:
            labels |= set((sc.get("labels") or {}).keys())
    return labels


def provisioned_uids(directory: Path) -> set[str]:
    import yaml

    uids: set[str] = set()
    for f in sorted(directory.glob("*.y*ml")):
        doc = yaml.safe_load(f.read_text()) or {}
        for ds in doc.get("datasources") or []:
            if ds.get("uid"):
                uids.add(str(ds["uid"]))
    return uids


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--metrics", required=True, help="a scrape of /metrics (text format)")
    p.add_argument("--dashboard", required=True, help="the Grafana dashboard JSON")
    p.add_argument("--datasources", help="Grafana datasource provisioning directory")
    p.add_argument("--prometheus-config", help="prometheus.yml (for static target labels)")
    p.add_argument("--telemetry", help="src/telemetry.rs (lists metrics the dashboard omits)")
    p.add_argument(
        "--rules-out", help="write the panel expressions as a rules file for `promtool check rules`"
    )
    args = p.parse_args()
    try:
        return check(args)
    except (OSError, ValueError) as e:
        print(f"FAILED: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
