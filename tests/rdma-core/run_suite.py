#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Runs rdma-core's own test suite (shipped by Debian's python3-pyverbs) against
our libibverbs.so.1, unmodified, on a private fabric.

Prints per-module counts of passed, failed, errored and skipped tests, keeps
the full log, and exits non-zero when any test fails or errors, or when a test
listed as an expected skip in docs/rdma-core-suite.md now passes (it must come
off the list).

usage: run_suite.py BUILD_DIR SOURCE_DIR
"""
import collections
import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

SUITE = '/usr/share/doc/rdma-core/tests'
VENDOR = re.compile(r'^test_(mlx5|efa|cuda)')
# unittest -v prints "name (tests.test_mod.Class.name) ... ok", with a
# docstring's first line (if any) on the next line before " ... ".
HEAD = re.compile(r'^(\w+) \(tests\.(test_\w+)\.(\w+)\.\w+\)')
RESULT = re.compile(r' \.\.\. (ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)\s*$')


def unpack(dst):
    shutil.copytree(SUITE, dst)
    for name in os.listdir(dst):
        if name.endswith('.gz'):
            path = os.path.join(dst, name)
            with gzip.open(path, 'rb') as f, open(path[:-3], 'wb') as out:
                shutil.copyfileobj(f, out)
            os.unlink(path)


def parse(log):
    """Returns [(module, class, test, status, reason)]."""
    results = []
    pending = None
    for line in log.splitlines():
        m = HEAD.match(line)
        if m:
            pending = (m.group(2), m.group(3), m.group(1))
        r = RESULT.search(line)
        # A test that prints leaves its verdict alone on a later line.
        bare = re.match(r'^(ok|FAIL|ERROR|skipped.*)\s*$', line)
        if pending and (r or bare):
            word = (r or bare).group(1)
            reason = ''
            if word.startswith('skipped'):
                reason = word[len('skipped'):].strip().strip("'\"")
                word = 'skipped'
            status = {'ok': 'passed', 'FAIL': 'failed', 'ERROR': 'errored',
                      'skipped': 'skipped', 'expected failure': 'passed',
                      'unexpected success': 'failed'}[word]
            results.append(pending + (status, reason))
            pending = None
    return results


def expected_skips(source_dir, pass_name):
    """Tests listed in docs/rdma-core-suite.md under 'Expected skips' for a pass."""
    path = os.path.join(source_dir, 'docs', 'rdma-core-suite.md')
    names = set()
    if not os.path.exists(path):
        return names
    in_list = False
    for line in open(path):
        if line.startswith('## '):
            in_list = line.strip() == '## Expected skips'
            continue
        m = re.match(r'^\| `(test_\w+)\.(\w+)\.(\w+)` \| (ib|roce|both) \|', line)
        if in_list and m and m.group(4) in (pass_name, 'both'):
            names.add(m.groups()[:3])
    return names


# The suite runs twice: on an InfiniBand port, and on a RoCE (Ethernet) port
# whose GIDs come from the loopback interface's addresses.
PASSES = [('ib', None), ('roce', 'loop0.link_layer = ethernet\n')]


def run_pass(build, name, config, log_path):
    lib = os.path.join(build, 'libibverbs-compat')
    fabric = 'rdmacore-%s-%d' % (name, os.getpid())
    env = dict(os.environ, LD_LIBRARY_PATH=lib, SOFTVERBS_FABRIC=fabric,
               PYTHONDONTWRITEBYTECODE='1', PYTHONWARNINGS='ignore::DeprecationWarning')
    env.pop('SOFTVERBS_DEVICES', None)
    with tempfile.TemporaryDirectory(prefix='rdma-core-suite-') as tmp:
        if config:
            env['SOFTVERBS_CONFIG'] = os.path.join(tmp, 'softverbs.conf')
            with open(env['SOFTVERBS_CONFIG'], 'w') as f:
                f.write(config)
        else:
            env.pop('SOFTVERBS_CONFIG', None)
        tests = os.path.join(tmp, 'tests')
        unpack(tests)
        proc = subprocess.Popen(['/usr/bin/python3', os.path.join(tests, 'run_tests.py'), '-v'],
                                cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out += '\nrun_suite.py: the suite ran past 600 s and was killed\n'
            proc.returncode = -1
    uid = os.getuid()
    for seg in os.listdir('/dev/shm'):
        if seg.startswith('softverbs-%d-%s' % (uid, fabric)):
            os.unlink(os.path.join('/dev/shm', seg))
    with open(log_path, 'w') as f:
        f.write(out)
    return proc.returncode, parse(out)


def print_table(name, results):
    counts = collections.defaultdict(collections.Counter)
    for mod, _, _, status, _ in results:
        counts[mod][status] += 1
    print('== %s port' % name)
    print('%-26s %7s %7s %7s %7s' % ('module', 'passed', 'failed', 'errored', 'skipped'))
    total = collections.Counter()
    for mod in sorted(counts):
        c = counts[mod]
        total.update(c)
        print('%-26s %7d %7d %7d %7d' % (mod, c['passed'], c['failed'], c['errored'],
                                          c['skipped']))
    print('%-26s %7d %7d %7d %7d' % ('total', total['passed'], total['failed'],
                                      total['errored'], total['skipped']))
    return total


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
    old_hugepages = reserve_hugepages()
    try:
        return run_all()
    finally:
        if old_hugepages is not None:
            with open(HUGEPAGES, 'w') as f:
                f.write(str(old_hugepages))


def run_all():
    build, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    logdir = os.path.join(build, 'meson-logs')
    os.makedirs(logdir, exist_ok=True)
    status = 0
    grand = collections.Counter()
    for name, config in PASSES:
        log_path = os.path.join(logdir, 'rdma-core-suite-%s.log' % name)
        listed = expected_skips(source, name)
        rc, results = run_pass(build, name, config, log_path)
        total = print_table(name, results)
        grand.update(total)
        print('full log: %s' % log_path)
        if not results:
            print('run_suite.py: no test results found in the %s log' % name)
            status = 1
            continue
        bad = [r for r in results if r[3] in ('failed', 'errored')]
        for mod, cls, test, st, _ in bad:
            print('%s (%s): %s.%s.%s' % (st.upper(), name, mod, cls, test))
        now_passing = [r for r in results if r[3] == 'passed' and r[:3] in listed]
        for mod, cls, test, _, _ in now_passing:
            print('NOW PASSING (%s), take it off docs/rdma-core-suite.md: %s.%s.%s' %
                  (name, mod, cls, test))
        unlisted = [r for r in results if r[3] == 'skipped' and not VENDOR.match(r[0])
                    and r[:3] not in listed]
        for mod, cls, test, _, reason in unlisted:
            print('skipped without an entry (%s): %s.%s.%s: %s' % (name, mod, cls, test, reason))
        if rc not in (0, 1) and not bad:
            print('run_suite.py: the %s pass exited with %s' % (name, rc))
            status = 1
        if bad or now_passing:
            status = 1
    # The plain closing line CI readers look for.
    print('rdma-core suite: %d passed, %d failed, %d skipped' %
          (grand['passed'], grand['failed'] + grand['errored'], grand['skipped']))
    return status


if __name__ == '__main__':
    sys.exit(main())
