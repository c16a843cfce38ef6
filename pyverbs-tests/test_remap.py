# SPDX-License-Identifier: MIT
"""Remapped registrations (docs/memory.md, "Remapped registrations"):
ibv_reg_mr moves a page-aligned range of private anonymous memory onto the
process's arena memfd, at the same addresses and with the same contents,
so that peers copy into it with memcpy.  tests/progs/sv_remap.c rules on
each hazard of the move with a peer process and every byte checked; each
scenario also runs with SOFTVERBS_REMAP=0, where nothing may move and the
data checks hold all the same."""
import subprocess

import pytest

import svtest

SCENARIOS = ["traffic", "kernel", "signals", "writers", "dontneed", "attrs", "maxmap", "memory",
             "fork", "mremap", "sighandler", "race", "race-rereg", "race-read", "race-inv", "race-mw", "closedfd", "munmap", "emfile", "express",
             "express-send", "deferred"]


@pytest.fixture
def remap(build_dir):
    p = build_dir / "tests" / "progs" / "sv_remap"
    if not p.exists():
        pytest.fail(f"{p} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    return p


@pytest.mark.parametrize("setting", ["on", "off"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_remap_hazard(remap, env, softverbs, fabric, scenario, setting):
    if setting == "off":
        env["SOFTVERBS_REMAP"] = "0"
    p = svtest.run([str(remap), scenario], env, timeout=200)
    text = f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert p.returncode == 0, text
    if f"SKIP sv_remap {scenario}" in p.stdout:
        # Only where the machine or the setting rules the scenario out.
        assert scenario in ("maxmap", "memory", "closedfd"), text
        if scenario == "closedfd":
            assert setting == "off", text
        pytest.skip(p.stdout.strip().splitlines()[-1])
    assert f"OK sv_remap {scenario}" in p.stdout, text
    if scenario.startswith("express"):
        # The express way ran (the peer's lease says so) where the target
        # memory moved onto the arena, and only there: the checks above
        # then held on both ways.
        show = subprocess.run([softverbs, "show", fabric], env=env, capture_output=True,
                              text=True, timeout=30).stdout
        slots = [l for l in show.splitlines() if l.strip().startswith("slot ")]
        express = [l for l in slots if " express" in l]
        assert (len(express) > 0) == (setting == "on"), show


@pytest.mark.parametrize("op", ["dereg", "reg", "childdereg"])
@pytest.mark.parametrize("order", ["early", "late"])
def test_verbs_in_another_librarys_fork_handler(build_dir, env, order, op):
    """tests/progs/sv_atfork.c: ibv_dereg_mr or ibv_reg_mr in a
    pthread_atfork prepare handler, as UCX's registration cache purges
    itself before a fork (Open MPI over UCX, a helper's probe), with the
    handler registered before libibverbs is loaded and after: fork returns,
    the verb succeeds, and the child still gets registered memory as it was
    at the fork, its writes its own.  Before, fork() never returned: our
    prepare handler, registered at the first registration, held the remap
    lock that the deregistration took."""
    p = svtest.run([str(build_dir / "tests" / "progs" / "sv_atfork"), order, op], env,
                   timeout=90)
    assert p.returncode == 0 and f"OK sv_atfork {order} {op}" in p.stdout, (
        f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")


SETENV = r"""
import json, mmap, os, sys
import pyverbs.device as d
from pyverbs.pd import PD
from pyverbs.mr import MR
import pyverbs.enums as e
if sys.argv[1] == "off":
    os.environ["SOFTVERBS_REMAP"] = "0"  # After the library loaded
ctx = d.Context(name="loop0")
pd = PD(ctx)
mr = MR(pd, 1 << 20, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
moved = any("softverbs-mr" in l for l in open("/proc/self/maps"))
print(json.dumps({"moved": moved}))
"""


@pytest.mark.parametrize("setting", ["on", "off"])
def test_remap_setting_read_at_first_registration(env, setting):
    """SOFTVERBS_REMAP=0 set by the program after the library loaded (a
    C program's setenv in main, a script's os.environ after importing
    pyverbs) still holds: it is read at the first registration, not when
    the library loads (the fork handlers' registration read it there for
    a while; the review of that change)."""
    env.pop("SOFTVERBS_REMAP", None)
    p = subprocess.run(["/usr/bin/python3", "-c", SETENV, setting], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    import json
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"moved": setting == "on"}, p.stdout
