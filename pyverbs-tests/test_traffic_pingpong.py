# SPDX-License-Identifier: MIT
"""Debian's five ibv_*_pingpong tools, unmodified, between two processes
through our library: default arguments, -e (completion events), RC with
sizes 1 B..1 MiB and a long run of 100000 iterations, and with the server
on loop0 and the client on loop1.  Each pair runs on its own fabric (the
env fixture) and its own TCP port, under a timeout; both are killed and the
fabric's segments removed whatever happens.

The tools are a smoke test of the unmodified binaries: they check
completions and byte counts, not data.  (`ibv_rc_pingpong -c` compares one
byte per page with 0 and only prints "invalid data" on a mismatch; we fail
on that line, but it proves little.)  Each RC run therefore has a twin
with our tests/progs/sv_pingpong, the same traffic (two processes, one CQ
for sends and receives, receive buffers reposted) with every byte of every
message compared against a seeded pattern, and sequence numbers checked;
UC, UD and SRQ runs have theirs too."""
import os
import shutil
import socket
import subprocess
import time

import pytest

import svtest

TOOLS = ["ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_ud_pingpong", "ibv_srq_pingpong",
         "ibv_xsrq_pingpong"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """Whether some socket listens on port (read from /proc, without
    connecting: the tool's server accepts exactly one connection)."""
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(f).read().splitlines()[1:]
        except OSError:
            continue
        for l in lines:
            parts = l.split()
            if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def pingpong(env, tool, args=(), server_dev="loop0", client_dev="loop0", timeout=120):
    if not shutil.which(tool):
        pytest.fail(f"{tool} missing (apt-get install ibverbs-utils)")
    port = free_port()
    common = ["-p", str(port)] + list(args)
    srv = subprocess.Popen([tool, "-d", server_dev] + common, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    cli = None
    try:
        end = time.monotonic() + 20
        while not listening(port):
            if srv.poll() is not None:
                raise AssertionError(f"{tool} server ended {srv.returncode}: "
                                     f"{srv.communicate()}")
            if time.monotonic() > end:
                raise AssertionError(f"{tool} server never listened on {port}")
            time.sleep(0.02)
        cli = subprocess.Popen([tool, "-d", client_dev] + common + ["127.0.0.1"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cout, cerr = cli.communicate(timeout=timeout)
        sout, serr = srv.communicate(timeout=30)
    finally:
        for p in (srv, cli):
            if p and p.poll() is None:
                p.kill()
                p.communicate()
    msg = (f"{tool} {args} {server_dev}->{client_dev}: server rc {srv.returncode}\n{sout}{serr}\n"
           f"client rc {cli.returncode}\n{cout}{cerr}")
    assert srv.returncode == 0 and cli.returncode == 0, msg
    # -c's only report of a mismatch (the exit status stays 0).
    assert "invalid data" not in cout + sout, msg
    # The tools print "<bytes> bytes in <s> seconds" on both sides; xsrq
    # prints "success" when its message count completed (no data check).
    if tool == "ibv_xsrq_pingpong":
        assert "success" in cout and "success" in sout, msg
    else:
        assert "bytes in" in cout and "bytes in" in sout, msg
    return cout + cerr, sout + serr


@pytest.mark.parametrize("tool", TOOLS)
def test_default(env, tool):
    pingpong(env, tool)


@pytest.mark.parametrize("tool", TOOLS)
def test_events(env, tool):
    pingpong(env, tool, ["-e"])


@pytest.mark.parametrize("size", [1, 7, 4096, 65536, 1 << 20])
def test_rc_sizes(env, size):
    n = 20 if size >= 65536 else 200
    c, _ = pingpong(env, "ibv_rc_pingpong", ["-s", str(size), "-n", str(n)])
    assert f"{2 * size * n} bytes in" in c, c


def test_rc_long_run(env):
    c, s = pingpong(env, "ibv_rc_pingpong", ["-c", "-s", "64", "-n", "100000"], timeout=300)
    assert f"{2 * 64 * 100000} bytes in" in c, c
    assert "100000 iters in" in c, c


def checked_pingpong(build_dir, env, args, timeout=280):
    """tests/progs/sv_pingpong ARGS: ping-pong between two processes with
    every byte and sequence number checked; returns its stdout."""
    prog = build_dir / "tests" / "progs" / "sv_pingpong"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    argv = [str(prog)] + [str(a) for a in args]
    p = svtest.run(argv, env, timeout=timeout)
    assert p.returncode == 0, f"{argv} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    n = args[args.index("-n") + 1] if "-n" in args else 1000
    size = args[args.index("-s") + 1] if "-s" in args else 4096
    transport = args[args.index("-t") + 1] if "-t" in args else "rc"
    assert f"OK sv_pingpong {transport} iters={n} size={size} " in p.stdout, p.stdout
    assert f"server checked {n} messages" in p.stdout, p.stdout
    assert f"client checked {n} messages" in p.stdout, p.stdout
    return p.stdout


def test_rc_long_run_data_checked(env, build_dir):
    """The long run's traffic, every byte of the 200000 messages checked."""
    checked_pingpong(build_dir, env, ["-s", 64, "-n", 100000])


@pytest.mark.parametrize("size", [1, 7, 4096, 65536, 1 << 20])
def test_rc_sizes_data_checked(env, build_dir, size):
    n = 20 if size >= 65536 else 200
    checked_pingpong(build_dir, env, ["-s", size, "-n", n])


# The tools' default sizes: 4096, and 2048 for ibv_ud_pingpong.
CHECKED = [("rc", 4096), ("uc", 4096), ("ud", 2048), ("srq", 4096)]


@pytest.mark.parametrize("transport,size", CHECKED)
def test_data_checked(env, build_dir, transport, size):
    """test_default's traffic, every byte checked."""
    checked_pingpong(build_dir, env, ["-t", transport, "-s", size, "-n", 1000])


@pytest.mark.parametrize("transport,size", CHECKED)
def test_across_devices_data_checked(env, build_dir, transport, size):
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    checked_pingpong(build_dir, env, ["-t", transport, "-s", size, "-n", 200,
                                      "-d", "loop1", "-D", "loop0"])


def test_checked_pingpong_detects_a_flipped_byte(env, build_dir):
    """sv_pingpong's checker is not a no-op: one byte flipped in message 41
    (sender side, -F) fails the run and names the message."""
    prog = build_dir / "tests" / "progs" / "sv_pingpong"
    p = svtest.run([str(prog), "-s", "100", "-n", "50", "-F", "41"], env, timeout=120)
    assert p.returncode != 0, p.stdout
    assert "message 41 (100 bytes): byte 41" in p.stderr, p.stderr


@pytest.mark.parametrize("tool", TOOLS)
def test_across_devices(env, tool):
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    pingpong(env, tool, server_dev="loop0", client_dev="loop1")


def test_rc_across_devices_data_checked(env, build_dir):
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    checked_pingpong(build_dir, env, ["-s", 100000, "-n", 50, "-d", "loop0", "-D", "loop1"])


def test_rc_across_devices_events_and_size(env):
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    c, _ = pingpong(env, "ibv_rc_pingpong", ["-e", "-s", "100000", "-n", "50"],
                    server_dev="loop1", client_dev="loop0")
    assert f"{2 * 100000 * 50} bytes in" in c, c


@pytest.mark.parametrize("clients", [2, 3])
def test_xsrq_several_clients(env, clients):
    """ibv_xsrq_pingpong -c N: every process opens the XRC domain by one file
    (/tmp/xrc_domain), so all share it, and the server sends each client's
    messages round robin over the send QPs connected to *other* clients'
    target QPs: a receive lands in the SRQ owner's memory, not the target
    QP owner's (it completed with IBV_WC_LOC_PROT_ERR before)."""
    port = free_port()
    common = ["-d", "loop0", "-p", str(port), "-n", "20", "-s", "300"]
    srv = subprocess.Popen(["ibv_xsrq_pingpong", "-c", str(clients)] + common, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    clis = []
    try:
        end = time.monotonic() + 20
        while not listening(port):
            assert srv.poll() is None, srv.communicate()
            assert time.monotonic() < end, "server never listened"
            time.sleep(0.02)
        clis = [subprocess.Popen(["ibv_xsrq_pingpong"] + common + ["127.0.0.1"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for _ in range(clients)]
        outs = [c.communicate(timeout=60)[0] for c in clis]
        sout = srv.communicate(timeout=30)[0]
    finally:
        for p in [srv] + clis:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert srv.returncode == 0 and "success" in sout, sout
    for c, out in zip(clis, outs):
        assert c.returncode == 0 and "success" in out, out
