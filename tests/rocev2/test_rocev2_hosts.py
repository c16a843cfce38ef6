# SPDX-License-Identifier: MIT
"""RoCE v2 between two hosts (meson suite `rocev2`).

Two network namespaces joined by a veth pair, each with its own /dev/shm
(hosts.py), so nothing reaches the other host but UDP packets: Debian's
unmodified tools run through softverbs-run on each, and the data is checked
by the tools themselves (`ibv_*_pingpong -c`) and by wire_check.py, a
pyverbs program that verifies every byte of WRITE, READ, atomics and SEND.
Loss comes from the transport's own knob (SOFTVERBS_ROCEV2_DROP): this
machine's kernel has no sch_netem for `tc netem`.
"""
import os
import pathlib
import re
import subprocess

import pytest

import hosts

HERE = pathlib.Path(__file__).resolve().parent
PYTHON = "/usr/bin/python3"


def build_dir():
    d = pathlib.Path(os.environ.get("SOFTVERBS_BUILD_DIR",
                                    HERE.parent.parent / "build")).resolve()
    if not (d / "libibverbs-compat" / "libibverbs.so.1").exists():
        pytest.fail(f"no library in {d}: build first or set SOFTVERBS_BUILD_DIR")
    return d


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("two hosts need network namespaces: run as root (CI does)")
    p = hosts.HostPair(build_dir(), tmp_path_factory.mktemp("hosts"))
    yield p
    p.close()


@pytest.fixture(autouse=True)
def _no_strays(pair):
    yield
    pair.kill_all()  # Whatever a failed test left running


def pingpong(pair, tool, gid, iters, size, env=None, timeout=60):
    port = str(18000 + os.getpid() % 1000)
    args = [tool, "-d", "loop0", "-g", str(gid), "-n", str(iters), "-s", str(size), "-c",
            "-p", port]
    rs, so, rc, co = hosts.pair_run(pair.a, pair.b, args, args + [pair.a.addr], env=env,
                                    timeout=timeout)
    assert rs == 0 and rc == 0, f"server rc={rs}:\n{so}\nclient rc={rc}:\n{co}"
    # Both ends name the other's GID: the other host's address, not ours.
    for out, peer in ((so, pair.b), (co, pair.a)):
        m = re.search(r"remote address:.*GID (\S+)", out)
        assert m, out
        if gid == 0:
            assert m.group(1) == f"::ffff:{peer.addr}", out
        else:
            assert m.group(1) == peer.ipv6_link_local(), out
        assert f"{iters} iters in" in out, out


@pytest.mark.parametrize("gid", [0, 1], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("tool,size", [("ibv_rc_pingpong", 4096), ("ibv_uc_pingpong", 2048),
                                       ("ibv_ud_pingpong", 1000)],
                         ids=["rc", "uc", "ud"])
def test_pingpong(pair, tool, size, gid):
    # 4096 and 2048 bytes are 4 and 2 packets at the veth's MTU (1024).
    pingpong(pair, tool, gid, 500, size)


def test_port_mtu_follows_interface(pair):
    out = subprocess.run(pair.a.argv(["ibv_devinfo", "-v"]), capture_output=True, text=True,
                         timeout=30, env=pair.environ()).stdout
    assert re.search(r"active_mtu:\s+1024", out), out  # 1500-byte veth
    assert f"::ffff:{pair.a.addr}, RoCE v2" in out, out


@pytest.mark.parametrize("gid", [0, 1], ids=["ipv4", "ipv6"])
def test_rc_pingpong_under_loss(pair, gid):
    # 1 % of the packets each side sends are dropped: every loss waits for
    # the 67 ms ACK timeout (timeout 14) or a sequence NAK, and -c checks
    # every buffer.
    pingpong(pair, "ibv_rc_pingpong", gid, 300, 4096, env={"SOFTVERBS_ROCEV2_DROP": "1"},
             timeout=120)


PERFTEST = [
    ("ib_write_bw", ["-x", "0", "-n", "500"]),
    ("ib_read_lat", ["-x", "0", "-n", "300"]),
    ("ib_atomic_bw", ["-x", "0", "-n", "500"]),
    ("ib_send_bw", ["-x", "1", "-n", "500"]),
]


@pytest.mark.parametrize("tool,args", PERFTEST, ids=[t for t, _ in PERFTEST])
def test_perftest(pair, tool, args):
    port = str(19000 + os.getpid() % 1000)
    argv = [tool, "-d", "loop0", "-p", port] + args
    rs, so, rc, co = hosts.pair_run(pair.a, pair.b, argv, argv + [pair.a.addr], timeout=90)
    assert rs == 0 and rc == 0, f"server rc={rs}:\n{so}\nclient rc={rc}:\n{co}"
    # The result line: a number of bytes, the iterations, then figures.
    assert re.search(r"^\s*\d+\s+\d+\s+[\d.]+", co, re.M), co


def wire_check(pair, gid, iters, env=None, timeout=150):
    script = str(HERE / "wire_check.py")
    port = str(20000 + os.getpid() % 1000)
    common = ["--port", port, "--gid-index", str(gid), "--iters", str(iters), "--seed", "7"]
    rs, so, rc, co = hosts.pair_run(
        pair.a, pair.b, [PYTHON, script, "server"] + common,
        [PYTHON, script, "client", pair.a.addr] + common + ["--timeout", str(timeout - 10)],
        env=env, timeout=timeout, settle=1.0)
    assert rs == 0 and rc == 0, f"server rc={rs}:\n{so}\nclient rc={rc}:\n{co}"
    assert "wire_check: OK" in so and "wire_check: OK" in co, so + co


@pytest.mark.parametrize("gid", [0, 1], ids=["ipv4", "ipv6"])
def test_data_checked(pair, gid):
    wire_check(pair, gid, 300)


@pytest.mark.parametrize("pct", ["1", "5"])
def test_data_checked_under_loss(pair, pct):
    wire_check(pair, 0, 150, env={"SOFTVERBS_ROCEV2_DROP": pct}, timeout=240)
