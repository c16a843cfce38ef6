# SPDX-License-Identifier: MIT
"""Debian's rdma_cm tools through a ThreadSanitizer build of our libraries.

The tsan lane (scripts/test.sh) runs this file with SOFTVERBS_TSAN_PRELOAD
naming TSan's runtime: the tools are not built with TSan, so the runtime is
preloaded into each of them (and only them: neither Python nor a shell can
load it).  Our libibverbs and librdmacm are, so their threads (the CM
thread, the progress thread, rsockets' own) are watched beside the tools'.
A report in either process fails the case, as does a wrong exit.  Outside
that lane the cases skip: a build without TSan has nothing to watch.
"""
import glob
import os
import random
import shutil

import pytest

from test_rdmacm import pair

TSAN = os.environ.get("SOFTVERBS_TSAN_PRELOAD", "")

pytestmark = pytest.mark.skipif(not TSAN, reason="the tsan lane's case (SOFTVERBS_TSAN_PRELOAD)")


@pytest.fixture
def tsan_env(env, build_dir, tmp_path):
    e = dict(env)
    e["LD_LIBRARY_PATH"] = f"{build_dir / 'libibverbs-compat'}:{build_dir / 'librdmacm-compat'}"
    e["LD_PRELOAD"] = TSAN
    logs = tmp_path / "tsan"
    logs.mkdir()
    supp = os.path.join(os.path.dirname(__file__), "..", "tests", "sanitize", "tsan.supp")
    e["TSAN_OPTIONS"] = (f"halt_on_error=1:history_size=7:suppressions={os.path.abspath(supp)}:"
                         f"log_path={logs}/tsan")
    yield e
    reports = sorted(glob.glob(f"{logs}/tsan.*"))
    if reports:
        text = "\n".join(open(r, errors="replace").read() for r in reports)
        pytest.fail(f"ThreadSanitizer reports:\n{text}", pytrace=False)


def listening(env, port):
    """Whether an id on this case's own fabric listens on CM port `port`:
    librdmacm's port lock is the abstract socket
    softverbs-cm/UID/FABRIC/PS/L/PORT (udaddy's port is fixed, and another
    fabric's udaddy may listen on it at the same time)."""
    name = f"@softverbs-cm/{os.getuid()}/{env['SOFTVERBS_FABRIC']}/"
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and fields[-1].startswith(name) \
                    and fields[-1].endswith(f"/{port}") and int(fields[3], 16) & 0x10000:
                return True
    return False


def run_pair(server, client, env, port):
    for tool in (server[0], client[0]):
        # In the tsan lane a missing tool would let the lane pass unwatched.
        assert shutil.which(tool), f"{tool} not installed (rdmacm-utils)"
    (src, sout), (crc, cout) = pair(server, client, env, lambda: listening(env, port),
                                    timeout=120)
    assert crc == 0, f"{client[0]} client exited {crc}:\n{cout}\nserver:\n{sout}"
    assert src == 0, f"{server[0]} server exited {src}:\n{sout}\nclient:\n{cout}"
    return sout, cout


def test_rping_verify(tsan_env):
    """200 RDMA READ/WRITE round trips, each buffer compared by rping -V."""
    port = random.randint(20000, 40000)
    _, cout = run_pair(["rping", "-s", "-a", "127.0.0.1", "-p", str(port), "-C", "200", "-V"],
                       ["rping", "-c", "-a", "127.0.0.1", "-p", str(port), "-C", "200", "-V", "-v"],
                       tsan_env, port)
    assert cout.count("ping data:") == 200


def test_udaddy(tsan_env):
    """UD: address handles from the CM, SENDs each way (udaddy's own port,
    7174: its -p names a port space; CM ports are the fabric's own)."""
    _, cout = run_pair(["udaddy"], ["udaddy", "-s", "127.0.0.1"], tsan_env, 7174)
    assert "test complete" in cout


# Connected pairs on a port of their own: ucmatose, two connections with 50
# SENDs each way on each, then disconnects; rstream (rsockets), 200
# transfers of 4 KiB each way.  (tool: its arguments on both sides, and what
# the client prints at the end.)
CM_PAIRS = {"ucmatose": (["-c", "2", "-C", "50"], "test complete"),
            "rstream": (["-S", "4096", "-C", "200"], "4k")}


@pytest.mark.parametrize("tool", list(CM_PAIRS))
def test_cm_pair(tsan_env, tool):
    args, done = CM_PAIRS[tool]
    port = random.randint(20000, 40000)
    _, cout = run_pair([tool, "-p", str(port)] + args,
                       [tool, "-s", "127.0.0.1", "-p", str(port)] + args, tsan_env, port)
    assert done in cout


# Debian's verbs tools, not rdma_cm ones: their pairs meet over TCP, and our
# library's own threads (progress, service, a completion channel's) run
# beside the tool's.  Short runs: TSan slows every access about tenfold.
VERBS_TOOLS = [
    ("ibv_rc_pingpong", ["-c", "-n", "200", "-s", "4096"]),
    ("ibv_rc_pingpong", ["-e", "-n", "200"]),  # Completion events
    ("ibv_srq_pingpong", ["-n", "100"]),
    ("ibv_ud_pingpong", ["-n", "200", "-s", "1024"]),
    ("ib_send_bw", ["-n", "2000"]),
    ("ib_send_bw", ["-e", "-n", "1000"]),  # Completion events
    ("ib_write_bw", ["-n", "2000", "-q", "2"]),
    ("ib_read_bw", ["-n", "1000"]),
    ("ib_atomic_bw", ["-n", "1000"]),
    ("ib_send_lat", ["-n", "1000"]),
]


@pytest.mark.parametrize("tool,args", VERBS_TOOLS,
                         ids=[f"{t}{''.join(a[:1])}" for t, a in VERBS_TOOLS])
def test_verbs_tools(tsan_env, tool, args):
    if tool.startswith("ibv_"):
        from test_traffic_pingpong import pingpong
        pingpong(tsan_env, tool, args)
        return
    from test_service_path import perftest_pair
    assert shutil.which(tool), f"{tool} not installed (perftest)"
    out = perftest_pair(tsan_env, tool, args)
    assert "#bytes" in out, out


@pytest.mark.parametrize("tool,args", [("ibv_rc_pingpong", ["-c", "-n", "100", "-s", "65536"]),
                                       ("ib_write_bw", ["-n", "500", "-s", "65536"]),
                                       ("ib_read_bw", ["-n", "500", "-s", "65536"])],
                         ids=["rc_pingpong", "ib_write_bw", "ib_read_bw"])
def test_service_path_tools(tsan_env, softverbs, fabric, tool, args):
    """The same through the service copy path (SOFTVERBS_CMA=0, remapping
    off): each side's service thread copies for the other's requests."""
    from test_service_path import assert_all_service, perftest_pair
    env = dict(tsan_env, SOFTVERBS_CMA="0", SOFTVERBS_REMAP="0")
    if tool == "ibv_rc_pingpong":
        from test_traffic_pingpong import pingpong
        pingpong(env, tool, args)
    else:
        assert "#bytes" in perftest_pair(env, tool, args)
    show_env = {k: v for k, v in env.items() if k not in ("LD_PRELOAD", "TSAN_OPTIONS")}
    assert_all_service(softverbs, show_env, fabric, used="all" if tool == "ibv_rc_pingpong"
                       else "any")
