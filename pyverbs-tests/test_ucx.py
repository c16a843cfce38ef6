# SPDX-License-Identifier: MIT
"""UCX (Debian's ucx-utils 1.13) over loop0, through softverbs-run.

- `ucx_info -d` lists loop0's port with the rc_verbs and ud_verbs
  transports.
- `ucx_perftest`, server and client as two processes on a fabric of their
  own, with UCX_TLS=rc_verbs,ud_verbs,self and UCX_NET_DEVICES=loop0:1 (no
  shared memory, no tcp: the bytes can only move over loop0): UCP tag_lat,
  tag_bw, ucp_put_bw, ucp_put_lat, ucp_get and ucp_am_bw at 8 B, 64 KiB and
  1 MiB (UCX's eager and rendezvous protocols); UCT am_lat at 8 B, put_bw
  and get with zero copy at 64 KiB on rc_verbs; each once with cross-memory
  attach and once with SOFTVERBS_CMA=0 (the service copy path).  And ud_verbs
  alone, where UCX emulates get with active messages.

ucx_perftest checks no data (it has no validation option): these cases
show that the runs complete (both sides exit 0, the client prints its
'Final:' row with the iterations asked for) with no UCX error, in particular
not the "got active message id 0" of the rendezvous hang of issue 10.  The
bytes are checked by tests/progs/sv_mpi (test_mpi.py), which moves the same
protocols' traffic through Open MPI's UCX and compares every byte.

Each run has a timeout and is killed (its whole process group) on failure.
scripts/ucx-loop.sh repeats the rendezvous sizes many times.  With
scripts/test.sh --full (SOFTVERBS_TEST_FULL=1) the rendezvous runs repeat 5
times each here too.
"""
import re
import shutil

import pytest

import svtest
import ucxtest

pytestmark = pytest.mark.skipif(not shutil.which("ucx_perftest"),
                                reason="ucx-utils not installed")

SIZES = [8, 65536, 1048576]
UCP = ["tag_lat", "tag_bw", "ucp_put_bw", "ucp_put_lat", "ucp_get", "ucp_am_bw"]
REPEAT = 5 if ucxtest.FULL else 1


def iterations(size):
    return 100 if size >= 1048576 else 1000


UCP_CASES = [pytest.param(t, s, cma, id=f"{t}-{s}-cma{cma}")
             for cma in (1, 0) for t in UCP for s in SIZES]
UCT_CASES = [pytest.param(args, cma, id=f"{name}-cma{cma}")
             for cma in (1, 0)
             for name, args in (("am_lat-8", ["-t", "am_lat", "-s", "8"]),
                                ("put_bw-zcopy-65536",
                                 ["-t", "put_bw", "-D", "zcopy", "-s", "65536"]),
                                ("get_bw-zcopy-65536",
                                 ["-t", "get", "-D", "zcopy", "-s", "65536"]))]


@pytest.fixture
def ucx_env(tool_env, softverbs_run):
    ucxtest.require_node(pytest, softverbs_run, tool_env)
    e = dict(tool_env)
    e.update(ucxtest.UCX_ENV)
    return e


def check_run(args, res, iters):
    (src, sout), (crc, cout) = res
    what = " ".join(args)
    logs = f"server:\n{sout}\nclient:\n{cout}"
    assert src == 0 and crc == 0, f"{what}: server exit {src}, client exit {crc}\n{logs}"
    bad = [l for l in (sout + cout).splitlines()
           if re.search(r"UCX +(ERROR|FATAL)|got active message id", l)]
    assert not bad, f"{what}: UCX reported errors:\n" + "\n".join(bad) + "\n" + logs
    row = ucxtest.final_row(cout)
    assert row is not None, f"{what}: no 'Final:' row\n{logs}"
    assert row[0] == iters, f"{what}: {row[0]} iterations, asked for {iters}\n{logs}"


def test_ucx_info_lists_loop0(ucx_env, softverbs_run):
    p = svtest.run(ucxtest.WRAP + [softverbs_run, "ucx_info", "-d"], ucx_env, timeout=60)
    assert p.returncode == 0, f"ucx_info -d exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    # ucx_info -d prints, per memory domain, its transports and devices:
    #   # Memory domain: loop0 ... #      Transport: rc_verbs  #         Device: loop0:1
    blocks = re.split(r"^# Memory domain: ", p.stdout, flags=re.M)
    loop = [b for b in blocks if b.startswith("loop0\n")]
    assert loop, f"ucx_info -d lists no loop0 memory domain:\n{p.stdout}\n{p.stderr}"
    found = set(re.findall(r"Transport: (\w+)\s*\n#\s+Device: loop0:1\b", loop[0]))
    assert {"rc_verbs", "ud_verbs"} <= found, f"loop0:1 transports {found}:\n{loop[0]}"


@pytest.mark.parametrize("test,size,cma", UCP_CASES)
def test_ucp_perftest(test, size, cma, ucx_env, softverbs_run):
    env = dict(ucx_env, SOFTVERBS_CMA=str(cma))
    n = iterations(size)
    args = ["-t", test, "-s", str(size), "-n", str(n), "-w", "10"]
    for _ in range(REPEAT if size > 8 else 1):
        check_run(args, ucxtest.perftest_pair(softverbs_run, args, env), n)


@pytest.mark.parametrize("args,cma", UCT_CASES)
def test_uct_perftest(args, cma, ucx_env, softverbs_run):
    env = dict(ucx_env, SOFTVERBS_CMA=str(cma))
    full = args + ["-x", "rc_verbs", "-d", "loop0:1", "-n", "1000", "-w", "10"]
    check_run(full, ucxtest.perftest_pair(softverbs_run, full, env), 1000)


@pytest.mark.parametrize("test", ["tag_lat", "ucp_get", "ucp_put_lat"])
def test_ucp_ud_only(test, ucx_env, softverbs_run):
    """ud_verbs alone: no READ on UD, so UCX serves get (and put) with
    active messages that the target's progress answers (the slow path of
    docs/PERFORMANCE.md)."""
    env = dict(ucx_env, UCX_TLS="ud_verbs,self")
    args = ["-t", test, "-s", "8", "-n", "1000", "-w", "10"]
    res = ucxtest.perftest_pair(softverbs_run, args, env)
    check_run(args, res, 1000)
