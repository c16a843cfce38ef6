# SPDX-License-Identifier: MIT
"""Object lifetimes as the kernel keeps them (docs/design.md, "Object
lifetimes"), through tests/progs/sv_lifetimes.c: pyverbs destroys children
before parents itself and refuses to use a closed object, so the wrong
orders are driven from C.

- EBUSY from ibv_dealloc_pd, ibv_destroy_cq, ibv_destroy_comp_channel and
  ibv_close_xrcd while objects use them; the object still works afterwards
  (traffic with checked data) and goes once its users are gone;
- ibv_destroy_cq blocks until its completion events are acknowledged, and
  ibv_destroy_cq/qp until their async events are;
- a destroyed object given to a verb is EINVAL (ENOENT to destroy it
  again), an object of another context EINVAL: never a crash; also a CQ
  destroyed while other threads poll, start_poll and arm it ("polled");
- a UD QP attached to a multicast group: ibv_destroy_qp is EBUSY;
- ibv_close_device with every kind of object live destroys them (the peer's
  WRITE fails and lands nothing), without waiting for unacknowledged
  events, and the stale pointers answer ENOENT.
"""
import pytest

import svtest

SCENARIOS = ["pd", "cq", "channel", "xrcd", "unacked", "async", "stale", "foreign", "mcast",
             "close", "fork", "forkclose", "polled", "posting"]


def run_prog(build_dir, env, scenario, debug=False):
    prog = build_dir / "tests" / "progs" / "sv_lifetimes"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir}")
    e = dict(env)
    if debug:
        e["SOFTVERBS_DEBUG"] = "1"
    p = svtest.run([str(prog), scenario], e, timeout=90)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert p.stdout.strip() == f"OK {scenario}", (p.stdout, p.stderr)
    return p


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lifetimes(build_dir, env, scenario):
    run_prog(build_dir, env, scenario)


def test_double_destroy_reported_under_debug(build_dir, env):
    """SOFTVERBS_DEBUG names the double destroy and the stale use."""
    err = run_prog(build_dir, env, "stale", debug=True).stderr
    assert "ibv_destroy_qp" in err and "double destroy" in err, err
    assert "ibv_dealloc_pd" in err and "ibv_dereg_mr" in err, err
    assert "ibv_post_send: QP" in err and "was destroyed" in err, err
    assert "ibv_destroy_comp_channel" in err, err


def test_busy_and_unacked_reported_under_debug(build_dir, env):
    """SOFTVERBS_DEBUG says why a destroy was refused, and that
    ibv_destroy_cq waits for unacknowledged events."""
    err = run_prog(build_dir, env, "pd", debug=True).stderr
    assert "ibv_dealloc_pd" in err and "still use" in err, err
    err = run_prog(build_dir, env, "unacked", debug=True).stderr
    assert "not acknowledged" in err and "waiting" in err, err


def test_quiet_without_debug(build_dir, env):
    """Without SOFTVERBS_DEBUG the refusals print nothing."""
    err = run_prog(build_dir, env, "stale").stderr
    assert "softverbs:" not in err, err
