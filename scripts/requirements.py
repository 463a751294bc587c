#!/usr/bin/env python3
"""Generates docs/requirements.md: every requirement ID, its status and the tests naming it.

The rule for what counts (issue 21): an ID is *tested* when it appears literally in a
test function's name (`sd_int_9_...`) or in a comment on that test: the comment and
attribute lines right above it, or a `//` comment inside its body. An ID reached only
through a range (`FO-TKO-1…8`, `SD-REL-1..6`) does not count; string literals do not
count. Every ID no test names needs a line in docs/requirements/status.txt saying why.

    scripts/requirements.py           rewrite docs/requirements.md
    scripts/requirements.py --check   fail when it is stale or an ID is unaccounted for
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEED = ROOT / "docs/requirements/seed-requirements.md"
STATUS = ROOT / "docs/requirements/status.txt"
OUT = ROOT / "docs/requirements.md"
SOURCES = ["tests", "streamd", "gatewayd", "metad", "meta", "shared", "cli"]
# Tests that are scripts, not Rust: the IDs their `#` comments name count for the whole.
SCRIPT_TESTS = ["compose/test.sh"]

REQ_LINE = re.compile(r"^(\d+)\. \*\*([A-Z]+-(?:[A-Z]+-)?\d+)\*\* (?:`([A-Z]+)`|N/A)(.*?):\s*(.*)$")
# An ID written out; the lookahead rejects the first end of a range.
ID_IN_TEXT = re.compile(
    r"\b((?:FO|SD|RR|OBS|DEP|INV|NA)-(?:[A-Z]+-)?\d+)(?![\d…]|\.\.|–|-\d|\s+(?:to|through)\s+[A-Z]+-)"
)
_ID = r"(?:FO|SD|RR|OBS|DEP|INV|NA)-(?:[A-Z]+-)?\d+"
# `FO-TKO-1 to FO-TKO-3`, `SD-REL-1..6`, `FO-TKO-1…8`: neither end counts.
RANGE = re.compile(_ID + r"\s*(?:…|\.\.|–|\s+to\s+|\s+through\s+)\s*(?:" + _ID + r"|\d+)\b")
ID_IN_NAME = re.compile(r"(?:^|_)((?:fo|sd|rr|obs|dep|inv)_(?:[a-z]+_)?\d+)(?=_|$)")
TEST_ATTR = re.compile(r"^\s*#\[(?:test|tokio::test|rstest|test_case)\b")
FN = re.compile(r"^\s*(?:pub(?:\([a-z:]+\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+([a-z0-9_]+)")
STATUSES = {"implemented", "untested", "partial", "missing", "optional"}


def requirements():
    """Yields (id, kind, tags, summary) for each numbered requirement of the seed file."""
    for line in SEED.read_text().splitlines():
        m = REQ_LINE.match(line)
        if m:
            kind = m.group(3) or "N/A"
            tags = " ".join(re.findall(r"`?\[([^\]]+)\]`?", m.group(4)))
            summary = re.split(r"(?<=[.;])(?<!e\.g\.)(?<!i\.e\.)\s", m.group(5), maxsplit=1)[0]
            if len(summary) > 140:
                summary = summary[:137].rstrip() + "…"
            yield m.group(2), kind, tags, summary


def name_ids(name):
    """IDs spelled in a test's snake_case name: `sd_int_9_x` names SD-INT-9."""
    return {m.upper().replace("_", "-") for m in ID_IN_NAME.findall(name)}


def comment_of(line):
    """The `//` comment of a line, ignoring `//` inside string literals."""
    in_str = False
    i = 0
    while i < len(line) - 1:
        c = line[i]
        if c == "\\" and in_str:
            i += 2
            continue
        if c == '"':
            in_str = not in_str
        elif not in_str and line.startswith("//", i):
            return line[i:]
        i += 1
    return ""


def body_end(lines, start):
    """The index of the line closing the function that opens at or after `start`; a
    function without a body (`fn f();` in a trait) ends at its `;`."""
    depth = 0
    nested = 0  # inside ( ) or [ ] of the signature, where `[u8; 4]` is no end
    opened = False
    for i in range(start, len(lines)):
        code = lines[i]
        c = comment_of(code)
        if c:
            code = code[: len(code) - len(c)]
        code = re.sub(r'"(?:\\.|[^"\\])*"', '""', code)
        code = re.sub(r"'(?:\\.|[^'\\])'", "''", code)
        for ch in code:
            if ch == "{":
                depth += 1
                opened = True
            elif ch == "}":
                depth -= 1
            elif ch in "([":
                nested += 1
            elif ch in ")]":
                nested -= 1
            elif ch == ";" and depth == 0 and nested == 0 and not opened:
                return i
        if opened and depth <= 0:
            return i
    return len(lines) - 1


def functions_in(lines):
    """Yields (name, is_test, first line of its comments and attributes, last line)."""
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        j = i - 1
        while j >= 0 and re.match(r"^\s*(//|#\[)", lines[j]):
            j -= 1
        is_test = any(TEST_ATTR.match(l) for l in lines[j + 1 : i])
        end = body_end(lines, i)
        yield m.group(1), is_test, j + 1, end
        i = end + 1


def tests_in(path):
    """Yields (test name, IDs it names) for each test function in a Rust file.

    A test that delegates to a helper of the same file (`file_wal_x()` calling
    `x(Backend::File)`) also names what the helper's comments name."""
    lines = path.read_text().splitlines()
    fns = list(functions_in(lines))
    # Helpers are test code: a file under tests/, or what follows the test module (the
    # test module is last in a file, clippy.toml's items_after_test_module).
    in_tests = path.relative_to(ROOT).parts[0] == "tests"
    test_module = next((i for i, l in enumerate(lines) if l.strip() == "#[cfg(test)]"), len(lines))
    helpers = {name: (a, b) for name, is_test, a, b in fns if not is_test and (in_tests or a > test_module)}

    def comments(a, b):
        return "\n".join(comment_of(l) for l in lines[a : b + 1])

    for name, is_test, a, b in fns:
        if not is_test:
            continue
        text = comments(a, b)
        code = "\n".join(lines[a : b + 1])
        # Free calls only: `x.name(` and `Type::name(` are not this file's helpers.
        for called in set(re.findall(r"(?<![.\w:])([a-z0-9_]+)\s*\(", code)) & set(helpers):
            text += "\n" + comments(*helpers[called])
        yield name, set(ID_IN_TEXT.findall(RANGE.sub(" ", text))) | name_ids(name)


def test_index():
    """Maps each ID to the tests naming it, as `file::name`."""
    named = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.rs")):
            rel = path.relative_to(ROOT).as_posix()
            for name, ids in tests_in(path):
                for rid in ids:
                    named.setdefault(rid, []).append(f"{rel}::{name}")
    for script in SCRIPT_TESTS:
        comments = [l for l in (ROOT / script).read_text().splitlines() if l.lstrip().startswith("#")]
        for rid in set(ID_IN_TEXT.findall(RANGE.sub(" ", "\n".join(comments)))):
            named.setdefault(rid, []).append(script)
    return named


def statuses():
    """docs/requirements/status.txt: `ID | status | why` for IDs no test names."""
    out = {}
    for n, line in enumerate(STATUS.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split("|", 2)]
        if len(parts) != 3 or parts[1] not in STATUSES or not parts[2]:
            sys.exit(f"{STATUS}:{n}: expected `ID | {'/'.join(sorted(STATUSES))} | why`, got {line!r}")
        out[parts[0]] = (parts[1], parts[2])
    return out


def render():
    reqs = list(requirements())
    named = test_index()
    status = statuses()
    known = {r[0] for r in reqs}
    problems = [f"{rid}: named by tests but not a requirement ({', '.join(named[rid])})" for rid in sorted(set(named) - known)]
    problems += [f"{rid}: has a status line but is not a requirement" for rid in sorted(set(status) - known)]
    rows = []
    counts = {}
    for rid, kind, tags, summary in reqs:
        tests = sorted(named.get(rid, []))
        if kind == "N/A":
            state, why = "n/a", "Nervix-only (seed §4)"
        elif tests and status.get(rid, ("",))[0] == "partial":
            # Tests check part of it; the line says what they leave out.
            state, why = status[rid]
        elif tests:
            state, why = "tested", ""
            if rid in status:
                problems.append(f"{rid}: tested by {tests[0]}, so its status line is stale")
        elif rid in status:
            state, why = status[rid]
        else:
            state, why = "unaccounted", ""
            problems.append(f"{rid}: no test names it and docs/requirements/status.txt has no line for it")
        counts[state] = counts.get(state, 0) + 1
        cell = "<br>".join([f"`{t}`" for t in tests] + ([why.replace("|", "\\|")] if why else []))
        summary = summary.replace("|", "\\|")
        rows.append(f"| {rid} | {kind} | {tags} | {summary} | {state} | {cell} |")
    head = [
        "# Requirements and the tests that check them",
        "",
        "Generated by `scripts/requirements.py` from `docs/requirements/seed-requirements.md`,",
        "the tests' names and comments, and `docs/requirements/status.txt`. Do not edit by hand;",
        "CI (`scripts/test.sh`) fails when this file is stale.",
        "",
        "An ID is **tested** when a test's name or a comment on that test names it literally, not",
        "through a range. Other statuses: **implemented** (built, but not testable here, with why),",
        "**untested** (built, with no test yet, and what one would do), **partial** and **missing**",
        "(with the gap), **optional** (an `OPT` requirement not taken up, or one whose condition does",
        "not hold), **n/a** (Nervix-only, seed §4).",
        "",
        "| status | IDs |",
        "|---|---|",
    ]
    head += [f"| {s} | {counts[s]} |" for s in sorted(counts)]
    head += ["", "| ID | kind | services | requirement | status | tests, or why not |", "|---|---|---|---|---|---|"]
    return "\n".join(head + rows) + "\n", problems


def main():
    text, problems = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            problems.append("docs/requirements.md is stale: run scripts/requirements.py")
    else:
        OUT.write_text(text)
    for p in problems:
        print(f"scripts/requirements.py: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
