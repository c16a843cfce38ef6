# SPDX-License-Identifier: MIT
"""The soak (tests/progs/sv_soak.c) in CI: four processes, RC fully
connected, random SEND, WRITE, READ, fetch-add and compare-and-swap of
random sizes, some QPs sharing CQs; every byte and every counter checked.
30 s on the default path (remapped registrations), 10 s with remapping off
(cross-memory attach), 10 s through the service-copy path, and 10 s on
each path with one process after another stopped for 200 ms.  The seed is
printed: `sv_soak -n 4 -t 30 -S SEED` repeats each process's choices.
scripts/soak.sh runs the same program for longer."""
import re

import pytest

import svtest

BAD = ("lost", "dup", "stale", "corrupt", "badlen", "badwc", "atomic_bad")
OPS = ("sends", "recvs", "writes", "reads", "fadds", "cas", "pcas")


@pytest.fixture
def soak(build_dir):
    p = build_dir / "tests" / "progs" / "sv_soak"
    if not p.exists():
        pytest.fail(f"{p} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    return p


def run_soak(soak, env, procs, secs, seed=None, freeze_ms=0):
    argv = [str(soak), "-n", str(procs), "-t", str(secs)]
    if seed is not None:
        argv += ["-S", str(seed)]
    if freeze_ms:
        argv += ["-F", str(freeze_ms)]
    # The program kills its processes a minute past the end; this is the backstop
    p = svtest.run(argv, env, timeout=secs + 150)
    text = f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    st = [{k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", l)}
          for l in p.stdout.splitlines() if l.startswith("STAT soak ")]
    bad = {k: sum(s[k] for s in st) for k in BAD}
    assert all(v == 0 for v in bad.values()), f"{bad}\n{text}"
    assert p.returncode == 0 and "SOAK OK" in p.stdout, text
    assert len(st) == procs, text
    for s in st:
        # Every process did every kind of operation, and received SENDs
        assert all(s[k] > 0 for k in OPS), f"{s}\n{text}"
    return p, st


def test_soak_30s(soak, env):
    run_soak(soak, env, 4, 30)


def test_soak_service_copy_10s(soak, env):
    env["SOFTVERBS_CMA"] = "0"
    p, _ = run_soak(soak, env, 4, 10, seed=12345)
    assert "SEED 12345 " in p.stdout and "seed=12345" in p.stdout, p.stdout


def test_soak_remap_off_10s(soak, env):
    """The default soak moves its page-aligned buffers onto the arenas
    (remapped registrations, docs/memory.md); this one keeps them in place
    and goes by cross-memory attach."""
    env["SOFTVERBS_REMAP"] = "0"
    run_soak(soak, env, 4, 10)


@pytest.mark.parametrize("path", ["default", "service-copy"])
def test_soak_frozen_peers_10s(soak, env, path):
    """Peers stopped (SIGSTOP) for 200 ms at a time, one after another, in
    the middle of the traffic: the others' operations wait for them, and
    nothing fails, is lost or is torn.  The default path copies into a
    stopped peer by itself; the service-copy path waits for the peer's
    service thread to run again."""
    if path == "service-copy":
        env["SOFTVERBS_CMA"] = "0"
    p, _ = run_soak(soak, env, 3, 10, freeze_ms=200)
    m = re.search(r"FREEZES (\d+) of 200 ms", p.stdout)
    assert m and int(m.group(1)) >= 5, p.stdout


def test_soak_bad_arguments(soak, env):
    for args in (["-n", "1"], ["-n", "17"], ["-t", "0"], ["-t", "x"], ["-F", "0"],
                 ["-F", "9999"]):
        p = svtest.run([str(soak)] + args, env, timeout=30)
        assert p.returncode != 0 and "SOAK OK" not in p.stdout, args
        assert p.stderr.strip(), args
