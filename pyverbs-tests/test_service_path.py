# SPDX-License-Identifier: MIT
"""The copy path for kernels that refuse cross-memory attach (Yama
ptrace_scope 2/3, seccomp): with SOFTVERBS_CMA=0 every byte between two
processes goes through the peer's service thread and bounce buffer
(sv_svc_ring).  The same unmodified tools must work, with data checked, and
`softverbs show` must say which path each process used."""
import subprocess

from test_traffic_pingpong import free_port, listening, pingpong

import time


def lease_paths(softverbs, env, fabric):
    out = subprocess.run([softverbs, "show", fabric], env=env, capture_output=True, text=True,
                         timeout=30).stdout
    return [l for l in out.splitlines() if l.strip().startswith("slot ")]


def test_rc_pingpong_data_checked_through_service(env, softverbs, fabric):
    env = dict(env, SOFTVERBS_CMA="0")
    # 100000 bytes: more than one bounce buffer's worth would need -s > 256 KiB,
    # so also run a 1 MiB message that takes four service requests.
    pingpong(env, "ibv_rc_pingpong", ["-c", "-s", "100000", "-n", "50"])
    pingpong(env, "ibv_rc_pingpong", ["-c", "-s", "1048576", "-n", "5"])
    slots = lease_paths(softverbs, env, fabric)
    assert slots and all("service-copy" in l for l in slots), slots
    assert not any("cross-memory-attach " in l + " " for l in slots), slots


def test_default_path_is_cross_memory_attach(env, softverbs, fabric):
    pingpong(env, "ibv_rc_pingpong", ["-c", "-s", "100000", "-n", "20"])
    slots = lease_paths(softverbs, env, fabric)
    assert slots and all("cross-memory-attach" in l for l in slots), slots
    assert not any("service-copy" in l for l in slots), slots


def perftest_pair(env, tool, args, timeout=120):
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
    assert cli.returncode == 0 and srv.returncode == 0, (cout, sout)
    return cout


def test_read_write_atomic_through_service(env, softverbs, fabric):
    env = dict(env, SOFTVERBS_CMA="0")
    for tool in ("ib_read_bw", "ib_write_bw", "ib_atomic_bw"):
        out = perftest_pair(env, tool, ["-n", "200"])
        assert "#bytes" in out, out
    slots = lease_paths(softverbs, env, fabric)
    assert any("service-copy" in l for l in slots), slots
