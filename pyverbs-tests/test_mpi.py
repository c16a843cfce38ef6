# SPDX-License-Identifier: MIT
"""Open MPI (Debian's 4.1, pml ucx and osc ucx) over loop0, through
softverbs-run: tests/progs/sv_mpi at 2 and 4 ranks.

sv_mpi checks every byte it receives (ping-pong 1 B to 4 MiB, Allreduce,
Alltoall, Bcast, Put/Get/Accumulate in a window) and aborts on the first
mismatch; this test asserts its per-phase "ok" lines and PASS.

That the traffic went over loop0 is asserted from UCX's own log
(UCX_LOG_LEVEL=info prints each endpoint's transports): every endpoint
configuration of every rank names rc_verbs or ud_verbs on loop0:1, or UCX's
loopback (self) for a rank's endpoint to itself, and nothing else.
UCX_TLS=rc_verbs,ud_verbs,self leaves UCX no shared memory or tcp, and with
pml ucx Open MPI moves no message through its own BTLs (vader/sm would only
serve pml ob1); `--mca btl self` keeps even their startup out of the way.
"""
import re
import shutil

import pytest

import ucxtest

pytestmark = pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI not installed")

RUN_TIMEOUT = 240


@pytest.fixture
def sv_mpi(build_dir):
    p = build_dir / "tests" / "progs" / "sv_mpi"
    if not p.exists():
        pytest.fail(f"{p} not built although mpirun is installed: install libopenmpi-dev "
                    "(scripts/deps.sh) and reconfigure")
    return str(p)


def mpirun(softverbs_run, np, prog, env, extra_env=()):
    argv = ucxtest.WRAP + [
        softverbs_run, "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np),
        "--mca", "pml", "ucx", "--mca", "osc", "ucx", "--mca", "btl", "self",
        "-x", "UCX_TLS=rc_verbs,ud_verbs,self", "-x", "UCX_NET_DEVICES=loop0:1",
        "-x", "UCX_LOG_LEVEL=info", "-x", "UCX_WARN_UNUSED_ENV_VARS=n"]
    for kv in extra_env:
        argv += ["-x", kv]
    return ucxtest.run_one(argv + [prog], env, RUN_TIMEOUT)


def check_mpi(rc, out, np):
    assert rc == 0, f"mpirun exited {rc}:\n{out}"
    assert "MISMATCH" not in out, out
    assert f"sv_mpi: {np} ranks" in out, out
    for phase in ("pingpong", "allreduce", "alltoall", "bcast", "onesided"):
        m = re.search(rf"^sv_mpi: {phase} ok .* verified (\d+) bytes", out, re.M)
        assert m and int(m.group(1)) > 0, f"no verified {phase} phase:\n{out}"
    assert "sv_mpi: PASS" in out, out
    # Where the traffic went: UCX's endpoint configurations, per rank.
    # The prefix is "[host:pid:thread]", the pid padded to 5 columns
    # ("[vm:3114 :0]") and the thread a number or a letter.
    cfgs = re.findall(r"\[[\w.-]+:\s*(\d+)\s*:\s*\w+\].*ucp_worker\.c:\d+ +UCX +INFO +"
                      r"ep_cfg\[\d+\]: (.*)$", out, re.M)
    assert cfgs, f"no UCX endpoint configuration in the log (UCX_LOG_LEVEL=info):\n{out}"
    pids = {pid for pid, _ in cfgs}
    assert len(pids) == np, f"endpoint configurations from {len(pids)} ranks, not {np}:\n{out}"
    for pid, cfg in cfgs:
        lanes = re.findall(r"(\w+)/([\w:]+)", cfg)
        assert lanes, f"unparsed endpoint configuration: {cfg}"
        for tl, dev in lanes:
            assert (tl in ("rc_verbs", "ud_verbs") and dev == "loop0:1") or \
                (tl == "self" and dev == "memory0"), \
                f"rank pid {pid} has a lane on {tl}/{dev}, not loop0:1: {cfg}\n{out}"
    # Every rank has point-to-point (tag) and one-sided (rma) lanes on loop0.
    for pid in pids:
        mine = [c for p, c in cfgs if p == pid]
        for kind in ("tag", "rma"):
            assert any(re.search(rf"\b{kind}\([^)]*(rc|ud)_verbs/loop0:1", c) for c in mine), \
                f"rank pid {pid}: no {kind} lanes on loop0:1: {mine}"


@pytest.fixture
def mpi_env(tool_env, softverbs_run):
    ucxtest.require_node(pytest, softverbs_run, tool_env)
    return dict(tool_env)


@pytest.mark.parametrize("np", [2, 4])
def test_sv_mpi_pml_ucx(np, sv_mpi, mpi_env, softverbs_run):
    rc, out = mpirun(softverbs_run, np, sv_mpi, mpi_env)
    check_mpi(rc, out, np)


def test_sv_mpi_thread_multiple(sv_mpi, mpi_env, softverbs_run):
    """MPI_THREAD_MULTIPLE with 4 threads per rank exchanging 1 MiB at
    once, every byte checked: UCX's threads poll under its worker lock, so
    a poll that slept (the provider's sleep for pollers that outnumber the
    cores) held the lock from the threads that would post what it waited
    for, and the run hung.  A process with more than one polling thread
    now spins in poll, as on an HCA."""
    rc, out = mpirun(softverbs_run, 2, sv_mpi, mpi_env, ["SV_MPI_THREADS=4"])
    check_mpi(rc, out, 2)
    m = re.search(r"^sv_mpi: threads ok .* verified (\d+) bytes", out, re.M)
    assert m and int(m.group(1)) == 2 * 4 * 5 * (1 << 20), out


@pytest.mark.skipif(not ucxtest.FULL, reason="scripts/test.sh --full only (SOFTVERBS_TEST_FULL=1)")
@pytest.mark.parametrize("np", [2, 4])
def test_sv_mpi_service_path(np, sv_mpi, mpi_env, softverbs_run):
    """The same over the service copy path (SOFTVERBS_CMA=0)."""
    rc, out = mpirun(softverbs_run, np, sv_mpi, mpi_env, ["SOFTVERBS_CMA=0"])
    check_mpi(rc, out, np)


@pytest.mark.skipif(not ucxtest.FULL, reason="scripts/test.sh --full only (SOFTVERBS_TEST_FULL=1): "
                    "one CI run saw rank 0 die of SIGSEGV in MPI_Finalize after PASS, "
                    "not reproduced in 40 runs since nor in 38 more with every teardown "
                    "verb logged (all returned 0); one of those 38 hung before pingpong"
                    "; 71 more without the shim all passed (README)")
def test_sv_mpi_btl_openib(sv_mpi, tool_env, softverbs_run, tmp_path):
    """pml ob1 over Open MPI's own verbs BTL, openib.  openib starts only if
    stat("<ibv_get_sysfs_path()>/class/infiniband") finds a directory
    (opal_common_verbs_check_basics) and then takes devices from
    ibv_get_device_list(); it opens nothing under /dev/infiniband.  Our
    ibv_get_sysfs_path() honours SYSFS_PATH as rdma-core's does, so a
    directory holding class/infiniband/ is all it needs (the view of
    issue 10 presents /sys/class/infiniband itself)."""
    sysfs = tmp_path / "sys"
    (sysfs / "class" / "infiniband" / "loop0").mkdir(parents=True)
    env = dict(tool_env, SYSFS_PATH=str(sysfs))
    argv = ucxtest.WRAP + [
        softverbs_run, "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
        "-x", "SYSFS_PATH", "--mca", "pml", "ob1", "--mca", "btl", "openib,self",
        "--mca", "btl_openib_allow_ib", "1", "--mca", "btl_openib_warn_no_device_params_found",
        "0", "--mca", "btl_openib_verbose", "1", "--mca", "btl_base_verbose", "30", sv_mpi]
    rc, out = ucxtest.run_one(argv, env, RUN_TIMEOUT)
    assert rc == 0, f"mpirun exited {rc}:\n{out}"
    for phase in ("pingpong", "allreduce", "alltoall", "bcast", "onesided"):
        assert re.search(rf"^sv_mpi: {phase} ok .* verified [1-9]\d* bytes", out, re.M), out
    assert "sv_mpi: PASS" in out, out
    # Each rank took loop0's port and sends to the other over openib.
    assert len(re.findall(r"openib: using port loop0:1", out)) == 2, out
    assert len(re.findall(r"Using openib btl for send to", out)) == 2, out
