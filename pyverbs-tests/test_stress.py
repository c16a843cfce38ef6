# SPDX-License-Identifier: MIT
"""What real traffic does, between processes, every byte checked
(tests/progs/sv_stress.c): both directions at once with a shared CQ and
reused receive buffers, a CQ resized while another process produces into
it, an SRQ under several senders, the ordering UCX's rendezvous relies on
(a WRITE's data is in place when a later SEND's completion is polled, a
READ's when its own is), and the service-copy path byte for byte.

Each case is one sv_stress run of a few seconds on a fabric of its own: the
program forks its processes, exchanges QP numbers itself, bounds every wait,
and prints a STAT line per process with the counts of messages that were
lost, duplicated, stale (the receive buffer's poison still there when the
completion was polled) or corrupt.  Every count but ok must be zero."""
import os
import re
import select
import subprocess
import time

import pytest

import svtest

MS = 2000  # per scenario; the program's own watchdogs bound the rest
BAD = ("lost", "dup", "stale", "corrupt", "badlen", "badwc")


@pytest.fixture
def stress(build_dir):
    p = build_dir / "tests" / "progs" / "sv_stress"
    if not p.exists():
        pytest.fail(f"{p} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    return p


def stats(out):
    """The STAT lines of a run, as dicts of their counters."""
    res = []
    for line in out.splitlines():
        if line.startswith("STAT "):
            res.append({k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)})
    return res


def check(p, scenario, procs):
    """Asserts a run passed: every process reported, nothing bad, data moved."""
    text = f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    st = stats(p.stdout)
    bad = {k: sum(s[k] for s in st) for k in BAD}
    assert all(v == 0 for v in bad.values()), f"{scenario}: {bad}\n{text}"
    assert p.returncode == 0 and f"OK {scenario}" in p.stdout, text
    assert len(st) == procs, text
    assert sum(s["ok"] for s in st) > 0, text
    return st


def run(stress, env, scenario, *args, procs=2, ms=MS):
    argv = [str(stress), scenario, "-t", str(ms)] + [str(a) for a in args]
    p = svtest.run(argv, env, timeout=ms / 1000 + 150)
    return check(p, scenario, procs)


@pytest.mark.parametrize("size", [8, 64, 176, 177, 256, 4096, 65536])
def test_bidir_shared_cq(stress, env, size):
    """Issue 9 item 1: both send 'SEND, wait for its completion' into 32
    receives reposted after each completion, send_cq == recv_cq.  Sizes on
    both sides of SV_CQE_INLINE_MAX (176), the payload that rides in the CQE."""
    st = run(stress, env, "bidir", "-s", size)
    # Both directions carried traffic, and all of it arrived
    for s in st:
        assert s["ok"] > 0 and s["recvd"] == s["expected"], st


@pytest.mark.parametrize("size", [8, 177, 4096])
def test_bidir_separate_cqs(stress, env, size):
    run(stress, env, "bidir", "-s", size, "-x")


@pytest.mark.parametrize("cqs", [[], ["-x"]], ids=["shared", "separate"])
def test_bidir_mixed_sizes_window(stress, env, cqs):
    """Sizes 8 B .. 64 KiB in turn, 8 SENDs in flight each way."""
    run(stress, env, "bidir", "-w", 8, *cqs)


@pytest.mark.parametrize("args", [["-w", 8], ["-w", 2, "-R", 4]], ids=["w8-every50", "w2-every4"])
def test_resize_under_producer(stress, env, args):
    """ibv_resize_cq grows and shrinks the receive CQ (at least 20 times;
    every 50 or every 4 receive completions) while the other process
    produces into it: no completion lost, doubled or reordered."""
    st = run(stress, env, "resize", *args, ms=3000)
    receiver = [s for s in st if s["proc"] == 0][0]
    assert receiver["resizes"] >= 20 and receiver["recvd"] == receiver["expected"] > 0, st


def test_srq_four_senders(stress, env):
    """Four sender processes, each on its own RC QP, into one SRQ; order
    and data checked per sender."""
    st = run(stress, env, "srq", "-n", 4, "-w", 8, procs=5)
    receiver = [s for s in st if s["proc"] == 0][0]
    assert receiver["recvd"] == receiver["expected"] > 0, st


@pytest.mark.parametrize("procs,cma", [(2, "1"), (3, "1"), (3, "0")],
                         ids=["2procs", "3procs", "3procs-service-copy"])
def test_xrc_srqs_both_directions(build_dir, env, procs, cma):
    """XRC (tests/progs/sv_xrc.c), what ibv_xsrq_pingpong does with every byte
    checked: each process sends to every other through an XRC send QP into
    the peer's 4 XRC SRQs (all completing into one CQ with its sends), both
    directions at once, random lengths up to 16 KiB, receive buffers
    poisoned and reposted.  Per (sender, SRQ) stream the sequence numbers
    arrive in order and complete, in the SRQ they were sent to."""
    prog = build_dir / "tests" / "progs" / "sv_xrc"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    if cma == "0":
        env["SOFTVERBS_CMA"] = "0"
    argv = [str(prog), "-p", str(procs), "-n", "3000", "-m", "16384", "-t", "60"]
    p = svtest.run(argv, env, timeout=150)
    st = check(p, "sv_xrc", procs)
    assert sum(s["ok"] for s in st) == procs * (procs - 1) * 3000, st


@pytest.mark.parametrize("cma", ["1", "0"], ids=["default", "service-copy"])
@pytest.mark.parametrize("notice", [16, 256])
def test_order_write_then_send(stress, env, cma, notice):
    """When the SEND that follows a WRITE completes at the target, every
    byte of the WRITE is there (UCX's rendezvous relies on it).  The notice
    SEND is 16 B (it rides in the CQE) or 256 B (it does not)."""
    if cma == "0":
        env["SOFTVERBS_CMA"] = "0"
    st = run(stress, env, "order-write", "-w", 8, "-N", notice)
    assert sum(s["writes"] for s in st) > 0, st


@pytest.mark.parametrize("cma", ["1", "0"], ids=["default", "service-copy"])
def test_order_read(stress, env, cma):
    """The data of a READ is in place when its completion is polled."""
    if cma == "0":
        env["SOFTVERBS_CMA"] = "0"
    st = run(stress, env, "order-read", "-w", 8)
    assert sum(s["reads"] for s in st) > 0, st


class Lines:
    """A child's stdout read line by line with a deadline.  Reads the raw
    descriptor: a buffered reader's lines would be invisible to select()."""

    def __init__(self, argv, env):
        self.p = subprocess.Popen([str(a) for a in argv], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        self.buf = b""
        self.all = []

    def line(self, timeout):
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line from {self.p.args} in {timeout} s")
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if r:
                chunk = os.read(self.p.stdout.fileno(), 65536)
                if not chunk:
                    return None  # end of output
                self.buf += chunk
        l, self.buf = self.buf.split(b"\n", 1)
        self.all.append(l.decode())
        return self.all[-1]

    def finish(self, timeout):
        """Closes stdin, reads the rest, waits: (returncode, stdout, stderr)."""
        out, err = self.p.communicate(timeout=timeout)
        text = "\n".join(self.all) + "\n" + (self.buf + out).decode()
        return self.p.returncode, text, err.decode()

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.communicate()


def service_run(stress, env, softverbs, fabric):
    """sv_stress service with -H: while its processes still hold their
    devices, `softverbs show` says which copy path each uses."""
    proc = Lines([stress, "service", "-t", 3000, "-H"], env)
    try:
        show = None
        while True:
            line = proc.line(timeout=150)
            if line is None or line.startswith("FAILED"):
                break
            if line == "HOLDING":
                show = subprocess.run([softverbs, "show", fabric], env=env,
                                      capture_output=True, text=True, timeout=30).stdout
                proc.p.stdin.write(b"\n")
                break
        rc, out, err = proc.finish(timeout=60)
    finally:
        proc.kill()
    done = subprocess.CompletedProcess(proc.p.args, rc, out, err)
    st = check(done, "service", 2)
    assert show is not None, out
    slots = [l for l in show.splitlines() if l.strip().startswith("slot ")]
    return st, slots


def test_service_copy_byte_for_byte(stress, env, softverbs, fabric):
    """SOFTVERBS_CMA=0: SEND, WRITE and READ of 1 B .. 1 MiB through the
    peer's service thread, every byte compared, and both processes on the
    service-copy path while they run."""
    env["SOFTVERBS_CMA"] = "0"
    st, slots = service_run(stress, env, softverbs, fabric)
    assert sum(s["sends"] + s["writes"] + s["reads"] for s in st) >= 27, st
    # The acting process copied; the target's 8-byte acks need no copy
    paths = [l for l in slots if "data path" in l]
    assert len(slots) == 2 and paths, slots
    assert all("service-copy" in l for l in paths), slots


def test_default_path_byte_for_byte(stress, env, softverbs, fabric):
    """The same run by cross-memory attach (remapping off: the buffers are
    page-aligned, so it would map them)."""
    st, slots = service_run(stress, dict(env, SOFTVERBS_REMAP="0"), softverbs, fabric)
    assert len(slots) == 2 and any("cross-memory-attach" in l for l in slots), slots
    assert not any("service-copy" in l for l in slots), slots


def test_remapped_path_byte_for_byte(stress, env, softverbs, fabric):
    """The same run with remapping on (the default): the peers copy into
    their mappings of each other's arenas, no cross-memory attach."""
    st, slots = service_run(stress, env, softverbs, fabric)
    assert len(slots) == 2 and any("mapped-direct" in l for l in slots), slots
    assert not any("service-copy" in l or "cross-memory-attach" in l for l in slots), slots


@pytest.mark.parametrize("fault,counter", [("corrupt", "corrupt"), ("skip", "lost")])
def test_checker_catches_injected_faults(stress, env, fault, counter):
    """The checks are live: a sender that flips a byte in some messages, or
    skips a sequence number, makes the run fail with that count raised."""
    p = svtest.run([str(stress), "bidir", "-t", "1500", "-s", "256", "-F", fault], env,
                   timeout=150)
    st = stats(p.stdout)
    assert p.returncode != 0 and "OK bidir" not in p.stdout, p.stdout + p.stderr
    assert "FAILED bidir" in p.stdout, p.stdout + p.stderr
    assert sum(s[counter] for s in st) > 0, p.stdout + p.stderr


def test_bad_arguments(stress, env):
    """An unknown scenario or an out-of-range size fails with a message."""
    for args in (["nonesuch"], ["bidir", "-s", "1048576"], ["bidir", "-w", "0"]):
        p = svtest.run([str(stress)] + args, env, timeout=30)
        assert p.returncode != 0 and "OK" not in p.stdout, args
        assert p.stderr.strip(), args


def test_resize_against_local_pushers_and_arms(build_dir, env):
    """One CQ resized every 200 us while two threads of the same process
    complete into it (push_own) and a poller re-arms it: completions arrive
    in order per sender, none lost or doubled, no crash (the old ring used
    to be unmapped under a pusher), one event per arm (a resize used to copy
    the arm across while a producer of the old ring fired it there: two
    events), and the last arm still raises its event (an arm could land on
    the ring being replaced)."""
    prog = build_dir / "tests" / "progs" / "sv_cqrace"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    p = svtest.run([str(prog), "-s", "3"], env, timeout=120)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    m = re.search(r"OK sv_cqrace completions=(\d+) resizes=(\d+) arms=(\d+) events=(\d+)",
                  p.stdout)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, p.stdout
    assert 2 <= int(m.group(4)) <= int(m.group(3)), p.stdout
