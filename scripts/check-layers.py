#!/usr/bin/env python3
"""Checks the layering of the service crate (docs/architecture.md), run by .ci/run.

1. No import cycle between the top-level modules of src/ (a module's uses of `crate::other`,
   anywhere in its files, are its edges; a module's own submodules are one node).
2. Nothing below `http` depends on `http`, `service` or `state` (only `service`, `state`, `http`
   and the binary sit on top).
3. The pure core crate depends on no async runtime, HTTP, store, metrics or telemetry crate
   (checked on `cargo metadata`, so the whole dependency tree counts, not only direct
   dependencies), and the service library does not use the simulator.

4. No import cycle between the production files of src/ either: a file's `use` of another file
   (through `crate::`, `super::`, `self::` or a child module's name; a path goes to the deepest
   file it names) is an edge; `pub use` re-exports (a module's facade) and `mod` declarations
   are not.

5. No production source file is over 600 lines (tests in their own files or a trailing
   `#[cfg(test)]` module do not count) unless its opening `//!` says why (a line starting with
   `//! Why this file is long:`).

6. No function of the partition runtime (`src/runtime/`, the two backends `src/shard/local.rs`
   and `src/cluster/partition.rs`, and the core's `partition` module) is over 100 lines.

Prints the module graph and exits 1 on any violation.
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
TOP = {"http", "service", "state"}
FORBIDDEN_IN_CORE = {
    "tokio", "axum", "hyper", "reqwest", "redb", "metrics", "metrics-exporter-prometheus",
    "tracing", "tower", "async-nats", "rumqttc", "mio",
}


def modules():
    mods = {}
    for name in sorted(os.listdir(SRC)):
        path = os.path.join(SRC, name)
        if name in ("lib.rs", "main.rs"):
            continue
        if name.endswith(".rs"):
            mods[name[:-3]] = [path]
        elif os.path.isdir(path):
            files = []
            for d, _, fs in os.walk(path):
                files += [os.path.join(d, f) for f in fs if f.endswith(".rs")]
            mods[name] = files
    return mods


def edges(mods):
    pat = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
    graph = {m: set() for m in mods}
    for m, files in mods.items():
        for f in files:
            text = open(f, encoding="utf-8").read()
            # Doc comments and ordinary comments name modules without depending on them.
            code = "\n".join(
                line for line in text.splitlines() if not line.lstrip().startswith("//")
            )
            for dep in pat.findall(code):
                if dep in mods and dep != m:
                    graph[m].add(dep)
    return graph


def cycles(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def declared_under_cfg_test(lines):
    """The names of the modules a file declares as `#[cfg(test)] mod NAME;` (in a file of
    their own, compiled only for tests)."""
    out = []
    for i, l in enumerate(lines):
        if l.strip() != "#[cfg(test)]":
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip().startswith("#["):
            j += 1
        m = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", lines[j]) if j < len(lines) else None
        if m:
            out.append(m.group(1))
    return out


def test_only_files(sources):
    """Every source file that is compiled only for tests: declared `#[cfg(test)] mod x;` by its
    parent, or inside such a module's directory."""
    out = set()
    for path in sources:
        lines = open(path, encoding="utf-8").read().splitlines()
        stem = os.path.splitext(os.path.basename(path))[0]
        base = os.path.dirname(path) if stem in ("mod", "lib", "main") else os.path.join(os.path.dirname(path), stem)
        for name in declared_under_cfg_test(lines):
            for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                out.add(cand)
            under = os.path.join(base, name) + os.sep
            out.update(p for p in sources if p.startswith(under))
    return out


def production_lines(lines):
    """Lines before the file's inline test module (`#[cfg(test)]` then `mod NAME {`), which
    by this project's convention comes last; a `#[cfg(test)] mod NAME;` declaration of a test
    file is production code's neighbour, not the start of the tests."""
    for i, l in enumerate(lines):
        if l.strip() != "#[cfg(test)]":
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip().startswith("#["):
            j += 1
        if j < len(lines) and re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", lines[j]):
            return i
    return len(lines)


def modpath(path):
    """A source file's module path: src/a/b.rs and src/a/b/mod.rs are ("a", "b")."""
    rel = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = []
    for line in text.splitlines():
        i = line.find("//")
        if i >= 0 and line[:i].count('"') % 2 == 0:
            line = line[:i]
        out.append(line)
    return "\n".join(out)


def split_top(inner):
    parts, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def use_paths(tree, prefix=()):
    """The paths of a `use` tree: `a::{b, c::d}` is a::b and a::c::d."""
    tree = tree.strip()
    if not tree:
        return []
    m = re.match(r"^([\w:]*?)::\{(.*)\}$", tree, re.S)
    if m:
        base = list(prefix) + [p for p in m.group(1).split("::") if p]
        return [p for part in split_top(m.group(2)) for p in use_paths(part, base)]
    tree = re.sub(r"\s+as\s+\w+$", "", tree)
    return [list(prefix) + [p for p in tree.split("::") if p]]


def file_graph(sources, test_only):
    """Edges between production files (module paths), see point 4 above."""
    files = {}
    for p in sources:
        if p in test_only or os.path.basename(p) in ("tests.rs", "main.rs", "lib.rs"):
            continue
        files[modpath(p)] = p
    graph = {m: set() for m in files}
    for m, p in files.items():
        lines = open(p, encoding="utf-8").read().splitlines()
        code = strip_comments("\n".join(lines[: production_lines(lines)]))
        paths = []
        for export, tree in re.findall(r"(?<![\w])(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", code):
            if not export:
                paths += use_paths(tree)
        # Paths named in code; a re-export's own path is not a use of it (see point 4).
        bare = re.sub(r"(?<![\w])pub(?:\([^)]*\))?\s+use\s+[^;]+;", "", code)
        paths += [s.split("::") for s in re.findall(r"(?<![\w:])[a-z_]\w*(?:::\w+)+", bare)]
        for segs in paths:
            if segs[0] == "crate":
                target = segs[1:]
            elif segs[0] == "super":
                up = 0
                while up < len(segs) and segs[up] == "super":
                    up += 1
                target = list(m[: len(m) - up]) + segs[up:]
            elif segs[0] == "self":
                target = list(m) + segs[1:]
            elif tuple(list(m) + [segs[0]]) in files:
                target = list(m) + segs
            else:
                continue
            for k in range(len(target), -1, -1):
                if tuple(target[:k]) in files:
                    if tuple(target[:k]) != m:
                        graph[m].add(tuple(target[:k]))
                    break
    return graph


RUNTIME = ("src/runtime/", "src/shard/local.rs", "src/cluster/partition.rs",
           "crates/geodwell-core/src/partition/")
FN = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)")


def long_functions(path, limit=100):
    """The production functions of `path` over `limit` lines: (name, lines). A function runs
    from its `fn` line to the first line that closes it at its own indentation (rustfmt's
    layout)."""
    lines = open(path, encoding="utf-8").read().splitlines()
    lines = lines[: production_lines(lines)]
    out = []
    for i, l in enumerate(lines):
        m = FN.match(l)
        if not m or l.rstrip().endswith(";"):
            continue
        close = m.group(1) + "}"
        for j in range(i + 1, len(lines)):
            if lines[j] == close:
                if j - i + 1 > limit:
                    out.append((m.group(2), j - i + 1))
                break
    return out


def main():
    problems = []
    mods = modules()
    graph = edges(mods)
    for m in sorted(graph):
        print(f"{m:10} -> {', '.join(sorted(graph[m])) or '(nothing in this crate)'}")
    for c in cycles(graph):
        problems.append("import cycle between modules: " + " <-> ".join(c))
    for m, deps in graph.items():
        if m in TOP:
            continue
        for d in deps & TOP:
            problems.append(f"{m} depends on {d}, which sits above it")
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout
    )
    pkgs = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    core = next(p["id"] for p in meta["packages"] if p["name"] == "geodwell-core")
    seen, todo = set(), [core]
    while todo:
        n = todo.pop()
        for d in nodes[n]["deps"]:
            # Only normal dependencies count: dev-dependencies never reach a build of the core.
            if not any(k["kind"] is None for k in d["dep_kinds"]):
                continue
            if d["pkg"] not in seen:
                seen.add(d["pkg"])
                todo.append(d["pkg"])
    bad = sorted({pkgs[p]["name"] for p in seen} & FORBIDDEN_IN_CORE)
    if bad:
        problems.append("geodwell-core depends on " + ", ".join(bad))
    for files in mods.values():
        for f in files:
            if "geodwell_sim" in open(f, encoding="utf-8").read():
                problems.append(f"{os.path.relpath(f, ROOT)} uses the simulator (only main.rs may)")
    sources = []
    for d, _, fs in os.walk(ROOT):
        rel = os.path.relpath(d, ROOT)
        if rel.startswith(("target", ".git")) or not (rel.startswith("src") or "/src" in rel):
            continue
        sources += [os.path.join(d, f) for f in fs if f.endswith(".rs")]
    test_only = test_only_files(sources)
    src_files = [p for p in sources if p.startswith(SRC + os.sep)]
    for c in cycles(file_graph(src_files, test_only_files(src_files))):
        problems.append("import cycle between files: " + " <-> ".join("::".join(x) for x in c))
    for path in sources:
        f, rel = os.path.basename(path), os.path.relpath(os.path.dirname(path), ROOT)
        if path in test_only or f == "tests.rs" or "/tests" in rel:
            continue
        lines = open(path, encoding="utf-8").read().splitlines()
        prod = production_lines(lines)
        reason = any(l.startswith("//! Why this file is long:") for l in lines[:40])
        if prod > 600 and not reason:
            problems.append(f"{os.path.relpath(path, ROOT)}: {prod} production lines (over 600, no reason at its top)")
    for path in sources:
        rel = os.path.relpath(path, ROOT)
        if path in test_only or not rel.startswith(RUNTIME):
            continue
        for name, n in long_functions(path):
            problems.append(f"{rel}: fn {name} is {n} lines (the runtime's functions stay within 100)")
    lib = open(os.path.join(SRC, "lib.rs"), encoding="utf-8").read()
    if "geodwell_sim" in lib:
        problems.append("src/lib.rs uses the simulator")
    print(f"geodwell-core: {len(seen)} crates in its dependency tree, none of: "
          + ", ".join(sorted(FORBIDDEN_IN_CORE)))
    if problems:
        print("\nLAYERING PROBLEMS:")
        for p in problems:
            print("  - " + p)
        return 1
    print("layers ok: no module or file cycle, nothing below http depends on it, the core is pure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
