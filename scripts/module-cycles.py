#!/usr/bin/env python3
"""Files inside a crate import in one direction: report every circle of `use` between files.

For each crate given (default: every crate under crates/), each file under src/ is a module;
an edge A -> B is a path in A that names B: `crate::x::y`, `super::x` or `self::x` (a
`use` or a path written inline). `mod x;` declarations and `use super::*` inside a file's own
test module are not edges, nor are a directory module's (`mod.rs`, `lib.rs`) paths down into
its own children, which it declares and re-exports; a child's path up to it is. Prints the edges with --edges, and every strongly connected set of
two files or more; exits 1 when there is one.

    scripts/module-cycles.py [--edges] [crates/<name> ...]
"""

import re
import sys
from pathlib import Path

PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
# `use super::{a, b::c}` and `use crate::x::{y, z}`: the names inside one brace level.
GROUP = re.compile(r"\b(crate|super|self)((?:::\w+)*)::\{([^{}]*)\}")
INLINE_MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def modules(src: Path):
    """Module path (tuple of names) of every file under src, and each file's own path."""
    mods = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        if rel.parts[0] == "bin":
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] in ("lib", "mod", "main"):
            parts = parts[:-1]
        mods[tuple(parts)] = f
    return mods


def is_dir_module(f: Path) -> bool:
    return f.name in ("mod.rs", "lib.rs", "main.rs")


def resolve(mods, here, f, kind, rest, inline):
    """The file a path names: the longest known module prefix of it."""
    names = [n for n in rest.split("::") if n]
    if kind == "crate":
        base = []
    else:
        # `self` of a file `a/b.rs` is module a::b; `super` is a. Inside an inline module
        # (a test module), `super` is the file itself.
        base = list(here)
        if kind == "super" and not inline:
            base = base[:-1]
    full = base + names
    for n in range(len(full), -1, -1):
        if tuple(full[:n]) in mods:
            return tuple(full[:n])
    return None


def edges_of(mods):
    edges = set()
    for here, f in mods.items():
        inline = False
        for line in f.read_text().splitlines():
            code = line.split("//", 1)[0]
            if INLINE_MOD.match(code):
                inline = True
            if re.match(r"^\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*;", code):
                continue
            paths = [(m.group(1), m.group(2)) for m in PATH.finditer(code)]
            for g in GROUP.finditer(code):
                for item in g.group(3).split(","):
                    item = item.strip().split(" as ")[0]
                    if item and item not in ("self", "*"):
                        paths.append((g.group(1), g.group(2) + "::" + item))
            for kind, rest in paths:
                to = resolve(mods, here, f, kind, rest, inline)
                if to is None or to == here:
                    continue
                # A directory module's root assembles its children (declares, re-exports,
                # drives them): its edges down into them are not counted; theirs up are.
                if is_dir_module(f) and to[: len(here)] == here:
                    continue
                edges.add((here, to))
    return edges


def sccs(nodes, edges):
    graph = {n: [] for n in nodes}
    for a, b in edges:
        graph[a].append(b)
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
                out.append(comp)

    sys.setrecursionlimit(10000)
    for n in nodes:
        if n not in index:
            visit(n)
    return out


def name(m):
    return "::".join(m) or "crate"


def main():
    args = sys.argv[1:]
    show = "--edges" in args
    crates = [Path(a) for a in args if a != "--edges"] or sorted(
        p.parent for p in Path("crates").glob("*/src")
    )
    bad = 0
    for crate in crates:
        mods = modules(crate / "src")
        edges = edges_of(mods)
        if show:
            for a, b in sorted(edges):
                print(f"{crate.name}: {name(a)} -> {name(b)}")
        for comp in sccs(list(mods), edges):
            bad += 1
            print(f"{crate.name}: circle: {', '.join(sorted(name(m) for m in comp))}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
