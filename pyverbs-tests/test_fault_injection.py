# SPDX-License-Identifier: MIT
"""A buggy peer's stray writes into shared memory (issue 9, item 8).

Shared memory is no security boundary (a process of the same user can
ptrace), but a bug in one process must not take the others down: garbage
in any region of any segment must end in error completions or refused
calls on the victim's side, never in SIGSEGV/SIGBUS/SIGABRT or a wait
without end.  Each case runs tests/progs/sv_fault (two processes with
checked RC traffic) on a fabric of its own, writes garbage into one class
of region while the traffic runs, and then requires of the victims:
  - no death by a signal, and exit within a bound (their own watchdog is
    SECONDS + 40 s; the test allows 60 s);
  - every process reached its end: a RESULT line, no stall (a send left
    with no completion at all for 8 s), and the teardown (CLEAN);
  - whatever went wrong was reported: a message lost while its sender got
    success, with no error completion, refusal or bad-data report anywhere,
    fails the test (except where docs/design.md says a forgery cannot be
    told from the real thing: a well-formed CQE or payload written over a
    real one).
A control pair on another fabric runs at the same time and must see
nothing at all: every message intact, no error.

Offsets come from softverbs_fabric.layout(), i.e. from the ABI header the
build used, so the garbage lands where the test says it does.
"""
import glob
import os
import random
import re
import select
import shutil
import signal
import subprocess
import time

import pytest

import softverbs_fabric  # Built by meson into <build>/tools; PYTHONPATH points there
import svtest

L = softverbs_fabric.layout()
SECONDS = 3        # Traffic time of each victim
BOUND = 60         # No victim may take longer than this, garbage or not
SCRIBBLE_S = 0.6   # Garbage is written for this long, every few ms

# (segment kind, region); "srq" runs the victims with an SRQ on one side,
# "svc" with SOFTVERBS_CMA=0 so that the service copy path carries the data.
REGIONS = [
    ("registry", "lock"),
    ("registry", "leases"),
    ("registry", "qp_records"),
    ("registry", "obj_records"),
    ("registry", "mr_records"),
    ("registry", "mcast"),
    ("registry", "atomic_locks"),
    ("cq", "header"),
    ("cq", "prod_cons"),
    ("cq", "slots"),
    ("cq", "payloads"),
    ("rq", "header"),
    ("rq", "prod_cons"),
    ("rq", "wqes"),
    ("srq", "header"),
    ("srq", "prod_cons"),
    ("srq", "wqes"),
    ("svc", "request"),
]

# Garbage in these regions can be well-formed: a forged completion or
# payload is indistinguishable from a real one, so a message may be lost
# or altered without any report (docs/design.md lists them).
UNDETECTABLE = {("cq", "slots"), ("cq", "payloads")}


@pytest.fixture
def sv_fault(build_dir):
    p = build_dir / "tests" / "progs" / "sv_fault"
    if not p.exists():
        pytest.fail(f"{p} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    return p


class Victim:
    """sv_fault running in the background, its output read as it comes."""

    def __init__(self, prog, env, srq=False):
        argv = [str(prog), str(SECONDS)] + (["srq"] if srq else [])
        self.p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        self.lines = []
        self.pending = b""
        self.start = time.monotonic()

    def read_until(self, word, timeout):
        # From the raw descriptor: select() cannot see lines a buffered
        # reader already holds, and RUNNING would then be read only when
        # the next output came, after the victims had finished.
        fd = self.p.stdout.fileno()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(l.startswith(word) for l in self.lines):
                return True
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return False
                self.pending += chunk
                *done, self.pending = self.pending.split(b"\n")
                self.lines += [l.decode(errors="replace").strip() for l in done]
        return False

    def finish(self, timeout):
        """Waits for the end; True if it ended within timeout (else killed)."""
        try:
            out, err = self.p.communicate(timeout=max(1, timeout - (time.monotonic() - self.start)))
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            out, err = self.p.communicate()
            self.lines += (self.pending.decode(errors="replace") + out).splitlines()
            self.err = err
            return False
        self.lines += (self.pending.decode(errors="replace") + out).splitlines()
        self.err = err
        return True

    def info(self):
        d = {}
        for l in self.lines:
            m = re.match(r"INFO (\d) qpn=(\d+) rkey=(\d+) lkey=(\d+) pid=(\d+)", l)
            if m:
                d[int(m[1])] = dict(qpn=int(m[2]), rkey=int(m[3]), lkey=int(m[4]), pid=int(m[5]))
        return d

    def results(self):
        r = {}
        for l in self.lines:
            if l.startswith("RESULT "):
                f = l.split()
                kv = dict(x.split("=", 1) for x in f[2:] if "=" in x)
                r[int(f[1])] = {k: int(v) for k, v in kv.items()}
        return r

    def report(self):
        return ("\n".join(self.lines) + "\nstderr:\n" + (getattr(self, "err", "") or "")[-3000:])


def registry_path(fabric):
    return f"/dev/shm/{svtest.segment_prefix()}{fabric}"


def queue_segments(fabric, kind):
    """(path, header fields) of the fabric's queue segments of one kind."""
    out = []
    for path in glob.glob(glob.escape(registry_path(fabric)) + "-q*"):
        try:
            with open(path, "rb") as f:
                hdr = f.read(L["q.hdr_size"])
        except FileNotFoundError:
            continue
        if len(hdr) < L["q.hdr_size"]:
            continue
        u32 = lambda off: int.from_bytes(hdr[off:off + 4], "little")
        if u32(L["q.kind"]) != kind:
            continue
        out.append((path, dict(entries=u32(L["q.entries"]), entry_size=u32(L["q.entry_size"]),
                               slots_offset=u32(L["q.slots_offset"]),
                               size=os.path.getsize(path))))
    return out


def garbage(rng, n):
    """Bytes that are wrong in the ways that matter: huge, all-ones, random,
    and small plausible-looking numbers."""
    pick = rng.randrange(4)
    if pick == 0:
        return bytes([0xff]) * n
    if pick == 1:
        return bytes(rng.randrange(256) for _ in range(n))
    if pick == 2:
        # 1 is init: a pid that is always alive
        return b"".join(rng.choice([0, 1, 7, 64, 4096, 0x7fffffff]).to_bytes(4, "little")
                        for _ in range((n + 3) // 4))[:n]
    return (rng.getrandbits(64) | (1 << 62)).to_bytes(8, "little")[:n].ljust(n, b"\0")


def targets(fabric, seg, region, info):
    """[(path, offset, length)] of the region to scribble."""
    reg = registry_path(fabric)
    t = []
    if seg == "registry":
        if region == "lock":
            t.append((reg, L["reg.lock"], 16))  # Word and holder start time
        elif region == "leases":
            t.append((reg, L["reg.leases"], L["lease.size"] * 8))
        elif region == "qp_records":
            for v in info.values():
                slot = v["qpn"] & L["qpn_slot_mask"]
                t.append((reg, L["reg.qps"] + slot * L["qp.size"], L["qp.size"]))
        elif region == "obj_records":
            # The first objects of the fabric: the victims' CQs, RQs, SRQ,
            # service segments.
            t.append((reg, L["reg.objs"], L["obj.size"] * 8))
        elif region == "mr_records":
            for v in info.values():
                for key in (v["rkey"], v["lkey"]):
                    slot = key >> L["mr_key_bits"]
                    t.append((reg, L["reg.mrs"] + slot * L["mr.size"], L["mr.size"]))
        elif region == "mcast":
            t.append((reg, L["reg.mcast"], L["mcast.size"] * 4))
        elif region == "atomic_locks":
            t.append((reg, L["reg.atomic_locks"], 4 * L["atomic_locks"]))
        return t
    kind = {"cq": L["OBJ_CQ"], "rq": L["OBJ_RQ"], "srq": L["OBJ_SRQ"], "svc": L["OBJ_SVC"]}[seg]
    for path, h in queue_segments(fabric, kind):
        if region == "header":
            t.append((path, 0, L["q.hdr_size"]))
            if seg == "cq":
                t.append((path, L["cq.payload_offset"], 4))
        elif region == "prod_cons":
            pc = "cq" if seg == "cq" else "rq"
            t.append((path, L[pc + ".prod"], 8))
            t.append((path, L[pc + ".cons"], 8))
        elif region in ("slots", "wqes"):
            n = h["entries"] * h["entry_size"]
            t.append((path, h["slots_offset"], min(n, 64 * 64)))
        elif region == "payloads":
            off = h["slots_offset"] + h["entries"] * h["entry_size"]
            off = (off + 4095) & ~4095
            t.append((path, off, min(h["entries"] * L["payload.size"], 64 * L["payload.size"])))
        elif region == "request":
            t.append((path, L["svc.lock"], L["svc.len"] + 8 - L["svc.lock"]))
    return t


def scribble(tgts, rng, seconds):
    end = time.monotonic() + seconds
    writes = 0
    fds = {}
    try:
        while time.monotonic() < end:
            for path, off, length in tgts:
                if path not in fds:
                    try:
                        fds[path] = os.open(path, os.O_RDWR)
                    except FileNotFoundError:
                        continue
                # Part of the region each time: a field, a word, or all of it.
                o = off + rng.randrange(0, max(1, length - 8) + 1, 4)
                n = min(rng.choice([4, 8, 16, length]), off + length - o)
                if n > 0:
                    os.pwrite(fds[path], garbage(rng, n), o)
                    writes += 1
            time.sleep(0.004)
    finally:
        for fd in fds.values():
            os.close(fd)
    return writes


def check_control(ctl):
    assert ctl.finish(BOUND), "control pair did not finish:\n" + ctl.report()
    assert ctl.p.returncode == 0, ctl.report()
    res = ctl.results()
    assert set(res) == {0, 1}, ctl.report()
    for i, r in res.items():
        assert r["sent"] > 0 and r["err_wc"] == 0 and r["bad_data"] == 0 and \
            r["post_err"] == 0 and r["bogus"] == 0 and r["async"] == 0 and r["stall"] == 0, \
            "the other fabric was affected:\n" + ctl.report()
    assert res[0]["sent"] == res[1]["recv_ok"] and res[1]["sent"] == res[0]["recv_ok"], \
        ctl.report()
    assert sum(l.startswith("CLEAN") for l in ctl.lines) == 2, ctl.report()


def _param(seg, region):
    return pytest.param(seg, region, id=f"{seg}-{region}")


@pytest.mark.parametrize("seg,region", [_param(s, r) for s, r in REGIONS])
def test_stray_writes(sv_fault, env, fabric, seg, region):
    if seg == "svc":
        env["SOFTVERBS_CMA"] = "0"
    ctl_name = svtest.new_fabric_name()
    ctl_env = dict(env, SOFTVERBS_FABRIC=ctl_name)
    ctl_env.pop("SOFTVERBS_CMA", None)
    victim = Victim(sv_fault, env, srq=(seg == "srq"))
    ctl = Victim(sv_fault, ctl_env)
    try:
        assert victim.read_until("RUNNING", 30), "victims never started:\n" + victim.report()
        info = victim.info()
        assert set(info) == {0, 1}, victim.report()
        time.sleep(0.3)  # Traffic under way
        tgts = targets(fabric, seg, region, info)
        assert tgts, f"no {seg} segment found for {region}"
        rng = random.Random(f"{seg}/{region}")
        writes = scribble(tgts, rng, SCRIBBLE_S)
        assert writes > 0
        ended = victim.finish(BOUND)
        check_control(ctl)
    finally:
        for v in (victim, ctl):
            if v.p.poll() is None:
                os.killpg(v.p.pid, signal.SIGKILL)
                v.p.communicate()
        svtest.remove_fabric(ctl_name)
    out = victim.report()
    print(f"{seg}-{region}:", *[l for l in victim.lines if l.startswith("RESULT")], sep="\n  ")
    assert ended, f"victims still running after {BOUND} s (a hang):\n{out}"
    assert not any(l.startswith("SIGNAL") for l in victim.lines), f"a victim crashed:\n{out}"
    assert victim.p.returncode == 0, f"sv_fault exited {victim.p.returncode}:\n{out}"
    res = victim.results()
    assert set(res) == {0, 1}, f"a victim did not reach its end:\n{out}"
    for i, r in res.items():
        assert r["stall"] == 0, f"process {i}: a send neither completed nor failed:\n{out}"
    assert sum(l.startswith("CLEAN") for l in victim.lines) == 2, \
        f"a victim did not get through its teardown:\n{out}"
    reported = any(r["err_wc"] or r["post_err"] or r["bad_data"] or r["bogus"] or r["async"]
                   for r in res.values())
    lost = any(res[i]["sent"] > res[1 - i]["recv_ok"] + res[1 - i]["bad_data"] for i in (0, 1))
    if (seg, region) not in UNDETECTABLE:
        assert reported or not lost, f"messages lost with nothing reported:\n{out}"


def test_atomic_stripe_of_a_stopped_holder_is_not_taken(env, fabric):
    """A process stopped (SIGSTOP, a debugger) while it holds one of the
    fabric's atomic stripe locks still holds it: a waiter must not take it
    over after the 2 s that a running holder gets (its word copy and the
    waiter's would interleave when it ran again).  Every stripe is made to
    name a stopped process; ib_atomic_bw's FETCH_ADDs wait past those 2 s
    with every stripe still the holder's (a stripe taken over is released
    to 0 after its one operation), and go on once the holder is gone."""
    if not shutil.which("ib_atomic_bw"):
        pytest.skip("ib_atomic_bw not installed")
    holder = subprocess.Popen(["sleep", "120"])
    procs = [holder]
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        port = str(random.randint(20000, 40000))
        srv = subprocess.Popen(["ib_atomic_bw", "-d", "loop0", "-p", port, "-n", "200"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(srv)
        reg = registry_path(fabric)
        deadline = time.monotonic() + 20
        while not os.path.exists(reg):
            assert srv.poll() is None and time.monotonic() < deadline, srv.stdout.read()
            time.sleep(0.02)
        time.sleep(0.5)  # Listening on its TCP port
        with open(reg, "r+b") as f:
            f.seek(L["reg.atomic_locks"])
            f.write(holder.pid.to_bytes(4, "little") * L["atomic_locks"])
        cli = subprocess.Popen(["ib_atomic_bw", "-d", "loop0", "-p", port, "-n", "200",
                                "localhost"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        procs.append(cli)
        time.sleep(4.5)
        with open(reg, "rb") as f:
            f.seek(L["reg.atomic_locks"])
            words = f.read(4 * L["atomic_locks"])
        taken = sum(1 for i in range(0, len(words), 4)
                    if int.from_bytes(words[i:i + 4], "little") != holder.pid)
        assert taken == 0 and cli.poll() is None, \
            f"{taken} stripes taken from a stopped holder in 4.5 s"
        holder.kill()  # Gone: its stripes are taken over at once
        holder.wait()
        out, _ = cli.communicate(timeout=60)
        sout, _ = srv.communicate(timeout=60)
        # perftest fits its clock only after every iteration completed, and
        # on a loaded machine the fit can fail ("Can't produce a report",
        # test_perftest.py): that exit 1 still means the traffic finished.
        for rc, o in ((cli.returncode, out), (srv.returncode, sout)):
            assert rc == 0 or (rc == 1 and "Correlation coefficient r^2" in o
                               and "#bytes" in o), o
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
