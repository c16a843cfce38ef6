# SPDX-License-Identifier: MIT
"""Traffic through our library by small C programs (tests/progs), built by
meson against <infiniband/verbs.h> and the system's -libverbs, run with
LD_LIBRARY_PATH pointing at our build: one subprocess per scenario, each on
a fabric of its own (the env fixture), each with a timeout."""
import os
import select
import shutil
import signal
import subprocess
import time

import pytest

import svtest

SCENARIOS = ["rc_ops", "inline_sge", "signaling", "solicited", "uc", "ud", "mcast", "mcast_self", "emfile", "srq",
             "cq_overflow", "errors", "rnr", "post_errors", "query_modify", "threads",
             "ud_grh_burst", "mr_inputs", "retry", "modify_values"]


@pytest.fixture
def progs(build_dir):
    d = build_dir / "tests" / "progs"
    for p in ("sv_traffic", "sv_peer"):
        if not (d / p).exists():
            pytest.fail(f"{d / p} missing: build with ninja -C {build_dir} "
                        "(needs libibverbs-dev)")
    return d


def run_prog(argv, env, timeout=150):
    p = svtest.run([str(a) for a in argv], env, timeout=timeout)
    assert p.returncode == 0, (f"{argv} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                               f"stderr:\n{p.stderr}")
    return p.stdout


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_one_process(progs, env, scenario):
    out = run_prog([progs / "sv_traffic", scenario], env)
    assert f"OK {scenario}" in out


@pytest.mark.parametrize("scenario", ["rc_ops", "uc", "ud", "errors", "threads"])
def test_scenario_across_two_devices(progs, env, scenario):
    """The two QPs of each pair on different devices, loop0 and loop1."""
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    out = run_prog([progs / "sv_traffic", scenario, "loop0", "loop1"], env)
    assert f"OK {scenario}" in out


@pytest.mark.skipif(not shutil.which("strace"), reason="strace not installed")
def test_roce_ud_reads_gids_once(progs, env, tmp_path):
    """On an Ethernet port every UD datagram carries a GRH whose source GID
    comes from the netdev's addresses.  Read through netlink per datagram,
    it cost 150-300 us each (most of fi_pingpong's time on a RoCE port):
    500 datagrams opened 502 netlink sockets before, a cached table (a
    second old at most) opens a couple whatever the count."""
    conf = tmp_path / "roce.conf"
    conf.write_text("loop0.link_layer = ethernet\nloop0.netdev = lo\n")
    env["SOFTVERBS_CONFIG"] = str(conf)
    trace = tmp_path / "socket.trace"
    out = run_prog(["strace", "-f", "-qq", "-e", "trace=socket", "-o", trace,
                    progs / "sv_traffic", "ud_grh_burst"], env)
    assert "OK ud_grh_burst" in out and "500 datagrams checked" in out, out
    text = trace.read_text()
    netlink = text.count("AF_NETLINK")
    assert 0 < netlink <= 10, f"{netlink} netlink sockets for 500 datagrams:\n{text[:2000]}"


@pytest.mark.parametrize("link", ["ib", "roce"])
def test_alternate_path_only_on_infiniband(progs, env, tmp_path, link):
    """An alternate path (IBV_QP_ALT_PATH) is taken on an InfiniBand port
    and refused EINVAL on an Ethernet one, as the kernel's _ib_modify_qp
    bans it in RoCE mode (a helper's probe: it was taken on RoCE too)."""
    if link == "roce":
        conf = tmp_path / "roce.conf"
        conf.write_text("loop0.link_layer = ethernet\nloop0.netdev = lo\n")
        env["SOFTVERBS_CONFIG"] = str(conf)
    out = run_prog([progs / "sv_traffic", "alt_path"], env)
    want = "Ethernet: refused" if link == "roce" else "InfiniBand: taken"
    assert f"alt path on {want}" in out and "OK alt_path" in out, out


def test_roce_ud_grh_is_the_ip_header(progs, env, tmp_path):
    """On a RoCE v2 port a UD receive's 40-byte GRH area holds the
    datagram's IP header, as rxe and mlx5 give it: IPv4 (both GIDs
    IPv4-mapped, as on lo's 127.0.0.1) in its last 20 bytes with a valid
    checksum, the first 20 zero; ibv_init_ah_from_wc reads it back to the
    sender's GID (sv_traffic ud_grh_burst's check_grh).  It was an IB GRH
    (next header 0x1b) on every port, which rdma-core's own parser takes
    for RoCE v1, and our parser misread some GRHs as IPv4."""
    conf = tmp_path / "roce.conf"
    conf.write_text("loop0.link_layer = ethernet\nloop0.netdev = lo\n")
    env["SOFTVERBS_CONFIG"] = str(conf)
    out = run_prog([progs / "sv_traffic", "ud_grh_burst"], env)
    assert "OK ud_grh_burst" in out and "500 datagrams checked" in out, out


def test_programs_really_use_our_library(progs, env):
    """Without our library path the system's rdma-core finds no loop0: the
    programs are not linked to our build by an rpath."""
    e = dict(env)
    del e["LD_LIBRARY_PATH"]
    p = svtest.run([str(progs / "sv_traffic"), "rc_ops"], e, timeout=30)
    assert p.returncode != 0 and "OK rc_ops" not in p.stdout


class Proc:
    """A child whose stdout lines we read with a deadline and relay."""

    def __init__(self, argv, env):
        self.p = subprocess.Popen([str(a) for a in argv], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  bufsize=1)
        self.buf = b""

    def line(self, timeout=20):
        # Lines are split here from the raw descriptor: select() cannot see
        # lines a buffered reader already holds, so a child that printed
        # two lines at once would look silent until its next output.
        end = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line from {self.p.args} in {timeout} s")
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.p.wait(timeout=10)
                    raise AssertionError(f"{self.p.args} ended ({self.p.returncode}): "
                                         f"{self.p.stderr.read()}")
                self.buf += chunk
        l, self.buf = self.buf.split(b"\n", 1)
        return l.decode(errors="replace")

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def finish(self, timeout=30):
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError(f"{self.p.args} did not end")
        err = self.p.stderr.read()
        return self.p.returncode, err

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            try:
                f.close()
            except Exception:
                pass


@pytest.fixture
def procs():
    live = []
    yield live
    for p in live:
        p.kill()


@pytest.mark.parametrize("devs", [("loop0", "loop0"), ("loop0", "loop1"), ("loop1", "loop0")])
def test_two_processes(progs, env, procs, devs):
    """SEND 1 B..1 MiB, RDMA READ 2 MiB, RDMA WRITE, CAS and FAA between two
    processes; each side checks the data it owns."""
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    srv = Proc([progs / "sv_peer", "server", devs[0]], env)
    procs.append(srv)
    info = srv.line()
    assert info.startswith("INFO ")
    cli = Proc([progs / "sv_peer", "client", devs[1]], env)
    procs.append(cli)
    cli.send(info)
    cinfo = cli.line()
    assert cinfo.startswith("INFO ")
    srv.send(cinfo)
    assert srv.line() == "READY"
    cli.send("READY")
    assert cli.line(60) == "DONE"
    assert srv.line(60) == "DONE 22"
    rc, err = cli.finish()
    assert rc == 0, err
    rc, err = srv.finish()
    assert rc == 0, err


@pytest.mark.parametrize("traffic", ["mixed", "sends", "small", "small-zombie"])
def test_killed_peer(progs, env, procs, fabric, traffic):
    """SIGKILL the target mid-transfer: the survivor's outstanding WRs end in
    RETRY_EXC_ERR then WR_FLUSH_ERR within the QP's timeout (4.096 us *
    2^14 * (retry_cnt 3 + 1), about 0.3 s, plus slack), one flush for each
    WR posted behind the failed one and nothing more; its other QPs keep
    working, and a new process uses the fabric at once.  "sends": the WR
    that first meets the dead target is a SEND, which takes one of its
    receive WQEs before finding its owner dead: no answer all the same, not
    a remote operation error.  "small": 64-byte SENDs into receive buffers
    that stay in place (remapping off), which touch none of the dead
    target's memory: they completed SUCCESS, one per receive it had posted
    (a helper's probe).  "small-zombie": the same while the target is not
    reaped yet (a zombie passed the liveness look: the SENDs waited for
    ever)."""
    if traffic.startswith("small"):
        env = dict(env, SOFTVERBS_REMAP="0")
    vic = Proc([progs / "sv_peer", "victim", "loop0"], env)
    procs.append(vic)
    info = vic.line()
    mode = {"sends": ["sends"], "small": ["small"], "small-zombie": ["small"]}.get(traffic, [])
    sur = Proc([progs / "sv_peer", "survivor", "loop0"] + mode, env)
    procs.append(sur)
    sur.send(info)
    vic.send(sur.line())
    assert vic.line() == "READY"
    sur.send("READY")
    assert sur.line(30) == "STREAMING"
    os.kill(vic.p.pid, signal.SIGKILL)
    t0 = time.monotonic()
    if traffic == "small-zombie":
        # Dead, not reaped: /proc shows it as a zombie until the wait.
        deadline = time.monotonic() + 10
        while not open(f"/proc/{vic.p.pid}/stat").read().rsplit(")", 1)[1].startswith(" Z"):
            assert time.monotonic() < deadline, "the victim did not die"
            time.sleep(0.01)
    else:
        vic.p.wait(timeout=10)
    if traffic != "mixed":
        sur.send("GO")  # The survivor waits for the kill before its next SEND
    first = sur.line(20)
    elapsed = time.monotonic() - t0
    assert first == "FIRSTERR transport retry counter exceeded", first
    assert elapsed < 5, f"error completion took {elapsed:.1f} s"
    err_line = sur.line(20)
    assert err_line.startswith("ERR transport retry counter exceeded "), err_line
    # Exactly the WRs posted behind the failed one are flushed: the
    # survivor keeps 16 in flight and posts nothing after the error.
    counts = dict(kv.split("=") for kv in err_line.split()[5:])
    flushed, posted, first = (int(counts[k]) for k in ("flushed", "posted", "first_err_wr"))
    assert int(counts["ok_after"]) == 0, err_line
    assert flushed == posted - first - 1, err_line
    assert 0 <= flushed <= 15 and posted > first >= (50 if traffic != "mixed" else 200), err_line
    assert sur.line(20) == "OK"
    rc, err = sur.finish()
    assert rc == 0, err
    vic.p.wait(timeout=10)
    # A new process works on the same fabric, at once
    t0 = time.monotonic()
    out = run_prog([progs / "sv_traffic", "rc_ops"], env, timeout=30)
    assert "OK rc_ops" in out
    assert time.monotonic() - t0 < 10
    # ...and so does a fresh pair of processes
    srv = Proc([progs / "sv_peer", "server", "loop0"], env)
    procs.append(srv)
    cli = Proc([progs / "sv_peer", "client", "loop0"], env)
    procs.append(cli)
    cli.send(srv.line())
    srv.send(cli.line())
    assert srv.line() == "READY"
    cli.send("READY")
    assert cli.line(60) == "DONE"
    assert srv.line(60) == "DONE 22"
    assert cli.finish()[0] == 0
    assert srv.finish()[0] == 0


def batch_pair(progs, env, procs, what, trace=None):
    """sv_peer batch WHAT against sv_peer batch-target, the client's
    commands relayed to the target and its answers back."""
    qpt = "uc" if what.startswith("uc-") else "rc"
    tgt = Proc([progs / "sv_peer", "batch-target", "loop0", qpt], env)
    procs.append(tgt)
    info = tgt.line()
    argv = [progs / "sv_peer", "batch", "loop0", what]
    if trace:
        argv = ["strace", "-f", "-qq", "-o", trace,
                "-e", "trace=process_vm_writev,process_vm_readv"] + argv
    cli = Proc(argv, env)
    procs.append(cli)
    cli.send(info)
    tgt.send(cli.line())
    cli.send(tgt.line())  # READY
    while (cmd := cli.line(30)) != "DONE":
        tgt.send(cmd)
        cli.send(tgt.line(30))
    rc, err = cli.finish()
    assert rc == 0, err
    rc, err = tgt.finish()
    assert rc == 0, err


@pytest.mark.parametrize("what", ["write", "read", "write-fault", "read-fault",
                                  "write-badkey", "read-badlkey", "uc-write-fault"])
def test_batched_rdma(progs, env, procs, tmp_path, what):
    """64 RDMA WRITEs (READs) to another process in one ibv_post_send: every
    byte lands, the completions come in WR order, and the data of all of
    them moves in one process_vm_writev (readv), counted with strace where
    it is installed.  The -fault forms unmap a page of WR 37's target
    first: WRs 0..36 succeed with their data in place, 37 gets
    REM_ACCESS_ERR, 38..63 WR_FLUSH_ERR, and none of their bytes lands
    (docs/design.md, the engine's doorbell batch).  -badkey and -badlkey
    fail WR 37's checks instead (REM_ACCESS_ERR, LOC_PROT_ERR): the batch
    before it moves and completes first, in its one call, and the WRs
    after it are flushed.  On UC the faulting WR completes as sent and the
    WRs after it run one by one, as the backlog, and land."""
    trace = tmp_path / "strace.out" if shutil.which("strace") else None
    # The batch is for memory that stays unmapped: with remapping on, the
    # target's buffer (its own mmap) would be copied into without a call
    # (test_remapped_rdma_makes_no_system_call).
    batch_pair(progs, dict(env, SOFTVERBS_REMAP="0"), procs, what, trace)
    if trace:
        lines = trace.read_text().splitlines()
        calls = {n: sum(f" {n}(" in l or l.startswith(f"{n}(") for l in lines)
                 for n in ("process_vm_writev", "process_vm_readv")}
        want = "process_vm_readv" if "read" in what else "process_vm_writev"
        # uc-: the batch up to the fault, then WRs 38..63 alone
        ncalls = 1 + 26 if what.startswith("uc-") else 1
        assert calls[want] == ncalls, (calls, lines[:20])
        assert sum(calls.values()) == ncalls, calls


@pytest.mark.parametrize("what", ["write", "read"])
def test_remapped_rdma_makes_no_system_call(progs, env, procs, tmp_path, what):
    """The same 64 WRITEs (READs) with remapping on (the default): the
    target's buffer, its own page-aligned mmap, moved onto its arena at
    registration, so the requester copies into its mapping of it: every
    byte checked as above, and not one process_vm_writev (readv) made."""
    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    trace = tmp_path / "strace.out"
    batch_pair(progs, env, procs, what, trace)
    lines = trace.read_text().splitlines()
    calls = [l for l in lines if "process_vm_" in l]
    assert not calls, calls[:20]


def test_library_outlives_dlclose(build_dir, env):
    """libibverbs.so.1 dlopen()ed as a plugin brings it in, a SEND left in
    RNR retries (the progress thread asleep on a 491 ms timer), everything
    destroyed, the library dlclose()d, the program alive 2 s later: our
    library is never unmapped under its own threads (it is linked -z
    nodelete; Open MPI unloads btl openib at MPI_Finalize)."""
    prog = build_dir / "tests" / "progs" / "sv_dlclose"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir}")
    p = svtest.run([str(prog)], env, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "OK sv_dlclose", \
        f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    flags = subprocess.run(["readelf", "-d", str(build_dir / "libibverbs-compat" /
                                                 "libibverbs.so.1")],
                           capture_output=True, text=True, check=True).stdout
    assert "NODELETE" in flags, flags


@pytest.mark.parametrize("mode", ["same", "twomaps", "twoowners", "fdmr", "odp", "overlap"])
def test_atomics_on_one_word_through_two_addresses(progs, env, mode):
    """tests/progs/sv_atomalias.c: two clients' FETCH_ADDs and CMP_SWPs on
    one word of a memfd page that their keys name at two addresses (two
    mappings in one owner, two owners, the memfd's own MR beside a
    mapping's).  The atomic locks took the owner's address before, so the
    two sides' read-modify-writes interleaved: a third of the adds were
    lost, all with success completions.  An HCA locks the physical word.
    odp and overlap: two keys of one owner at one address, one over a
    file as far as the library knows (a remapped page) and one not (an
    on-demand MR; a range of several mappings): a review found the first
    fix, which locked by the file alone when it knew one, lost adds
    there."""
    out = run_prog([progs / "sv_atomalias", mode, "-N", "3000"], env, timeout=300)
    assert f"ATOMALIAS OK {mode}" in out


def test_atomics_two_stripes_with_a_stopped_holder(progs, env):
    """sv_atomalias stopped: odp's two keys of one word, one taking the
    stripes of the address and of the file, the other the address's
    alone; a stopped process named the file stripe's holder for 2.3 s,
    eight times.  A client that held the address's stripe while it waited
    for the file's lost it to the takeover of a running holder after 2 s,
    and adds were lost (a review's probe; it failed 4 runs of 4).  Now no
    stripe is held while waiting for the other."""
    out = run_prog([progs / "sv_atomalias", "stopped", "-N", "1000000"], env, timeout=300)
    assert "ATOMALIAS OK stopped" in out
