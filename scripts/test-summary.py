#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""One line about a `meson test` run, counted from its logs rather than from
its exit status: meson counts a test binary as one test, this counts the
cases inside (gtest, pytest), and says FAIL when a suite that must run did
not.  Exit status 0 only for PASS.

usage: test-summary.py BUILDDIR SUITE...
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET


def main():
    builddir, required = sys.argv[1], sys.argv[2:]
    logs = os.path.join(builddir, "meson-logs")
    results = {}  # suite -> [result, ...]
    suite_cases = [0, 0, 0]  # rdma-core's suite: passed, failed, skipped
    try:
        with open(os.path.join(logs, "testlog.json")) as f:
            for line in f:
                t = json.loads(line)
                # "project:suite / name"
                suite = t["name"].split(" / ")[0].split(":")[-1]
                results.setdefault(suite, []).append(t["result"])
                m = re.search(r"^rdma-core suite: (\d+) passed, (\d+) failed, (\d+) skipped$",
                              t.get("stdout") or "", re.M)
                if m:
                    suite_cases = [int(x) for x in m.groups()]
    except FileNotFoundError:
        pass

    cases = {"gtest": [0, 0, 0], "pytest": [0, 0, 0]}  # run, failed, skipped or disabled

    def count(path, kind, name_filter=None):
        try:
            root = ET.parse(path).getroot()
        except (FileNotFoundError, ET.ParseError):
            return
        suites = [root] if root.tag == "testsuite" else list(root)
        for s in suites:
            if name_filter and name_filter not in s.get("name", ""):
                continue
            c = cases[kind]
            c[0] += int(s.get("tests", 0))
            c[1] += int(s.get("failures", 0)) + int(s.get("errors", 0))
            c[2] += int(s.get("skipped", 0)) + int(s.get("disabled", 0))

    count(os.path.join(logs, "testlog.junit.xml"), "gtest", ":unit / ")
    count(os.path.join(logs, "pytest.xml"), "pytest")

    problems = []
    total = sum(len(v) for v in results.values())
    ok = sum(r == "OK" for v in results.values() for r in v)
    if total == 0:
        problems.append("no test ran")
    for s, v in sorted(results.items()):
        bad = [r for r in v if r != "OK"]
        if bad:
            problems.append(f"suite {s}: {len(bad)} not OK ({', '.join(sorted(set(bad)))})")
    for s in required:
        if not any(r == "OK" for r in results.get(s, [])):
            problems.append(f"suite {s} did not pass")
    for kind in ("gtest", "pytest"):
        run, failed, _ = cases[kind]
        if failed:
            problems.append(f"{failed} {kind} case(s) failed")
    if "unit" in required and cases["gtest"][0] == 0:
        problems.append("no gtest case ran")
    if "pyverbs" in required and cases["pytest"][0] == 0:
        problems.append("no pytest case ran")

    per = ", ".join(f"{s} {sum(r == 'OK' for r in v)}/{len(v)}" for s, v in sorted(results.items()))
    inner = "; ".join(f"{k} cases: {c[0] - c[1] - c[2]} passed, {c[1]} failed, {c[2]} skipped"
                      for k, c in cases.items())
    verdict = "FAIL: " + "; ".join(problems) + " -- " if problems else "PASS: "
    print(f"softverbs test summary: {verdict}{ok}/{total} meson tests ({per}); {inner}; "
          f"rdma-core suite cases: {suite_cases[0]} passed, {suite_cases[1]} failed, "
          f"{suite_cases[2]} skipped")
    # One plain closing line over every case that ran.
    passed = sum(c[0] - c[1] - c[2] for c in cases.values()) + suite_cases[0]
    failed = sum(c[1] for c in cases.values()) + suite_cases[1]
    skipped = sum(c[2] for c in cases.values()) + suite_cases[2]
    print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
