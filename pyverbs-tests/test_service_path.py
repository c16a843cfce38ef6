# SPDX-License-Identifier: MIT
"""The copy path for kernels that refuse cross-memory attach (Yama
ptrace_scope 2/3, seccomp): with SOFTVERBS_CMA=0 every byte between two
processes goes through the peer's service thread and bounce buffer
(sv_svc_ring).  `softverbs show` must say which path each process used.

Data is checked byte for byte by our own programs: tests/progs/sv_pingpong
(SEND with immediate, a seeded pattern, sequence numbers, reused receive
buffers) and tests/progs/sv_peer (SEND 1 B..1 MiB, a 2 MiB READ, a 64 KiB
WRITE and atomics, each verified).  Debian's unmodified ibv_rc_pingpong and
perftest also run through the service path, as smoke tests of the tools:
they check completions and byte counts, not data (perftest has no data
check at all; rc_pingpong's -c looks at one byte per page)."""
import os
import signal
import subprocess

from test_traffic_pingpong import checked_pingpong, free_port, listening, pingpong
from test_traffic_progs import Proc

import time

import pytest


def lease_paths(softverbs, env, fabric):
    out = subprocess.run([softverbs, "show", fabric], env=env, capture_output=True, text=True,
                         timeout=30).stdout
    return [l for l in out.splitlines() if l.strip().startswith("slot ")]


def assert_all_service(softverbs, env, fabric, used="all"):
    """No process of the fabric used cross-memory attach; "all" of them
    copied through the service path, or "any" (only one side copies: the
    requester of sv_peer's one-sided operations), or "none" (messages small
    enough to travel in the ring itself)."""
    slots = lease_paths(softverbs, env, fabric)
    assert slots, slots
    service = [l for l in slots if "service-copy" in l]
    if used == "all":
        assert len(service) == len(slots), slots
    elif used == "any":
        assert service, slots
    assert not any("cross-memory-attach " in l + " " for l in slots), slots


# 100000 bytes fit one bounce buffer (256 KiB); 1 MiB takes four service
# requests; 1 and 7 bytes travel in the ring (no copy path at all).
SERVICE_SIZES = [(1, 200, "none"), (7, 200, "none"), (4096, 200, "all"), (100000, 50, "all"),
                 (1 << 20, 5, "all")]


@pytest.mark.parametrize("size,n,service", SERVICE_SIZES)
def test_send_data_checked_through_service(env, softverbs, fabric, build_dir, size, n, service):
    env = dict(env, SOFTVERBS_CMA="0")
    checked_pingpong(build_dir, env, ["-s", size, "-n", n])
    assert_all_service(softverbs, env, fabric, used=service)


@pytest.mark.parametrize("transport,size", [("uc", 4096), ("ud", 2048), ("srq", 65536)])
def test_other_transports_data_checked_through_service(env, softverbs, fabric, build_dir,
                                                       transport, size):
    env = dict(env, SOFTVERBS_CMA="0")
    checked_pingpong(build_dir, env, ["-t", transport, "-s", size, "-n", 100])
    assert_all_service(softverbs, env, fabric)


def test_one_sided_data_checked_through_service(env, softverbs, fabric, build_dir):
    """sv_peer through the service path: SEND 1 B..1 MiB (every byte
    compared, in order), READ 2 MiB and WRITE 64 KiB verified, CAS and
    FAA results checked."""
    env = dict(env, SOFTVERBS_CMA="0")
    progs = build_dir / "tests" / "progs"
    srv = Proc([progs / "sv_peer", "server", "loop0"], env)
    cli = None
    try:
        cli = Proc([progs / "sv_peer", "client", "loop0"], env)
        cli.send(srv.line())
        srv.send(cli.line())
        assert srv.line() == "READY"
        cli.send("READY")
        assert cli.line(120) == "DONE"
        assert srv.line(120) == "DONE 22"
        rc, err = cli.finish()
        assert rc == 0, err
        # The server checks the client's WRITE and atomics once stdin closes.
        rc, err = srv.finish()
        assert rc == 0, err
    finally:
        for p in (srv, cli):
            if p:
                p.kill()
    assert_all_service(softverbs, env, fabric, used="any")


def test_rc_pingpong_tool_through_service(env, softverbs, fabric):
    """Debian's ibv_rc_pingpong through the service path (smoke test of the
    unmodified tool; the data checks are the tests above)."""
    env = dict(env, SOFTVERBS_CMA="0")
    pingpong(env, "ibv_rc_pingpong", ["-c", "-s", "100000", "-n", "50"])
    pingpong(env, "ibv_rc_pingpong", ["-c", "-s", "1048576", "-n", "5"])
    assert_all_service(softverbs, env, fabric)


def test_default_path_is_cross_memory_attach(env, softverbs, fabric, build_dir):
    checked_pingpong(build_dir, env, ["-s", 100000, "-n", 20])
    pingpong(env, "ibv_rc_pingpong", ["-c", "-s", "100000", "-n", "20"])
    slots = lease_paths(softverbs, env, fabric)
    assert slots and all("cross-memory-attach" in l for l in slots), slots
    assert not any("service-copy" in l for l in slots), slots


def perftest_pair(env, tool, args, timeout=120):
    """The client's output of a perftest pair that exited 0.  perftest fits
    its cycle counter to gettimeofday and, on a loaded machine (the TSan
    lane's), can find r^2 under 0.9: it then prints "Can't produce a report"
    and exits 1 after the traffic ran.  That is the tool's clock, not the
    device: the pair runs again, at most twice, for that message only."""
    for _ in range(3):
        out, ok = perftest_once(env, tool, args, timeout)
        if ok or "Correlation coefficient r^2" not in out:
            break
    assert ok, out
    return out.split("\0", 1)[0]


def perftest_once(env, tool, args, timeout):
    port = free_port()
    common = ["-d", "loop0", "-p", str(port)] + args
    srv = subprocess.Popen([tool] + common, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    cli = None
    try:
        end = time.monotonic() + 20
        while not listening(port):
            assert srv.poll() is None, srv.communicate()
            assert time.monotonic() < end, f"{tool} server never listened"
            time.sleep(0.02)
        cli = subprocess.Popen([tool] + common + ["127.0.0.1"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        cout, _ = cli.communicate(timeout=timeout)
        sout, _ = srv.communicate(timeout=30)
    finally:
        for p in (srv, cli):
            if p and p.poll() is None:
                p.kill()
                p.communicate()
    return cout + "\0" + sout, cli.returncode == 0 and srv.returncode == 0


def test_perftest_read_write_atomic_through_service(env, softverbs, fabric):
    """perftest's READ, WRITE and atomic tools complete through the service
    path: a smoke test (perftest checks no data; sv_peer above does)."""
    env = dict(env, SOFTVERBS_CMA="0")
    for tool in ("ib_read_bw", "ib_write_bw", "ib_atomic_bw"):
        out = perftest_pair(env, tool, ["-n", "200"])
        assert "#bytes" in out, out
    slots = lease_paths(softverbs, env, fabric)
    assert any("service-copy" in l for l in slots), slots


# A receiver stopped (SIGSTOP, a debugger) stops its service thread too; a
# requester gives up on a live peer that has not served a request in
# kServiceGiveUpNs (10 s).  tests/progs/sv_stuck, with remapping off so that
# nothing reaches the receiver's memory except through its service.
IBV_WC_SUCCESS, IBV_WC_LOC_QP_OP_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_REM_OP_ERR = 0, 2, 5, 11
IBV_QPS_RTS, IBV_QPS_ERR = 3, 6
SERVING, DONE, IDLE = 3, 2, 0


def stuck_fields(line, tag):
    assert line.startswith(tag + " "), line
    return dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)


def stuck_env(env, tmp_path):
    return dict(env, SOFTVERBS_CMA="0", SOFTVERBS_REMAP="0", SV_STUCK_GO=str(tmp_path / "go"))


@pytest.mark.parametrize("op,senders", [("send", 1), ("write_imm", 1), ("write_imm", 3)])
def test_stopped_receiver_fails_the_message_visibly(env, build_dir, op, senders):
    """A SEND or WRITE WITH IMM whose receiver stays stopped past the
    service's 10 s: its receive WQE was taken, so a retry would take the
    next one and leave this one consumed with no completion (WRITE WITH
    IMM did: two WQEs gone per message, the sender ending in
    RETRY_EXC_ERR).  Instead the receive completes in error
    (LOC_QP_OP_ERR), the receiver's QP fails and flushes the rest, each
    WQE completing once, and the sender gets REM_OP_ERR.  With three
    senders on three QPs into the one stopped process, those queued on its
    service ring's lock behind the first end the same way (the lock's wait
    used to end in "peer gone", so a retry, and a lost WQE).  No byte
    reached the receiver's memory."""
    p = subprocess.run([str(build_dir / "tests" / "progs" / "sv_stuck"), op, str(senders)],
                       env=dict(env, SOFTVERBS_CMA="0", SOFTVERBS_REMAP="0"),
                       capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, (p.stdout, p.stderr)
    lines = p.stdout.splitlines()
    sent = [stuck_fields(l, "SENDER") for l in lines if l.startswith("SENDER")]
    assert len(sent) == senders, lines
    for s in sent:
        assert int(s["status"]) == IBV_WC_REM_OP_ERR, lines
        assert 9 <= int(s["secs"]) < 35, lines  # Waits, not one per retry
        assert int(s["qp"]) == IBV_QPS_ERR, lines
    r = stuck_fields(next(l for l in lines if l.startswith("RECEIVER")), "RECEIVER")
    want = sorted(f"{100 * q + i}:{IBV_WC_LOC_QP_OP_ERR if i == 0 else IBV_WC_WR_FLUSH_ERR}"
                  for q in range(1, senders + 1) for i in range(4))
    assert sorted(r["wc"].split(",")) == want, lines
    assert r["qp"] == ",".join([str(IBV_QPS_ERR)] * senders), lines
    assert r["untouched"] == "1", lines


def test_a_request_given_up_on_moves_no_byte_later(env, build_dir):
    """The service thread claimed a SEND's copy and stalled past the
    requester's 10 s give-up (SOFTVERBS_TEST_SERVICE_STALL_MS=11000, as a
    thread stopped right after its claim): the requester completed the
    receive in error, so the application may have that buffer back, and
    the service, once it runs again, must not copy into it.  The requester
    marks the request abandoned; the receiver finds its memory untouched
    4 s after the stall ended (the bytes used to land then)."""
    p = subprocess.run([str(build_dir / "tests" / "progs" / "sv_stuck"), "stall"],
                       env=dict(env, SOFTVERBS_CMA="0", SOFTVERBS_REMAP="0",
                                SOFTVERBS_TEST_SERVICE_STALL_MS="11000"),
                       capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, (p.stdout, p.stderr)
    lines = p.stdout.splitlines()
    s = stuck_fields(next(l for l in lines if l.startswith("SENDER")), "SENDER")
    assert int(s["status"]) == IBV_WC_REM_OP_ERR and 9 <= int(s["secs"]) < 35, lines
    r = stuck_fields(next(l for l in lines if l.startswith("RECEIVER")), "RECEIVER")
    want = sorted(f"{100 + i}:{IBV_WC_LOC_QP_OP_ERR if i == 0 else IBV_WC_WR_FLUSH_ERR}"
                  for i in range(4))
    assert sorted(r["wc"].split(",")) == want, lines
    assert r["untouched"] == "1", lines


def svc_rings(fabric, L):
    """(path, owner pid) of the fabric's service rings."""
    from test_fault_injection import queue_segments
    out = []
    for path, _ in queue_segments(fabric, L["OBJ_SVC"]):
        with open(path, "rb") as f:
            hdr = f.read(L["q.hdr_size"])
        out.append((path, int.from_bytes(hdr[L["q.owner_pid"]:L["q.owner_pid"] + 4], "little")))
    return out


def ring_put(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


def ring_word(path, off, n=4):
    try:
        with open(path, "rb") as f:
            f.seek(off)
            return int.from_bytes(f.read(n), "little")
    except FileNotFoundError:
        pytest.fail(f"{path} is gone: the run ended early")


def test_a_request_the_service_holds_is_waited_out(env, build_dir, fabric, tmp_path):
    """A request the service thread has claimed (SERVING: the thread was
    stopped in the middle of one a requester gave up on) owns the ring's
    fields and bounce buffer until it is DONE.  With the receiver stopped,
    the test marks its ring SERVING with fields of its own, checks after
    3 s of the sender's SEND waiting that nobody rewrote them, then marks it
    DONE and lets the receiver go on: the SEND lands whole.  (Before the
    SERVING state, a requester that gave up freed the ring, and the next
    one refilled the bounce buffer under a service that, once resumed,
    went on copying out of it into the first one's address.)"""
    import softverbs_fabric
    L = softverbs_fabric.layout()
    env = stuck_env(env, tmp_path)
    proc = Proc([build_dir / "tests" / "progs" / "sv_stuck", "held"], env)
    rx = None
    try:
        line = proc.line(30)
        assert line.startswith("STOPPED "), line
        rx = int(line.split()[1])
        rings = [path for path, pid in svc_rings(fabric, L) if pid == rx]
        assert len(rings) == 1, svc_rings(fabric, L)
        ring = rings[0]
        fields = {"svc.op": 0x5eed0001, "svc.status": 0x5eed0002, "svc.addr": 0x1234567,
                  "svc.len": 777}
        size = {"svc.op": 4, "svc.status": 4, "svc.addr": 8, "svc.len": 8}
        for k, v in fields.items():
            ring_put(ring, L[k], v.to_bytes(size[k], "little"))
        ring_put(ring, L["svc.state"], SERVING.to_bytes(4, "little"))
        (tmp_path / "go").touch()
        time.sleep(3)
        for k, v in fields.items():
            assert ring_word(ring, L[k], size[k]) == v, f"{k} rewritten under the service"
        assert ring_word(ring, L["svc.state"]) == SERVING
        ring_put(ring, L["svc.state"], DONE.to_bytes(4, "little"))
        os.kill(rx, signal.SIGCONT)
        s = stuck_fields(proc.line(60), "SENDER")
        assert int(s["status"]) == IBV_WC_SUCCESS, s
        assert 2 <= int(s["secs"]) < 10, s
        r = stuck_fields(proc.line(60), "RECEIVER")
        assert r["wc"] == f"100:{IBV_WC_SUCCESS}" and r["data_ok"] == "1", r
        assert r["qp"] == str(IBV_QPS_RTS), r
        rc, err = proc.finish(60)
        assert rc == 0, err
    finally:
        if rx:
            try:
                os.kill(rx, signal.SIGCONT)
            except ProcessLookupError:
                pass
        proc.kill()


def test_a_stray_serving_state_is_cleared(env, build_dir, fabric, tmp_path):
    """Only a service thread claims its ring, and one waiting for requests
    holds nothing: a SERVING written from outside (a stray write into the
    shared segment) is set back to IDLE by the ring's own service within
    its 100 ms poll, where every request into that process used to wait
    10 s and fail.  A SEND after it lands at once."""
    import softverbs_fabric
    L = softverbs_fabric.layout()
    env = stuck_env(env, tmp_path)
    proc = Proc([build_dir / "tests" / "progs" / "sv_stuck", "stray"], env)
    try:
        assert proc.line(30) == "CONNECTED"
        rings = [path for path, _ in svc_rings(fabric, L)]
        assert len(rings) == 2, rings
        for ring in rings:
            ring_put(ring, L["svc.state"], SERVING.to_bytes(4, "little"))
        end = time.monotonic() + 3
        while any(ring_word(r, L["svc.state"]) != IDLE for r in rings):
            assert time.monotonic() < end, "a stray SERVING still stands after 3 s"
            time.sleep(0.05)
        (tmp_path / "go").touch()
        s = stuck_fields(proc.line(60), "SENDER")
        assert int(s["status"]) == IBV_WC_SUCCESS and int(s["secs"]) < 5, s
        r = stuck_fields(proc.line(60), "RECEIVER")
        assert r["wc"] == f"100:{IBV_WC_SUCCESS}" and r["data_ok"] == "1", r
        rc, err = proc.finish(60)
        assert rc == 0, err
    finally:
        proc.kill()
