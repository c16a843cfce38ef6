#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A verdict on a `meson test` run, counted from what each test printed
rather than from exit statuses: meson counts a test binary as one test; this
counts the cases inside.  Exit status 0 only for PASS.

Where it reads:
  - the tests meson knows, their suites and protocols: meson-info/intro-tests.json
    (meson's introspection file);
  - what ran and its result: meson-logs/testlog.json (one JSON object per
    test: name, result, stdout, starttime); the suites come from the
    introspection file, not from how meson spells a test's name;
  - the cases of a gtest binary: its own summary lines in its output;
  - the cases of a pytest run: the JUnit XML pytest wrote (--junitxml=,
    each <testcase> read by its children, whatever the suites are called),
    else pytest's closing line;
  - rdma-core's suite: the closing line of tests/rdma-core/run_suite.py,
    which already counts each case once over its two port runs and keeps
    vendor-module skips and known failures (docs/rdma-core-suite.md) apart.
Any other test counts as one case.

FAIL when: a test is not OK; a suite named on the command line has no test
that ran, or a test of it that did not run; a gtest binary, pytest run or
rdma-core suite ran no case (all skipped counts as none: a skip is not a
case that ran); any case failed; a summary cannot be read.

usage: test-summary.py BUILDDIR SUITE...
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

GTEST_RAN = re.compile(r"^\[==========\] (\d+) tests? from \d+ test (?:suites?|cases?) ran",
                       re.M)
GTEST = {
    "passed": re.compile(r"^\[  PASSED  \] (\d+) tests?", re.M),
    "skipped": re.compile(r"^\[  SKIPPED \] (\d+) tests?", re.M),
    "failed": re.compile(r"^\[  FAILED  \] (\d+) tests?", re.M),
    "disabled": re.compile(r"YOU HAVE (\d+) DISABLED TESTS?", re.M),
}
PYTEST_LINE = re.compile(r"^=+ (.*?) in [\d.]+s(?: \([\d:.]+\))? =+\s*$", re.M)
PYTEST_PART = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|"
                         r"warnings?|rerun)")
RDMA_CORE = re.compile(r"^rdma-core suite: (\d+) passed, (\d+) failed, (\d+) skipped, "
                       r"(\d+) vendor skips(?:, (\d+) known failures)?", re.M)


def gtest_cases(out):
    """(passed, failed, skipped) from a gtest binary's output, or a string
    saying why it cannot be read."""
    m = GTEST_RAN.search(out)
    if not m:
        return "no gtest summary ('[==========] N tests ... ran') in its output"
    ran = int(m.group(1))
    n = {k: sum(int(x) for x in r.findall(out)) for k, r in GTEST.items()}
    if n["passed"] + n["failed"] + n["skipped"] != ran:
        return (f"gtest says {ran} ran but {n['passed']} passed, {n['failed']} failed, "
                f"{n['skipped']} skipped")
    return n["passed"], n["failed"], n["skipped"] + n["disabled"]


def junit_cases(path):
    """(passed, failed, skipped) over every <testcase> of a JUnit XML file,
    or a string saying why it cannot be read."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return f"cannot read {path}: {e}"
    passed = failed = skipped = 0
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            failed += 1
        elif "skipped" in tags:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def pytest_stdout_cases(out):
    m = None
    for m in PYTEST_LINE.finditer(out):
        pass
    if not m:
        return "no pytest closing line in its output"
    n = {}
    for count, word in PYTEST_PART.findall(m.group(1)):
        word = {"error": "errors", "warning": "warnings"}.get(word, word)
        n[word] = n.get(word, 0) + int(count)
    return (n.get("passed", 0) + n.get("xpassed", 0),
            n.get("failed", 0) + n.get("errors", 0),
            n.get("skipped", 0) + n.get("xfailed", 0))


def pytest_cases(cmd, out, starttime):
    junit = [a.split("=", 1)[1] for a in cmd if a.startswith("--junitxml=")]
    if junit:
        path = junit[-1]
        if not os.path.exists(path):
            return f"pytest wrote no {path}"
        if starttime and os.path.getmtime(path) < starttime - 1:
            return f"{path} is older than this run"
        return junit_cases(path)
    return pytest_stdout_cases(out)


def suite_names(suites):
    """'project:suite' -> 'suite'."""
    return [s.split(":", 1)[-1] for s in suites]


def match_intro(entry_name, intro):
    """The introspection record of a testlog.json entry.  meson names a test
    'project:suite / name' when several suites exist and 'name' otherwise;
    match on the test's name, then on its suites."""
    name = entry_name.split(" / ", 1)[-1]
    prefix = entry_name.split(" / ", 1)[0] if " / " in entry_name else None
    cands = [t for t in intro if t["name"] == name]
    if len(cands) > 1 and prefix:
        wanted = set(s.split(":")[-1] for s in re.split(r"[+]", prefix))
        cands = [t for t in cands if wanted & set(suite_names(t["suite"]))] or cands
    return cands[0] if cands else None


def summarize(builddir, required):
    """Returns (lines, problems)."""
    problems = []
    try:
        with open(os.path.join(builddir, "meson-info", "intro-tests.json")) as f:
            intro = json.load(f)
    except (OSError, ValueError) as e:
        intro = []
        problems.append(f"cannot read meson's test list: {e}")
    entries = []
    try:
        with open(os.path.join(builddir, "meson-logs", "testlog.json")) as f:
            for line in f:
                if line.strip():
                    entries.append(json.loads(line))
    except FileNotFoundError:
        pass
    except ValueError as e:
        problems.append(f"cannot read testlog.json: {e}")
    if not entries:
        problems.append("no test ran")

    per_suite = {}  # suite -> {"tests": n, "ok": n, "p": n, "f": n, "s": n}
    totals = {"p": 0, "f": 0, "s": 0, "vendor": 0, "known": 0}
    ran_names = set()
    for e in entries:
        t = match_intro(e["name"], intro)
        suites = suite_names(t["suite"]) if t else [e["name"].split(" / ")[0].split(":")[-1]]
        cmd = t["cmd"] if t else []
        protocol = t["protocol"] if t else "exitcode"
        if t:
            ran_names.add((t["name"], tuple(t["suite"])))
        out = e.get("stdout") or ""
        label = e["name"]
        if e.get("result") != "OK":
            problems.append(f"{label}: {e.get('result')}")
        vendor = 0
        if protocol == "gtest":
            kind, c = "gtest", gtest_cases(out)
        elif "pytest" in cmd:
            kind, c = "pytest", pytest_cases(cmd, out, e.get("starttime"))
        elif any(a.endswith("run_suite.py") for a in cmd) or RDMA_CORE.search(out):
            kind = "rdma-core"
            m = RDMA_CORE.search(out)
            if m:
                c = tuple(int(x) for x in m.groups()[:3])
                vendor = int(m.group(4))
                totals["known"] += int(m.group(5) or 0)
            else:
                c = "no 'rdma-core suite: ...' closing line in its output"
        else:
            kind = "plain"
            c = (1, 0, 0) if e.get("result") == "OK" else (0, 1, 0)
        if isinstance(c, str):
            problems.append(f"{label}: {c}")
            c = (0, 1, 0)
        p, f, s = c
        if kind != "plain" and p + f == 0:
            problems.append(f"{label}: ran no case ({kind}: {s} skipped, 0 ran)")
        if f:
            problems.append(f"{label}: {f} {kind} case(s) failed")
        for suite in suites:
            d = per_suite.setdefault(suite, {"tests": 0, "ok": 0, "p": 0, "f": 0, "s": 0})
            d["tests"] += 1
            d["ok"] += e.get("result") == "OK"
        # A test in several suites is counted once in the totals, under its
        # first suite in the per-suite counts.
        d = per_suite[suites[0]]
        d["p"] += p
        d["f"] += f
        d["s"] += s
        totals["p"] += p
        totals["f"] += f
        totals["s"] += s
        totals["vendor"] += vendor

    for s in required:
        d = per_suite.get(s)
        if not d or d["tests"] == 0:
            problems.append(f"suite {s} did not run")
            continue
        if d["p"] == 0:
            problems.append(f"suite {s} ran no case")
        missing = [t["name"] for t in intro if s in suite_names(t["suite"])
                   and (t["name"], tuple(t["suite"])) not in ran_names]
        if missing:
            problems.append(f"suite {s}: not run: {', '.join(sorted(missing))}")

    ok = sum(d["ok"] for d in per_suite.values())
    total = len(entries)
    per = "; ".join(f"{s} {d['ok']}/{d['tests']} OK, {d['p']} passed, {d['f']} failed, "
                    f"{d['s']} skipped" for s, d in sorted(per_suite.items()))
    verdict = "FAIL: " + "; ".join(problems) + " -- " if problems else "PASS: "
    lines = [f"softverbs test summary: {verdict}{ok}/{total} meson tests ({per})",
             # One plain closing line over every case, each counted once.
             f"tests: {totals['p']} passed, {totals['f']} failed, {totals['s']} skipped"
             + (f" (and {totals['vendor']} rdma-core vendor-module skips, not counted)"
                if totals["vendor"] else "")
             + (f"; {totals['known']} rdma-core known failures (listed in "
                "docs/rdma-core-suite.md, not counted)" if totals["known"] else "")]
    return lines, problems


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    lines, problems = summarize(sys.argv[1], sys.argv[2:])
    for line in lines:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
