#!/usr/bin/env python3
"""Generates docs/requirements.md: every requirement ID, its status and the tests naming it.

The rule for what counts (issue 61): an ID is *tested* when a test marks an assertion
with it. A mark is the ID written in a `//` comment inside the test's body, which marks
the next assertion statement after it (across the setup lines between them), in the
comment on an assertion's own lines, or in an assertion's message string. An
assertion statement is an `assert*!`/`prop_assert*!`/`panic!`, a call of a function
named `assert_*`, `expect_*`, `check_*` or `wait_*` (`wait_for` fails on its timeout;
not `wait_exit`, which only reports), or an `.expect_err(` call. A call of an
`assert_*`, `check_*` or `expect_*` function anywhere in a line counts too
(`with_timeout(check_replay(..))`), so a test whose assertions live in one such
function marks the call. Nothing else counts: not the test's name, not the comment
above the test, not a helper's comments (a helper never spreads credit), not an ID
reached only through a range (`FO-TKO-1…8`, `SD-REL-1..6`). Every ID no test marks
needs a line in docs/requirements/status.txt saying why.

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


# The first code of a line that starts an assertion statement.
ASSERTION = re.compile(
    r"^\s*(?:let\s+[^=]*=\s*)?(?:[\w:]+::)?"
    r"(?:assert\w*!|prop_assert\w*!|panic!|(?:[\w.()&]*\.)?(?:assert_\w+|expect_\w+|wait_(?!exit)\w+|check_\w+)\s*[(<])"
)
# Anywhere in a line: calls that fail the test by themselves.
FAILING_CALL = re.compile(r"\.expect_err\(|(?<!\.)\bwait_for\(|(?<![\w.])(?:[\w:]+::)?(?:assert|check|expect)_\w+\s*[(<]")
STRING = re.compile(r'"((?:\\.|[^"\\])*)"')


def ids_in(text):
    return set(ID_IN_TEXT.findall(RANGE.sub(" ", text)))


def statement_end(lines, i, last):
    """The last line of the statement starting at line `i` (its `;`, or where its
    brackets close), within the function ending at `last`."""
    depth = 0
    for j in range(i, last + 1):
        code = lines[j]
        c = comment_of(code)
        if c:
            code = code[: len(code) - len(c)]
        code = STRING.sub('""', code)
        depth += sum(code.count(ch) for ch in "([{") - sum(code.count(ch) for ch in ")]}")
        if depth <= 0 and (code.rstrip().endswith((";", "}", ")", ",")) or depth < 0):
            return j
    return last


def tests_in(path):
    """Yields (test name, IDs its assertions are marked with) for each test function
    in a Rust file."""
    lines = path.read_text().splitlines()
    for name, is_test, a, b in functions_in(lines):
        if not is_test:
            continue
        body = next(i for i in range(a, b + 1) if FN.match(lines[i])) + 1
        marked, pending = set(), set()
        i = body
        while i <= b:
            line = lines[i]
            c = comment_of(line)
            code = line[: len(line) - len(c)] if c else line
            if code.strip() and (ASSERTION.match(code) or FAILING_CALL.search(code)):
                end = statement_end(lines, i, b)
                stmt = lines[i : end + 1]
                strings = " ".join(STRING.findall("\n".join(s[: len(s) - len(comment_of(s))] for s in stmt)))
                marked |= pending | ids_in(strings) | ids_in("\n".join(comment_of(s) for s in stmt))
                pending = set()
                i = end + 1
                continue
            pending |= ids_in(c)
            i += 1
        yield name, marked


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
        for rid in ids_in("\n".join(comments)):
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
        "the marks on the tests' assertions, and `docs/requirements/status.txt`. Do not edit by hand;",
        "CI (`scripts/test.sh`) fails when this file is stale.",
        "",
        "An ID is **tested** when a test marks an assertion with it: a comment right before or on",
        "the assertion, or its message, names the ID literally, not through a range (the rule is",
        "in `scripts/requirements.py`). Other statuses: **implemented** (built, but not testable here, with why),",
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
