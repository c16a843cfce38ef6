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
import shutil
import struct
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


FAULTS = {
    "dup-reorder": {"SOFTVERBS_ROCEV2_DUP": "5", "SOFTVERBS_ROCEV2_REORDER": "5"},
    "all": {"SOFTVERBS_ROCEV2_DUP": "3", "SOFTVERBS_ROCEV2_REORDER": "3",
            "SOFTVERBS_ROCEV2_DROP": "1"},
}


@pytest.mark.parametrize("faults", list(FAULTS), ids=list(FAULTS))
def test_rc_pingpong_duplicated_reordered(pair, faults):
    # Duplicates are answered, not executed again; a packet overtaken by the
    # next is a sequence error the requester recovers from; -c checks that
    # every buffer still holds what was sent.
    pingpong(pair, "ibv_rc_pingpong", 0, 300, 8192, env=FAULTS[faults], timeout=120)


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


def capture(pair, tmp_path, tool, args, client_extra=()):
    """Runs tool between the hosts with SOFTVERBS_PCAP on both: the two
    captures' packets."""
    import sys
    sys.path.insert(0, str(HERE.parent.parent / "pyverbs-tests"))
    from test_rocev2_wire import read_pcap  # noqa: E402 (the codec test's reader)
    caps = {h.name: tmp_path / f"{h.name}.pcap" for h in pair.hosts}
    argv = [tool] + args
    rs, so, rc, co = hosts.pair_run(pair.a, pair.b, argv, argv + list(client_extra) + [pair.a.addr],
                                    server_env={"SOFTVERBS_PCAP": str(caps["a"])},
                                    client_env={"SOFTVERBS_PCAP": str(caps["b"])})
    assert rs == 0 and rc == 0, f"server rc={rs}:\n{so}\nclient rc={rc}:\n{co}"
    return {name: (path, read_pcap(path)) for name, path in caps.items()}


CAPTURED = [
    ("ibv_rc_pingpong", ["-g", "0", "-n", "20", "-s", "3000", "-c"]),
    ("ibv_ud_pingpong", ["-g", "1", "-n", "20", "-s", "500", "-c"]),
    ("ib_read_lat", ["-d", "loop0", "-x", "0", "-n", "20", "-s", "2500"]),
    ("ib_atomic_bw", ["-d", "loop0", "-x", "1", "-n", "20"]),
    ("ib_write_bw", ["-d", "loop0", "-x", "0", "-n", "20", "-s", "5000"]),
]


@pytest.mark.parametrize("tool,args", CAPTURED, ids=[t for t, _ in CAPTURED])
def test_wire_is_rocev2(pair, tmp_path, tool, args):
    """Every packet sent and received, as SOFTVERBS_PCAP captured it, has an
    ICRC that an implementation of the spec's own (the codec test's, sharing
    no code with the transport) computes alike, and tshark decodes it as
    RoCE v2 with nothing malformed."""
    import sys
    sys.path.insert(0, str(HERE.parent.parent / "pyverbs-tests"))
    from test_rocev2_wire import split_ip, icrc_of, _tshark_fields  # noqa: E402
    port = ["-p", str(21000 + os.getpid() % 1000)]
    caps = capture(pair, tmp_path, tool, args + port)
    opcodes = set()
    for name, (path, pkts) in caps.items():
        assert len(pkts) >= 20, f"{name}: {len(pkts)} packets"
        for i, (_, _, pkt) in enumerate(pkts):
            iph, udp, payload = split_ip(pkt)
            assert struct.unpack("!H", udp[2:4])[0] == 4791, f"{name} #{i}: UDP port"
            want = icrc_of(iph, udp, payload)
            got = struct.unpack("<I", payload[-4:])[0]
            assert got == want, f"{name} packet {i}: ICRC {got:#x}, the spec gives {want:#x}"
            opcodes.add(payload[0])
        if shutil.which("tshark"):
            rows = _tshark_fields(path, ["frame.number", "_ws.col.Protocol", "_ws.malformed",
                                         "_ws.expert.severity", "infiniband.bth.opcode"])
            assert len(rows) == len(pkts)
            for r in rows:
                assert r["_ws.col.Protocol"] == "RRoCE", r
                assert r["_ws.malformed"] == "", r
                sev = r["_ws.expert.severity"]
                assert not sev or int(sev, 0) < 0x600000, r
    # What each run must have put on the wire.
    want = {"ibv_rc_pingpong": {0x00, 0x02, 0x11}, "ibv_ud_pingpong": {0x64},
            "ib_read_lat": {0x0c, 0x0d, 0x0f}, "ib_atomic_bw": {0x14, 0x12},
            "ib_write_bw": {0x06, 0x07, 0x08, 0x11}}[tool]
    assert want <= opcodes, f"opcodes seen: {sorted(hex(o) for o in opcodes)}"


def test_show_counts_packets_and_drops(pair):
    """softverbs show, on the server's host after a run with loss: packets
    both ways, the knob's drops, and the retransmissions they caused."""
    port = str(22000 + os.getpid() % 1000)
    pp = ["ibv_rc_pingpong", "-g", "0", "-n", "200", "-s", "4096", "-p", port]
    show = str(pair.build / "tools" / "softverbs")
    script = " ".join(pp) + f" && {show} show rocev2-a"
    rs, so, rc, co = hosts.pair_run(pair.a, pair.b, ["sh", "-c", script], pp + [pair.a.addr],
                                    env={"SOFTVERBS_ROCEV2_DROP": "5"}, timeout=120)
    assert rs == 0 and rc == 0, f"server rc={rs}:\n{so}\nclient rc={rc}:\n{co}"
    m = re.search(r"RoCE v2:\s+(\d+) packets sent, (\d+) received, (\d+) retransmitted", so)
    assert m, so
    sent, received, resent = map(int, m.groups())
    # 200 SENDs of 4 packets each way, and their ACKs.
    assert sent >= 800 and received >= 800, so
    d = re.search(r"drops:\s+(\d+) bad ICRC, (\d+) malformed, (\d+) unknown QP, (\d+) other, "
                  r"(\d+) injected", so)
    assert d, so
    assert int(d.group(1)) == 0 and int(d.group(2)) == 0, so
    assert int(d.group(5)) > 0, so  # 5 % of about 1000 packets
