# SPDX-License-Identifier: MIT
"""Helpers for the UCX and Open MPI tests (test_ucx.py, test_mpi.py).

UCX keeps a verbs device only when /dev/infiniband/<dev_name> (uverbs0 for
loop0) is a character device the user may read and write.  softverbs-run
presents one through its view (issue 10, part 1).  These tests run every
program through softverbs-run, and:

- run when the node is visible to a program started by softverbs-run;
- SKIP, saying why, when it is not and this build's softverbs-run has no
  view (no preload in it): nothing here can work then;
- FAIL when it is not although softverbs-run has a view: the view is broken.

SOFTVERBS_TEST_UCX_WRAP, when set, is a command prefix (split like a shell
word list) put in front of every softverbs-run command line, for running
these tests where the node has to come from elsewhere, e.g. a script that
runs its arguments in a private mount namespace with a node made there.
"""
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import time

import svtest

WRAP = shlex.split(os.environ.get("SOFTVERBS_TEST_UCX_WRAP", ""))
# Longer matrices and repetitions: scripts/test.sh --full sets this.
FULL = os.environ.get("SOFTVERBS_TEST_FULL", "") == "1"

# UCX over loop0 only: its verbs transports on port 1, and UCX's loopback
# transport for a process's endpoint to itself.  No shared memory (posix,
# sysv, cma, sm) and no tcp, so traffic between processes can only go over
# loop0.
UCX_ENV = {
    "UCX_TLS": "rc_verbs,ud_verbs,self",
    "UCX_NET_DEVICES": "loop0:1",
    # Our variables reach UCX as its own: no warning about unused ones.
    "UCX_WARN_UNUSED_ENV_VARS": "n",
}

_NODE_CHECK = """
import os, stat, sys
p = "/dev/infiniband/uverbs0"
try:
    st = os.stat(p)
except OSError as e:
    sys.exit(f"{p}: {e.strerror}")
if not stat.S_ISCHR(st.st_mode):
    sys.exit(f"{p} is not a character device")
if not os.access(p, os.R_OK | os.W_OK):
    sys.exit(f"{p} is not readable and writable")
print("node ok")
"""


def has_view(softverbs_run):
    """Whether this build's softverbs-run presents the device files itself
    (the view of issue 10 is an interposer that softverbs-run preloads)."""
    try:
        text = pathlib.Path(softverbs_run).read_text()
    except OSError:
        return False
    return "LD_PRELOAD" in text


def node_problem(softverbs_run, env):
    """None when a program run through softverbs-run sees uverbs0 as UCX
    wants it, else the reason it does not."""
    p = svtest.run(WRAP + [softverbs_run, svtest.PYTHON, "-c", _NODE_CHECK], env, timeout=30)
    if p.returncode == 0 and "node ok" in p.stdout:
        return None
    return (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}")


_node_checked = {}


def require_node(pytest, softverbs_run, env):
    """Skips (no view in this build) or fails (a view that shows no node).
    Checked once per session and softverbs-run."""
    if softverbs_run not in _node_checked:
        _node_checked[softverbs_run] = node_problem(softverbs_run, env)
    why = _node_checked[softverbs_run]
    if why is None:
        return
    if has_view(softverbs_run) or WRAP:
        pytest.fail(f"softverbs-run has a view (or SOFTVERBS_TEST_UCX_WRAP is set) but a "
                    f"program it runs does not see the device node: {why}", pytrace=False)
    pytest.skip("UCX needs /dev/infiniband/uverbs0 and this build's softverbs-run has no "
                "view to present it (issue 10 part 1; or set SOFTVERBS_TEST_UCX_WRAP): "
                + why)


def free_port():
    """A TCP port nothing listens on now (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """Whether some socket listens on TCP port (IPv4 or IPv6)."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except FileNotFoundError:
            pass
    return False


def kill_group(p):
    """Kills p's whole process group (the wrapper, softverbs-run's exec,
    mpirun's daemons and ranks), then reaps p."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def popen(argv, env):
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def run_one(argv, env, timeout):
    """Runs argv in a session of its own; returns (exit status, output).
    On timeout the whole group is killed and the test fails."""
    p = popen(argv, env)
    try:
        out = p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        kill_group(p)
        rest = p.stdout.read() if p.stdout else ""
        raise AssertionError(f"{' '.join(argv)} timed out after {timeout}s (killed):\n{rest}")
    finally:
        kill_group(p)
    return p.returncode, out


def perftest_pair(softverbs_run, args, env, timeout=60):
    """ucx_perftest server and client through softverbs-run (TCP on
    localhost for the setup).  Returns (server rc, out), (client rc, out);
    a run past timeout fails with both outputs, and both are killed."""
    port = free_port()
    common = WRAP + [softverbs_run, "ucx_perftest", "-p", str(port)] + args
    procs = []
    try:
        srv = popen(common, env)
        procs.append(srv)
        deadline = time.monotonic() + 20
        while not listening(port):
            if srv.poll() is not None or time.monotonic() > deadline:
                if srv.poll() is None:
                    kill_group(srv)
                out = srv.communicate(timeout=5)[0]
                raise AssertionError(f"ucx_perftest server never listened on {port}:\n{out}")
            time.sleep(0.02)
        cli = popen(common + ["localhost"], env)
        procs.append(cli)
        end = time.monotonic() + timeout
        try:
            cout = cli.communicate(timeout=timeout)[0]
            sout = srv.communicate(timeout=max(1, end - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            for p in procs:
                kill_group(p)
            raise AssertionError(f"{' '.join(args)} timed out after {timeout}s (both killed)\n"
                                 f"server:\n{srv.stdout.read() if srv.stdout else ''}\n"
                                 f"client:\n{cli.stdout.read() if cli.stdout else ''}")
        return (srv.returncode, sout), (cli.returncode, cout)
    finally:
        for p in procs:
            kill_group(p)


def final_row(out):
    """ucx_perftest's 'Final:' row as a list of floats (iterations, then
    latency typical/average/overall, bandwidth average/overall, message
    rate average/overall), or None."""
    for line in out.splitlines():
        if line.startswith("Final:"):
            return [float(x) for x in line.split()[1:]]
    return None
