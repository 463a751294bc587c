#!/usr/bin/env python3
"""Fails when files of one crate import each other in a circle (issue 63).

A crate's files form a graph: an arrow from A to B when A names a path into B
(`use crate::x::y`, `super::z`, a child module's `conn::run`, or such a path
written inline). A submodule naming its own parent's (or any ancestor's) items is
how a module and its submodules share a type, so those arrows are left out; every
other circle, among siblings or across folders, is a defect: its files cannot be
read or changed apart. (A circle that runs only through a parent's re-exports is
not seen: paths are resolved to files, not to the items re-exported.)

Test code (`#[cfg(test)]` to the end of the file, and files under `tests/`) is not
read; the test crate and the fuzz targets are not checked.

Usage: scripts/check-import-cycles.py [CRATE_DIR ...]  (default: every library crate)
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = ["shared", "proto", "meta", "metad", "streamd", "gatewayd", "cli"]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
INLINE_PATH = re.compile(rf"(?<![:\w])((?:{IDENT})(?:::{IDENT})+)")
USE_STMT = re.compile(r"\buse\s+([^;]+);", re.S)


def strip_comments_and_strings(text):
    """Blanks comments and string literals, so paths in them are not read."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def strip_tests(text):
    m = re.search(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+" + IDENT + r"\s*\{", text)
    return text[: m.start()] if m else text


def module_of(src, path):
    """The module path of a file under a crate's src/: ['node', 'append'], or [] for the root."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts = parts[:-1]
    return parts


def expand_use_tree(tree):
    """`a::{b, c::{d, self}}` -> ['a::b', 'a::c::d', 'a::c']."""
    tree = re.sub(r"\s+", "", tree)
    depth, start, items = 0, 0, []
    brace = tree.find("{")
    if brace < 0:
        return [re.sub(r"as" + IDENT + "$", "", tree.split(" as ")[0])]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    for i, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    out = []
    for item in filter(None, items):
        for sub in expand_use_tree(item):
            out.append(prefix.rstrip(":") if sub == "self" else prefix + sub)
    return out


def absolute(importer, path, modules):
    """Resolves a path against the importing module, or None if it leads out of the crate."""
    segs = path.split("::")
    if tuple(importer) + (segs[0],) in modules:
        return list(importer) + segs
    if segs[0] == "crate":
        return segs[1:]
    if segs[0] in ("super", "self"):
        base = list(importer)
        while segs and segs[0] in ("super", "self"):
            if segs.pop(0) == "super":
                if not base:
                    return None
                base.pop()
        return base + segs
    return None


def check_crate(crate_dir):
    src = crate_dir / "src"
    files = {}
    for path in sorted(src.rglob("*.rs")):
        if "tests" in path.relative_to(src).parts or path.name == "build.rs":
            continue
        files[tuple(module_of(src, path))] = path
    edges = {path: {} for path in files.values()}
    for module, path in files.items():
        text = strip_tests(strip_comments_and_strings(path.read_text()))
        paths = []
        for stmt in USE_STMT.findall(text):
            paths.extend(expand_use_tree(stmt))
        paths.extend(INLINE_PATH.findall(USE_STMT.sub(" ", text)))
        for p in paths:
            segs = absolute(list(module), p.replace(" ", ""), files)
            if segs is None:
                continue
            # The longest prefix that is a file of this crate.
            for n in range(len(segs), -1, -1):
                target = files.get(tuple(segs[:n]))
                if target is not None:
                    break
            ancestor = module[:n] == tuple(segs[:n])
            if target is not None and not ancestor:
                name = segs[n] if n < len(segs) else segs[-1]
                edges[path].setdefault(target, set()).add(name)
    return files, edges


def strongly_connected(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def main(args):
    crates = [Path(a).resolve() for a in args] or [ROOT / c for c in CRATES]
    bad = 0
    for crate_dir in crates:
        files, edges = check_crate(crate_dir)
        for comp in strongly_connected(edges):
            bad += 1
            rel = lambda p: str(p.relative_to(crate_dir.parent))
            print(f"check-import-cycles: {len(comp)} files of {crate_dir.name} import each other in a circle:", file=sys.stderr)
            members = set(comp)
            for a in comp:
                for b, names in sorted(edges[a].items()):
                    if b in members:
                        print(f"  {rel(a)} -> {rel(b)}: {', '.join(sorted(names))}", file=sys.stderr)
    if bad:
        print(f"check-import-cycles: {bad} circle(s); break each by moving what both sides need below them", file=sys.stderr)
        return 1
    print("check-import-cycles: no import circle but a module's own submodules naming it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
