# SPDX-License-Identifier: MIT
"""The judges judged: tests/rdma-core/run_suite.py and scripts/test-summary.py
get canned logs of runs that went wrong in the ways a suite can go wrong
quietly, and each must say FAIL (exit 1); a clean log must say PASS.

The rdma-core logs are built from docs/rdma-core-suite.md itself (every
listed skip with its listed message), in the format Python 3.11's
`unittest -v` prints, so the real expectations file is exercised too."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2]
RUN_SUITE = SRC / "tests" / "rdma-core" / "run_suite.py"
SUMMARY = SRC / "scripts" / "test-summary.py"


def load_run_suite():
    spec = importlib.util.spec_from_file_location("run_suite", RUN_SUITE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rs = load_run_suite()

# ---- rdma-core runner ------------------------------------------------------

PASSING = [("test_cq", "CQTest", "test_resize_cq", "Test resize CQ, start with specific value"),
           ("test_qpex", "QpExTestCase", "test_qp_ex_rc_send", None),
           ("test_atomic", "AtomicTest", "test_atomic_fetch_and_add", None)]
VENDOR = ("test_mlx5_dc", "DCTest", "test_dc_rdma_write", "Can not run the test over non MLX5 device")


def with_known_failure(tmp_path):
    """A source tree whose docs/rdma-core-suite.md is the real one with one
    made-up row added to its 'Known failures' table (which may be empty), so
    that the runner's handling of known failures is judged whatever the
    real table holds."""
    src = tmp_path / "src"
    (src / "docs").mkdir(parents=True)
    doc = (SRC / "docs" / "rdma-core-suite.md").read_text()
    head = "## Known failures\n"
    i = doc.index(head)
    j = doc.index("|---|---|---|---|\n", i) + len("|---|---|---|---|\n")
    row = ("| `test_fake.FakeCase.test_known_fail` | both | `Failed to create thing` "
           "| made up by tests/selftest |\n")
    (src / "docs" / "rdma-core-suite.md").write_text(doc[:j] + row + doc[j:])
    return src


def good_lines(pass_name, src=SRC):
    """[(mod, cls, test, verdict text)] of a clean pass: a few passes, one
    vendor skip, and every skip docs/rdma-core-suite.md expects there."""
    expected, _, _ = rs.read_doc(str(src))
    rows = [(m, c, t, "ok") for m, c, t, _ in PASSING]
    rows.append(VENDOR[:3] + ("skipped %r" % VENDOR[3],))
    for (m, c, t, p), msg in sorted(expected.items()):
        if p == pass_name:
            rows.append((m, c, t, "skipped %r" % msg))
    # The known failures (tests that run and fail, listed with a text of
    # their output): what the test printed, then unittest's ERROR.
    for (m, c, t, p), text in sorted(rs.read_known_failures(str(src)).items()):
        if p == pass_name:
            rows.append((m, c, t, f"Player active got: {text}\nERROR"))
    return rows


def render(rows, extra_progress=(), reports=(), ran_extra=0, final=None):
    out = []
    docs = {(m, c, t): d for m, c, t, d in PASSING}
    for m, c, t, verdict in rows:
        head = f"{t} (tests.{m}.{c}.{t})"
        doc = docs.get((m, c, t))
        if doc:
            out.append(head)
            out.append(f"{doc} ... {verdict}")
        else:
            out.append(f"{head} ... {verdict}")
    out += list(extra_progress)
    out.append("")
    for r in reports:
        out += ["=" * 70, r, "-" * 70, "Traceback (most recent call last):",
                '  File "x.py", line 1, in y', "RuntimeError: boom", ""]
    out.append("-" * 70)
    out.append(f"Ran {len(rows) + ran_extra} tests in 0.612s")
    out.append("")
    skipped = sum(v.startswith("skipped") for *_, v in rows)
    errors = sum(v.endswith("ERROR") for *_, v in rows)
    if errors:
        out.append(final or f"FAILED (errors={errors}, skipped={skipped})")
    else:
        out.append(final or f"OK (skipped={skipped})")
    return "\n".join(out) + "\n"


def judge(tmp_path, text, rc=0, pass_name="ib", src=SRC):
    log = tmp_path / "suite.log"
    log.write_text(text)
    p = subprocess.run([sys.executable, str(RUN_SUITE), "--judge", str(log), pass_name,
                        str(src), str(rc)], capture_output=True, text=True, timeout=60)
    return p


def assert_fails(p, *needles):
    assert p.returncode == 1, p.stdout + p.stderr
    for n in needles:
        assert n in p.stdout, (n, p.stdout)
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("rdma-core suite: ") and " 0 failed" not in last, last


@pytest.mark.parametrize("pass_name", ["ib", "roce"])
def test_clean_log_passes(tmp_path, pass_name):
    # The real expectations file as it is.
    rows = good_lines(pass_name)
    known = sum(r[3].endswith("ERROR") for r in rows)
    p = judge(tmp_path, render(rows), rc=1 if known else 0, pass_name=pass_name)
    assert p.returncode == 0, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()[-1]
    listed = sum(r[3].startswith("skipped") for r in rows) - 1
    assert last.startswith(f"rdma-core suite: 3 passed, 0 failed, {listed} skipped, "
                           f"1 vendor skips, {known} known failures"), last


@pytest.mark.parametrize("pass_name", ["ib", "roce"])
def test_clean_log_with_known_failure_passes(tmp_path, pass_name):
    src = with_known_failure(tmp_path)
    rows = good_lines(pass_name, src)
    known = sum(r[3].endswith("ERROR") for r in rows)
    assert known >= 1
    p = judge(tmp_path, render(rows), rc=1, pass_name=pass_name, src=src)
    assert p.returncode == 0, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()[-1]
    listed = sum(r[3].startswith("skipped") for r in rows) - 1
    assert last.startswith(f"rdma-core suite: 3 passed, 0 failed, {listed} skipped, "
                           f"1 vendor skips, {known} known failures"), last


def test_known_failure_that_passes_fails(tmp_path):
    src = with_known_failure(tmp_path)
    rows = good_lines("roce", src)
    i = next(i for i, r in enumerate(rows) if r[3].endswith("ERROR"))
    rows[i] = rows[i][:3] + ("ok",)
    assert_fails(judge(tmp_path, render(rows), src=src), "listed as a known failure",
                 "take it off")


def test_known_failure_with_another_output_fails(tmp_path):
    src = with_known_failure(tmp_path)
    rows = good_lines("roce", src)
    i = next(i for i, r in enumerate(rows) if r[3].endswith("ERROR"))
    rows[i] = rows[i][:3] + ("Player active got: Segmentation fault\nERROR",)
    assert_fails(judge(tmp_path, render(rows), rc=1, src=src), "but its output lacks")


def test_known_failure_that_skips_fails(tmp_path):
    src = with_known_failure(tmp_path)
    rows = good_lines("ib", src)
    i = next(i for i, r in enumerate(rows) if r[3].endswith("ERROR"))
    rows[i] = rows[i][:3] + ("skipped \"Device loop0 doesn't have net interface\"",)
    assert_fails(judge(tmp_path, render(rows), src=src), "listed as a known failure")


def test_other_error_beside_known_failures_fails(tmp_path):
    src = with_known_failure(tmp_path)
    rows = good_lines("ib", src)
    rows[1] = rows[1][:3] + ("ERROR",)
    assert_fails(judge(tmp_path, render(rows), rc=1, src=src), "ERRORED: test_qpex")


def test_setupclass_error_fails(tmp_path):
    """unittest prints no test name for a setUpClass error and its class's
    tests get no verdict at all."""
    rows = good_lines("ib")
    text = render(rows, extra_progress=["setUpClass (tests.test_qp.QPTest) ... ERROR"],
                  reports=["ERROR: setUpClass (tests.test_qp.QPTest)"],
                  final="FAILED (errors=1, skipped=%d)" % (len(rows) - 3))
    assert_fails(judge(tmp_path, text, rc=1), "setUpClass (tests.test_qp.QPTest)")


def test_setupclass_error_fails_even_with_exit_0(tmp_path):
    rows = good_lines("ib")
    text = render(rows, reports=["ERROR: setUpClass (tests.test_qp.QPTest)"])
    assert_fails(judge(tmp_path, text, rc=0), "setUpClass (tests.test_qp.QPTest)")


def test_import_failure_fails(tmp_path):
    rows = good_lines("ib")
    name = "test_new (unittest.loader._FailedTest.test_new)"
    text = render(rows, extra_progress=[name + " ... ERROR"], reports=["ERROR: " + name],
                  ran_extra=1, final="FAILED (errors=1, skipped=%d)" % (len(rows) - 3))
    assert_fails(judge(tmp_path, text, rc=1), "_FailedTest")


def test_unexpected_skip_fails(tmp_path):
    """EOPNOTSUPP becomes a skip in rdma-core's suite: a provider regression
    looks like this."""
    rows = good_lines("ib")
    rows[1] = rows[1][:3] + ("skipped 'Create QP type 2 is not supported'",)
    assert_fails(judge(tmp_path, render(rows)), "UNEXPECTED SKIP",
                 "test_qpex.QpExTestCase.test_qp_ex_rc_send")


def test_listed_skip_with_another_message_fails(tmp_path):
    rows = good_lines("ib")
    i = next(i for i, r in enumerate(rows) if r[0] == "test_tag_matching")
    rows[i] = rows[i][:3] + ("skipped 'Operation not supported (errno 95)'",)
    assert_fails(judge(tmp_path, render(rows)), "SKIPPED FOR ANOTHER REASON")


def test_listed_skip_that_passes_fails(tmp_path):
    rows = good_lines("ib")
    i = next(i for i, r in enumerate(rows) if r[0] == "test_tag_matching")
    rows[i] = rows[i][:3] + ("ok",)
    assert_fails(judge(tmp_path, render(rows)), "NOW PASSING")


def test_listed_skip_that_did_not_run_fails(tmp_path):
    rows = [r for r in good_lines("ib") if r[0] != "test_flow"]
    assert_fails(judge(tmp_path, render(rows)), "did not run: test_flow.")


def test_failed_test_fails(tmp_path):
    rows = good_lines("ib")
    rows[0] = rows[0][:3] + ("FAIL",)
    text = render(rows, reports=["FAIL: test_resize_cq (tests.test_cq.CQTest.test_resize_cq)"],
                  final="FAILED (failures=1)")
    assert_fails(judge(tmp_path, text, rc=1), "FAILED: test_cq.CQTest.test_resize_cq")


def test_crash_mid_run_fails(tmp_path):
    """A segfault: no 'Ran' line, exit status -11."""
    text = render(good_lines("ib")).split("\n" + "-" * 70)[0]
    assert_fails(judge(tmp_path, text, rc=-11), "did not finish", "exited with status -11")


def test_nonzero_exit_alone_fails(tmp_path):
    # Status 1 is what the known failures give; anything else is a crash.
    assert_fails(judge(tmp_path, render(good_lines("ib")), rc=2), "exited with status 2")
    assert_fails(judge(tmp_path, render(good_lines("ib")), rc=-9), "exited with status -9")


def test_exit_1_without_known_failures_fails(tmp_path):
    # Listed, but none of them failed this time: status 1 is unexplained.
    src = with_known_failure(tmp_path)
    rows = [r for r in good_lines("ib", src) if not r[3].endswith("ERROR")]
    p = judge(tmp_path, render(rows), rc=1, src=src)
    assert p.returncode == 1 and "exited with status 1" in p.stdout, p.stdout


def test_skip_count_mismatch_fails(tmp_path):
    """unittest's own closing count disagrees with the verdicts read: a
    verdict line the parser missed."""
    rows = good_lines("ib")
    skipped = sum(v.startswith("skipped") for *_, v in rows)
    text = render(rows, final=f"OK (skipped={skipped + 1})")
    assert_fails(judge(tmp_path, text), f"unittest counted {skipped + 1} skips")


def test_empty_log_fails(tmp_path):
    assert_fails(judge(tmp_path, "Traceback (most recent call last):\nImportError: x\n", rc=1),
                 "no test verdict")


def test_test_without_verdict_fails():
    """A test run_tests.py --list-tests names but the log does not show."""
    expected, vendor, _ = rs.read_doc(str(SRC))
    rows = good_lines("ib")
    ids = [r[:3] for r in rows] + [("test_pd", "PDTest", "test_dealloc_pd")]
    known = rs.read_known_failures(str(SRC))
    _, problems = rs.judge(render(rows), "ib", 0, expected, vendor, ids, known)
    assert any("NO VERDICT" in p and "test_dealloc_pd" in p for p in problems), problems
    _, problems = rs.judge(render(rows), "ib", 0, expected, vendor, ids[:-1], known)
    assert problems == []


def test_cases_counted_once_over_ports():
    """A case that passed on one port and was an expected skip on the other
    counts once, as passed; vendor skips stay apart; a failure anywhere
    makes the case failed."""
    ib = [("m", "C", "a", "passed", ""), ("m", "C", "b", "expected-skip", "x"),
          ("v", "C", "c", "vendor-skip", "y"), ("m", "C", "d", "passed", "")]
    roce = [("m", "C", "a", "passed", ""), ("m", "C", "b", "passed", ""),
            ("v", "C", "c", "vendor-skip", "y"), ("m", "C", "d", "errored", "")]
    c = rs.count_cases([ib, roce])
    assert (c["passed"], c["failed"], c["skipped"], c["vendor"], c["cases"]) == (2, 1, 0, 1, 4)


# ---- test-summary.py -------------------------------------------------------

GTEST_OK = """[==========] Running 3 tests from 1 test suite.
[ RUN      ] Ring.A
[       OK ] Ring.A (0 ms)
[ RUN      ] Ring.B
[       OK ] Ring.B (0 ms)
[ RUN      ] Ring.C
[       OK ] Ring.C (0 ms)
[==========] 3 tests from 1 test suite ran. (1 ms total)
[  PASSED  ] 3 tests.
"""
GTEST_NONE = """[==========] Running 0 tests from 0 test suites.
[==========] 0 tests from 0 test suites ran. (0 ms total)
[  PASSED  ] 0 tests.
"""
GTEST_ALL_SKIPPED = """[==========] Running 2 tests from 1 test suite.
[ RUN      ] Ring.A
[  SKIPPED ] Ring.A (0 ms)
[ RUN      ] Ring.B
[  SKIPPED ] Ring.B (0 ms)
[==========] 2 tests from 1 test suite ran. (0 ms total)
[  PASSED  ] 0 tests.
[  SKIPPED ] 2 tests, listed below:
[  SKIPPED ] Ring.A
[  SKIPPED ] Ring.B
"""
RDMA_CORE_OK = ("rdma-core suite: 136 passed, 0 failed, 35 skipped, 102 vendor skips "
                "(273 cases, each counted once over 2 port runs)\n")


def junit(cases):
    """A pytest-style JUnit file: cases is a list of 'pass', 'skip', 'fail'."""
    body = ""
    for i, c in enumerate(cases):
        inner = {"pass": "", "skip": '<skipped type="pytest.skip" message="x">x</skipped>',
                 "fail": '<failure message="boom">boom</failure>'}[c]
        body += f'<testcase classname="pyverbs-tests.test_x" name="t{i}" time="0.1">{inner}</testcase>'
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
            f'tests="{len(cases)}">{body}</testsuite></testsuites>')


def builddir(tmp, gtest=GTEST_OK, pytest_cases=("pass", "pass", "skip"), rdma=RDMA_CORE_OK,
             selftest_out="===== 4 passed in 0.50s =====\n", prefixed=True, stale=False):
    d = tmp / "build"
    (d / "meson-info").mkdir(parents=True)
    (d / "meson-logs").mkdir()
    junit_path = d / "meson-logs" / "pytest.xml"
    tests = [
        ("ring", "unit", "gtest", [str(d / "tests/unit-ring")], gtest),
        ("header-c", "unit", "exitcode", [str(d / "tests/header-c")], ""),
        ("abi", "abi", "exitcode", ["check_abi.sh"], "ABI ok\n"),
        ("pyverbs", "pyverbs", "exitcode",
         ["/usr/bin/python3", "-m", "pytest", "-v", f"--junitxml={junit_path}", "x"],
         "===== 2 passed, 1 skipped in 9.0s =====\n"),
        ("rdma-core-suite", "rdma-core", "exitcode",
         ["/usr/bin/python3", "/src/tests/rdma-core/run_suite.py", str(d), "/src"], rdma),
        ("selftest", "selftest", "exitcode", ["/usr/bin/python3", "-m", "pytest", "y"],
         selftest_out),
    ]
    intro = [{"name": n, "suite": [f"softverbs:{s}"], "protocol": proto, "cmd": cmd}
             for n, s, proto, cmd, _ in tests]
    (d / "meson-info" / "intro-tests.json").write_text(json.dumps(intro))
    now = time.time()
    with open(d / "meson-logs" / "testlog.json", "w") as f:
        for n, s, proto, cmd, out in tests:
            name = f"softverbs:{s} / {n}" if prefixed else n
            f.write(json.dumps({"name": name, "result": "OK", "stdout": out,
                                "starttime": now, "returncode": 0, "command": cmd}) + "\n")
    if pytest_cases is not None:
        junit_path.write_text(junit(pytest_cases))
        if stale:
            os.utime(junit_path, (now - 3600, now - 3600))
    return d


def summary(d, suites=("unit", "abi", "pyverbs", "rdma-core", "selftest")):
    return subprocess.run([sys.executable, str(SUMMARY), str(d)] + list(suites),
                          capture_output=True, text=True, timeout=60)


def summary_fails(d, needle):
    p = summary(d)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL:" in p.stdout and needle in p.stdout, (needle, p.stdout)


@pytest.mark.parametrize("prefixed", [True, False], ids=["suite-prefixed", "bare-names"])
def test_summary_clean_run_passes(tmp_path, prefixed):
    """Whether or not meson spells the suite into a test's name."""
    p = summary(builddir(tmp_path, prefixed=prefixed))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS" in p.stdout
    # 3 gtest + 1 header + 1 abi + 2 pytest + 136 rdma-core + 4 selftest
    last = p.stdout.strip().splitlines()[-1]
    assert last == ("tests: 147 passed, 0 failed, 36 skipped "
                    "(and 102 rdma-core vendor-module skips, not counted)"), last


def test_summary_zero_case_junit_fails(tmp_path):
    summary_fails(builddir(tmp_path, pytest_cases=()), "pyverbs: ran no case")


def test_summary_all_skipped_junit_fails(tmp_path):
    summary_fails(builddir(tmp_path, pytest_cases=("skip", "skip", "skip")),
                  "pyverbs: ran no case")


def test_summary_failed_junit_case_fails(tmp_path):
    summary_fails(builddir(tmp_path, pytest_cases=("pass", "fail")), "1 pytest case(s) failed")


def test_summary_missing_or_stale_junit_fails(tmp_path):
    summary_fails(builddir(tmp_path / "a", pytest_cases=None), "wrote no")
    summary_fails(builddir(tmp_path / "b", stale=True), "older than this run")


def test_summary_zero_case_gtest_fails(tmp_path):
    summary_fails(builddir(tmp_path, gtest=GTEST_NONE), "ring: ran no case")


def test_summary_all_skipped_gtest_fails(tmp_path):
    summary_fails(builddir(tmp_path, gtest=GTEST_ALL_SKIPPED), "ring: ran no case")


def test_summary_unreadable_gtest_fails(tmp_path):
    summary_fails(builddir(tmp_path, gtest="Segmentation fault\n"), "no gtest summary")


def test_summary_all_skipped_pytest_stdout_fails(tmp_path):
    summary_fails(builddir(tmp_path, selftest_out="===== 4 skipped in 0.1s =====\n"),
                  "selftest: ran no case")


def test_summary_rdma_core_without_closing_line_fails(tmp_path):
    summary_fails(builddir(tmp_path, rdma="Traceback...\n"), "no 'rdma-core suite")


def test_summary_rdma_core_no_case_fails(tmp_path):
    summary_fails(builddir(tmp_path, rdma="rdma-core suite: 0 passed, 0 failed, 35 skipped, "
                           "238 vendor skips (273 cases, each counted once over 2 port runs)\n"),
                  "rdma-core-suite: ran no case")


def test_summary_missing_suite_fails(tmp_path):
    d = builddir(tmp_path)
    log = d / "meson-logs" / "testlog.json"
    lines = [l for l in log.read_text().splitlines() if "selftest" not in l]
    log.write_text("\n".join(lines) + "\n")
    summary_fails(d, "suite selftest did not run")


def test_summary_not_ok_result_fails(tmp_path):
    d = builddir(tmp_path)
    log = d / "meson-logs" / "testlog.json"
    entries = [json.loads(l) for l in log.read_text().splitlines()]
    for e in entries:
        if e["name"].endswith("abi"):
            e["result"] = "FAIL"
    log.write_text("".join(json.dumps(e) + "\n" for e in entries))
    summary_fails(d, "abi: FAIL")
