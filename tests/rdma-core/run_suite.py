#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Runs rdma-core's own test suite (shipped by Debian's python3-pyverbs) against
our libibverbs.so.1, unmodified, on a private fabric, once on an InfiniBand
port and once on a RoCE port.

Prints per-module counts, keeps each pass's full log, and exits non-zero on
anything but a clean run:
  - any test that fails or errors, and any other ERROR/FAIL the log shows
    (setUpClass/tearDownClass/setUpModule errors, import failures that
    unittest reports as unittest.loader._FailedTest, unexpected successes);
  - a log that does not end in unittest's "Ran N tests" and "OK", a test
    count that differs from the verdicts found, or a test the suite lists
    (run_tests.py --list-tests) that has no verdict;
  - a non-zero exit status (a crash, a kill, the timeout);
  - a skip that is neither in a vendor module nor listed for that pass under
    "Expected skips" in docs/rdma-core-suite.md, or that is listed but
    skipped with another message than the listed one (rdma-core turns
    EOPNOTSUPP into a skip, so a provider regression shows up as a new or
    different skip);
  - a listed skip that now passes, or that did not run at all (the list must
    stay exact).
The expected skips, their messages and reasons, and the vendor modules live
only in docs/rdma-core-suite.md.

usage: run_suite.py BUILD_DIR SOURCE_DIR
       run_suite.py --judge LOG PASS SOURCE_DIR [RC]
           judges a saved log of one pass (ib or roce) without running
           anything; used by tests/selftest.
"""
import ast
import collections
import fnmatch
import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

SUITE = '/usr/share/doc/rdma-core/tests'
# unittest -v prints "name (tests.test_mod.Class.name) ... ok", with a
# docstring's first line (if any) on the next line before " ... ".
HEAD = re.compile(r'^(\w+) \(tests\.(test_\w+)\.(\w+)\.(\w+)\)')
VERDICT = re.compile(r' \.\.\. (ok|FAIL|ERROR|skipped .*|skipped|expected failure|'
                     r'unexpected success)\s*$')
# A test that prints leaves its verdict alone on a later line.
BARE = re.compile(r'^(ok|FAIL|ERROR|skipped .*|expected failure|unexpected success)\s*$')
# unittest's report header for each failure and error, whatever raised it:
# "ERROR: setUpClass (tests.test_x.C)", "ERROR: test_x
# (unittest.loader._FailedTest.test_x)", "FAIL: test_y (tests....)".
REPORT = re.compile(r'^(ERROR|FAIL): (.+?)\s*$')
# Any other verdict line that names no test of the suite (setUpClass and
# friends, _FailedTest).
OTHER_BAD = re.compile(r'^(.+?) \.\.\. (ERROR|FAIL|unexpected success)\s*$')
RAN = re.compile(r'^Ran (\d+) tests? in ')
FINAL = re.compile(r'^(OK|FAILED|NO TESTS RAN)\b(?: \((.*)\))?\s*$')
LISTED_ID = re.compile(r'^tests\.(test_\w+)\.(\w+)\.(\w+)$')

DOC = os.path.join('docs', 'rdma-core-suite.md')


def unpack(dst):
    shutil.copytree(SUITE, dst)
    for name in os.listdir(dst):
        if name.endswith('.gz'):
            path = os.path.join(dst, name)
            with gzip.open(path, 'rb') as f, open(path[:-3], 'wb') as out:
                shutil.copyfileobj(f, out)
            os.unlink(path)


def skip_message(word):
    """The message of "skipped 'msg'" as unittest printed it (a repr)."""
    text = word[len('skipped'):].strip()
    try:
        return str(ast.literal_eval(text))
    except (ValueError, SyntaxError):
        return text.strip('\'"')


def parse(log):
    """Reads a `run_tests.py -v` log.

    Returns (results, others, ran, final) where results is
    [(module, class, test, status, message)] with status one of passed,
    failed, errored, skipped; others the names of ERROR/FAIL entries that
    are not tests of the suite (setUpClass, _FailedTest, ...); ran the
    count of unittest's "Ran N tests" line (None if absent); final the
    closing "OK"/"FAILED (...)" line (None if absent)."""
    results = []
    others = []
    ran = final = None
    pending = None
    for line in log.splitlines():
        m = HEAD.match(line)
        if m:
            if pending:
                # A second test started before the first one's verdict.
                others.append('%s.%s.%s (no verdict)' % pending)
            pending = (m.group(2), m.group(3), m.group(1))
        r = VERDICT.search(line)
        b = BARE.match(line)
        if pending and (r or b):
            word = (r or b).group(1)
            message = ''
            if word.startswith('skipped'):
                message = skip_message(word)
                word = 'skipped'
            status = {'ok': 'passed', 'FAIL': 'failed', 'ERROR': 'errored',
                      'skipped': 'skipped', 'expected failure': 'passed',
                      'unexpected success': 'failed'}[word]
            results.append(pending + (status, message))
            pending = None
            continue
        o = OTHER_BAD.match(line)
        if o and not m:
            others.append(o.group(1))
            continue
        rep = REPORT.match(line)
        if rep:
            others.append(rep.group(2))
            continue
        rm = RAN.match(line)
        if rm:
            ran = int(rm.group(1))
            continue
        fm = FINAL.match(line)
        if fm and ran is not None:
            final = line.strip()
    if pending:
        others.append('%s.%s.%s (no verdict)' % pending)
    # The report headers repeat the failing tests already counted; keep the
    # rest (setUpClass, _FailedTest, ...) once each.
    tests = {'%s (tests.%s.%s.%s)' % (t, mod, cls, t) for mod, cls, t, _, _ in results}
    seen = []
    for o in others:
        if o not in tests and o not in seen:
            seen.append(o)
    return results, seen, ran, final


def read_doc(source_dir):
    """(expected, vendor, hugepage_skips) from docs/rdma-core-suite.md.

    expected: {(module, class, test, pass): message} from the table under
    '## Expected skips' (pass 'both' yields an entry for ib and for roce);
    hugepage_skips: the same for '## Skips allowed without huge pages';
    vendor: [(module glob, reason)] from the table under '## Vendor modules'."""
    tables = {'Expected skips': {}, 'Skips allowed without huge pages': {}}
    vendor = []
    section = None
    row = re.compile(r'^\| `(test_\w+)\.(\w+)\.(\w+)` \| (ib|roce|both) \| `(.*)` \| .+\|\s*$')
    vrow = re.compile(r'^\| `(test_[\w*]+)` \| (.+?) \|\s*$')
    with open(os.path.join(source_dir, DOC)) as f:
        for line in f:
            if line.startswith('## '):
                section = line[3:].strip()
                continue
            if section in tables:
                m = row.match(line)
                if m:
                    passes = ('ib', 'roce') if m.group(4) == 'both' else (m.group(4),)
                    for p in passes:
                        key = m.groups()[:3] + (p,)
                        if key in tables[section]:
                            raise SystemExit('%s lists %s twice' % (DOC, '.'.join(key)))
                        tables[section][key] = m.group(5)
                elif line.startswith('| `'):
                    raise SystemExit('%s: cannot read this row: %s' % (DOC, line.strip()))
            elif section == 'Vendor modules':
                m = vrow.match(line)
                if m:
                    vendor.append((m.group(1), m.group(2)))
    expected = tables['Expected skips']
    if not expected or not vendor:
        raise SystemExit('%s: no expected skips or no vendor modules found' % DOC)
    return expected, vendor, tables['Skips allowed without huge pages']


def read_known_failures(source_dir):
    """{(module, class, test, pass): text} from the table under '## Known
    failures' of docs/rdma-core-suite.md: tests that run and fail for a
    reason the table gives.  Each must fail or error, and its text must
    appear in the log; one that passes or skips is a problem."""
    known = {}
    section = None
    row = re.compile(r'^\| `(test_\w+)\.(\w+)\.(\w+)` \| (ib|roce|both) \| `(.*)` \| .+\|\s*$')
    with open(os.path.join(source_dir, DOC)) as f:
        for line in f:
            if line.startswith('## '):
                section = line[3:].strip()
                continue
            if section == 'Known failures':
                m = row.match(line)
                if m:
                    passes = ('ib', 'roce') if m.group(4) == 'both' else (m.group(4),)
                    for p in passes:
                        known[m.groups()[:3] + (p,)] = m.group(5)
                elif line.startswith('| `'):
                    raise SystemExit('%s: cannot read this row: %s' % (DOC, line.strip()))
    return known


HUGEPAGES_2M = '/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages'


def have_hugepages():
    """What the suite's own check (utils.huge_pages_supported) looks at."""
    try:
        with open(HUGEPAGES_2M) as f:
            return int(f.read()) > 0
    except (OSError, ValueError):
        return False


def is_vendor(module, vendor):
    return any(fnmatch.fnmatchcase(module, pat) for pat, _ in vendor)


def test_output(log, mod, cls, test):
    """What the log shows between a test's header and the next test's."""
    lines = log.splitlines()
    head = '%s (tests.%s.%s.%s)' % (test, mod, cls, test)
    for i, line in enumerate(lines):
        if line.startswith(head):
            out = [line]
            for nxt in lines[i + 1:]:
                if HEAD.match(nxt):
                    break
                out.append(nxt)
            return '\n'.join(out)
    return ''


def judge(log, pass_name, rc, expected, vendor, suite_ids=None, known=None):
    """Judges one pass.  Returns (results, problems); results as parse()'s
    but a skip's status is one of expected-skip, vendor-skip,
    unexpected-skip; problems is a list of lines, empty when the pass is
    clean."""
    results, others, ran, final = parse(log)
    known = known or {}
    problems = []
    judged = []
    seen = set()
    for mod, cls, test, status, message in results:
        name = '%s.%s.%s' % (mod, cls, test)
        key = (mod, cls, test, pass_name)
        if (mod, cls, test) in seen:
            problems.append('%s ran twice' % name)
        seen.add((mod, cls, test))
        if status in ('failed', 'errored') and key in known:
            if known[key] in test_output(log, mod, cls, test):
                status = 'known-fail'
            else:
                problems.append('%s: %s, listed as a known failure in %s, but its output '
                                'lacks %r' % (status.upper(), name, DOC, known[key]))
        elif status in ('failed', 'errored'):
            problems.append('%s: %s' % (status.upper(), name))
        elif key in known:
            problems.append('%s %s, listed as a known failure in %s for the %s pass: '
                            'take it off' % (name, 'passes' if status == 'passed' else
                                             'skipped (%r)' % message, DOC, pass_name))
        elif status == 'skipped':
            if is_vendor(mod, vendor):
                status = 'vendor-skip'
            elif key not in expected:
                status = 'unexpected-skip'
                problems.append('UNEXPECTED SKIP: %s: %r (not in %s for the %s pass)'
                                % (name, message, DOC, pass_name))
            elif expected[key] != message:
                status = 'unexpected-skip'
                problems.append('SKIPPED FOR ANOTHER REASON: %s: %r, %s expects %r'
                                % (name, message, DOC, expected[key]))
            else:
                status = 'expected-skip'
        elif status == 'passed' and key in expected:
            problems.append('NOW PASSING, take it off %s for the %s pass: %s'
                            % (DOC, pass_name, name))
        judged.append((mod, cls, test, status, message))
    for o in others:
        problems.append('ERROR outside any test: %s' % o)
    for mod, cls, test, p in sorted(expected) + sorted(known):
        if p == pass_name and (mod, cls, test) not in seen:
            problems.append('listed in %s but did not run: %s.%s.%s' % (DOC, mod, cls, test))
    if suite_ids is not None:
        missing = sorted(set(suite_ids) - seen)
        for mod, cls, test in missing[:20]:
            problems.append('NO VERDICT for a test the suite lists: %s.%s.%s' % (mod, cls, test))
        if len(missing) > 20:
            problems.append('... and %d more without a verdict' % (len(missing) - 20))
        if not suite_ids:
            problems.append('run_tests.py --list-tests listed no test')
    if not results:
        problems.append('no test verdict found in the log')
    if ran is None:
        problems.append("no 'Ran N tests' line: the run did not finish")
    elif ran != len(results):
        problems.append("unittest ran %d tests but the log holds %d verdicts" % (ran, len(results)))
    if final is None:
        problems.append("no closing 'OK' line")
    elif not final.startswith('OK') and not (
            final.startswith('FAILED') and
            sum(int(n) for n in re.findall(r'(?:failures|errors)=(\d+)', final)) ==
            sum(1 for r in judged if r[3] == 'known-fail') > 0):
        problems.append('unittest closed with %r' % final)
    else:
        # "OK (skipped=N)": unittest's own count of skips must be ours.
        m = re.search(r'skipped=(\d+)', final)
        skips = sum(1 for r in results if r[3] == 'skipped')
        counted = int(m.group(1)) if m else 0
        if counted != skips:
            problems.append('unittest counted %d skips, the log holds %d' % (counted, skips))
    # Known failures make unittest exit 1; nothing else may.
    if rc != 0 and not (rc == 1 and any(r[3] == 'known-fail' for r in judged)):
        problems.append('the run exited with status %s' % rc)
    return judged, problems


# The suite runs twice: on an InfiniBand port, and on a RoCE (Ethernet) port
# whose GIDs come from the loopback interface's addresses.
PASSES = [('ib', None), ('roce', 'loop0.link_layer = ethernet\n')]


def suite_env(build, fabric, tmp, config):
    lib = os.path.join(build, 'libibverbs-compat')
    env = dict(os.environ, LD_LIBRARY_PATH=lib, SOFTVERBS_FABRIC=fabric,
               PYTHONDONTWRITEBYTECODE='1', PYTHONWARNINGS='ignore::DeprecationWarning')
    env.pop('SOFTVERBS_DEVICES', None)
    if config:
        env['SOFTVERBS_CONFIG'] = os.path.join(tmp, 'softverbs.conf')
        with open(env['SOFTVERBS_CONFIG'], 'w') as f:
            f.write(config)
    else:
        env.pop('SOFTVERBS_CONFIG', None)
    return env


def run_tests(build, tests, args, env, cwd, timeout):
    """Runs run_tests.py ARGS in its own session, through softverbs-run so
    that it sees the view (/sys/class/infiniband/<dev>/device/net/, where the
    suite looks for a port's netdev and IP address); returns (rc, output)."""
    run = os.path.join(build, 'tools', 'softverbs-run')
    proc = subprocess.Popen([run, '/usr/bin/python3', os.path.join(tests, 'run_tests.py')] + args,
                            cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += '\nrun_suite.py: run_tests.py ran past %d s and was killed\n' % timeout
        return -signal.SIGKILL, out
    return proc.returncode, out


def run_pass(build, name, config, log_path):
    """Returns (rc, log, suite_ids): the exit status and output of
    `run_tests.py -v`, and the tests `run_tests.py --list-tests` names."""
    fabric = 'rdmacore-%s-%d' % (name, os.getpid())
    with tempfile.TemporaryDirectory(prefix='rdma-core-suite-') as tmp:
        env = suite_env(build, fabric, tmp, config)
        tests = os.path.join(tmp, 'tests')
        unpack(tests)
        _, listing = run_tests(build, tests, ['--list-tests'], env, tmp, 120)
        suite_ids = [LISTED_ID.match(l).groups() for l in listing.splitlines()
                     if LISTED_ID.match(l)]
        rc, out = run_tests(build, tests, ['-v'], env, tmp, 600)
    uid = os.getuid()
    for seg in os.listdir('/dev/shm'):
        if seg.startswith('softverbs-%d-%s' % (uid, fabric)):
            os.unlink(os.path.join('/dev/shm', seg))
    with open(log_path, 'w') as f:
        f.write(out)
        f.write('\n# run_suite.py: exit status %s; run_tests.py --list-tests named %d tests\n'
                % (rc, len(suite_ids)))
    return rc, out, suite_ids


COLUMNS = ('passed', 'failed', 'errored', 'expected-skip', 'vendor-skip', 'unexpected-skip',
           'known-fail')


def print_table(name, results):
    counts = collections.defaultdict(collections.Counter)
    for mod, _, _, status, _ in results:
        counts[mod][status] += 1
    print('== %s port' % name)
    # The three skip columns: listed in the doc, in a vendor module, neither
    # (or with another message than listed: a failure).
    fmt = '%-24s' + ' %8s' * len(COLUMNS)
    print(fmt % ('module', 'passed', 'failed', 'errored', 'listed', 'vendor', 'UNLISTED',
                 'known'))
    total = collections.Counter()
    for mod in sorted(counts):
        total.update(counts[mod])
        print(fmt % ((mod,) + tuple(counts[mod][c] for c in COLUMNS)))
    print(fmt % (('total',) + tuple(total[c] for c in COLUMNS)))
    return total


def count_cases(per_pass):
    """Each case once over the passes: failed if it failed, errored or
    skipped unexpectedly anywhere; else passed if it passed anywhere (some
    tests are for one link layer and expected to skip on the other); else
    an expected skip, else a vendor skip.  Returns a Counter."""
    by_case = collections.defaultdict(set)
    for results in per_pass:
        for mod, cls, test, status, _ in results:
            by_case[(mod, cls, test)].add(status)
    c = collections.Counter()
    for statuses in by_case.values():
        if statuses & {'failed', 'errored', 'unexpected-skip'}:
            c['failed'] += 1
        elif 'known-fail' in statuses:
            c['known'] += 1
        elif 'passed' in statuses:
            c['passed'] += 1
        elif 'expected-skip' in statuses:
            c['skipped'] += 1
        else:
            c['vendor'] += 1
    c['cases'] = len(by_case)
    return c


def closing_line(c, runs, extra_failed=0):
    """The line scripts/test-summary.py reads."""
    return ('rdma-core suite: %d passed, %d failed, %d skipped, %d vendor skips, '
            '%d known failures (%d cases, each counted once over %d port runs; '
            'known failures are listed in %s)'
            % (c['passed'], c['failed'] + extra_failed, c['skipped'], c['vendor'],
               c['known'], c['cases'], runs, DOC))


HUGEPAGES = '/proc/sys/vm/nr_hugepages'


def reserve_hugepages(count=32):
    """Three generic tests need 2 MiB huge pages.  Reserve some for the run
    where we may (root, a writable sysctl); returns the old value to restore,
    or None when nothing was changed."""
    try:
        with open(HUGEPAGES) as f:
            old = int(f.read())
        if old >= count:
            return None
        with open(HUGEPAGES, 'w') as f:
            f.write(str(count))
        return old
    except (OSError, ValueError):
        return None


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == '--judge':
        return judge_only(sys.argv[2], sys.argv[3], sys.argv[4],
                          int(sys.argv[5]) if len(sys.argv) > 5 else 0)
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    old_hugepages = reserve_hugepages()
    try:
        return run_all()
    finally:
        if old_hugepages is not None:
            with open(HUGEPAGES, 'w') as f:
                f.write(str(old_hugepages))


def report(name, results, problems):
    print_table(name, results)
    for p in problems:
        print('FAIL (%s port): %s' % (name, p))


def judge_only(log_path, pass_name, source, rc):
    """Judges a saved log of one pass as run_all() would (huge pages
    present, no --list-tests cross-check)."""
    expected, vendor, _ = read_doc(os.path.abspath(source))
    known = read_known_failures(os.path.abspath(source))
    with open(log_path) as f:
        log = f.read()
    results, problems = judge(log, pass_name, rc, expected, vendor, known=known)
    report(pass_name, results, problems)
    c = count_cases([results])
    print(closing_line(c, 1, 1 if problems and not c['failed'] else 0))
    return 1 if problems else 0


def run_all():
    build, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    expected, vendor, hugepage_skips = read_doc(source)
    known = read_known_failures(source)
    if not have_hugepages():
        print('run_suite.py: no 2 MiB huge pages reserved; the tests that need them may skip')
        expected = {**expected, **hugepage_skips}
    logdir = os.path.join(build, 'meson-logs')
    os.makedirs(logdir, exist_ok=True)
    all_problems = []
    per_pass = []
    for name, config in PASSES:
        log_path = os.path.join(logdir, 'rdma-core-suite-%s.log' % name)
        rc, log, suite_ids = run_pass(build, name, config, log_path)
        results, problems = judge(log, name, rc, expected, vendor, suite_ids, known)
        report(name, results, problems)
        print('full log: %s' % log_path)
        per_pass.append(results)
        all_problems += problems
    c = count_cases(per_pass)
    # Problems that belong to no case (a setUpClass error, a crash) still
    # count as one failure so that the closing line never says 0 failed
    # on a failing run.
    extra = 1 if all_problems and not c['failed'] else 0
    if all_problems:
        print('run_suite.py: %d problem(s), see FAIL lines above' % len(all_problems))
    # The plain closing line CI readers and scripts/test-summary.py look for.
    print(closing_line(c, len(PASSES), extra))
    return 1 if all_problems else 0


if __name__ == '__main__':
    sys.exit(main())
