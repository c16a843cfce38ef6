# SPDX-License-Identifier: MIT
"""Completion events on a shared channel (issue 9, item 6).

N CQs are armed on one completion channel in one process; another process
completes one receive into each at once.  Every CQ must get exactly one
event, although the channel's socket queues far fewer datagrams than N
(net.unix.max_dgram_qlen), and none may be left over; each completion's
payload is checked (tests/progs/sv_cq_events.c).
"""
import subprocess

import pytest

import svtest


@pytest.fixture
def prog(build_dir):
    return svtest.built_prog(build_dir, "sv_cq_events")


@pytest.mark.parametrize("n", [20, 200])
def test_every_armed_cq_gets_exactly_one_event(env, prog, n):
    owner = subprocess.Popen([prog, "owner", str(n)], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()  # Bounded by the program's own watchdog
        assert line.startswith("ready "), owner.communicate(timeout=svtest.TIMEOUT)
        words = line.split()
        lid, qpns = words[1], words[2:]
        assert len(qpns) == n
        s = svtest.run([prog, "sender", str(n), lid] + qpns, env, timeout=60)
        assert s.returncode == 0 and s.stdout.strip() == "ok", s.stderr
        out, err = owner.communicate("done\n", timeout=60)
        assert owner.returncode == 0 and out.strip() == "ok", err
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_arming_a_cq_that_holds_completions(env, build_dir):
    """ibv_req_notify_cq over completions not yet polled raises the event
    at once, once, as a ConnectX does (its arm names the consumer index);
    a solicited-only arm only for a solicited or failed one
    (tests/progs/sv_arm.c).  perftest -e -Q N polls one batch per event
    and hung without it.  Completions an event announced fire instead
    when a poll leaves them (ib_send_lat -e re-arms before its one poll
    per event, and ran out of step on an event at the arm)."""
    p = svtest.run([svtest.built_prog(build_dir, "sv_arm")], env, timeout=90)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.stdout, p.stderr)
