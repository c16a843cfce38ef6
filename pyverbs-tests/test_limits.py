# SPDX-License-Identifier: MIT
"""Every limit ibv_query_device advertises is enforced (issue 9, items 2, 7).

Counts (PDs, QPs, CQs, MRs, MWs, AHs, SRQs) are device-wide, across the
processes of a fabric, as an HCA's are: one more than the limit fails with
ENOMEM, and destroying one makes room again.  The limits are set per fabric
(SOFTVERBS_MAX_* or the config file, read by the process that creates the
fabric) so that these tests reach them with a handful of objects.  Sizes
beyond the advertised maxima fail with EINVAL.
"""
import errno
import os
import json
import signal
import subprocess
import time

import pytest

import exverbs
import svtest
from svtest import pyverbs

# Creates objects of one kind: `make()` gives a new one.  A PD and a CQ for
# the kinds that need them are made before the limit is counted (the PD
# itself counts for max_pd, so that test's limit allows for it).
KINDS = r"""
import pyverbs.device as d
from pyverbs.pd import PD
from pyverbs.cq import CQ
from pyverbs.qp import QP, QPInitAttr, QPCap
from pyverbs.mr import MR, MW
from pyverbs.srq import SRQ, SrqInitAttr, SrqAttr
from pyverbs.addr import AHAttr, AH
ctx = d.Context(name="loop0")
LID = ctx.query_port(1).lid
pd = PD(ctx) if KIND != "cq" else None
cq = CQ(ctx, 8) if KIND not in ("pd", "cq") else None

def make():
    if KIND == "pd":
        return PD(ctx)
    if KIND == "cq":
        return CQ(ctx, 4)
    if KIND == "qp":
        cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        return QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    if KIND == "mr":
        return MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    if KIND == "mw":
        return MW(pd, e.IBV_MW_TYPE_2)
    if KIND == "ah":
        return AH(pd, attr=AHAttr(port_num=1, dlid=LID))
    if KIND == "srq":
        return SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1)))

def cleanup(objs):
    # Children first: pyverbs' own teardown order at exit is not the
    # kernel's, and a PD freed before its objects is refused with EBUSY.
    for o in reversed([x for x in objs if x is not None]):
        o.close()
    for o in (cq, pd):
        if o is not None:
            o.close()

def attempt():
    try:
        return make(), 0
    except PyverbsRDMAError as x:
        return None, x.error_code

def advertised():
    a = ctx.query_device()
    return {"pd": a.max_pd, "qp": a.max_qp, "cq": a.max_cq, "mr": a.max_mr,
            "mw": a.max_mw, "ah": a.max_ah, "srq": a.max_srq}[KIND]
"""

LIMIT = 3


def kind_env(env, kind, limit=LIMIT):
    e = dict(env)
    e[f"SOFTVERBS_MAX_{kind.upper()}"] = str(limit)
    return e


@pytest.mark.parametrize("kind", ["pd", "qp", "cq", "mr", "mw", "ah", "srq"])
def test_count_enforced_at_limit(env, kind):
    r = pyverbs(f"KIND = {kind!r}\n" + KINDS + f"""
have = [pd] if KIND == "pd" else []
res = {{"advertised": advertised()}}
while len(have) < {LIMIT}:
    o, err = attempt()
    if err:
        res["early"] = [len(have), err]
        break
    have.append(o)
res["made"] = len(have)
o, res["over"] = attempt()
# Destroying one makes room for exactly one more.
have.pop(-1).close()
o, res["again"] = attempt()
if o is not None:
    have.append(o)
o2, res["over_again"] = attempt()
cleanup([x for x in have if x is not pd] + [o2])
out(res)
""", kind_env(env, kind))
    assert r["advertised"] == LIMIT
    assert "early" not in r, f"failed before the limit: {r}"
    assert r["made"] == LIMIT
    assert r["over"] == errno.ENOMEM
    assert r["again"] == 0
    assert r["over_again"] == errno.ENOMEM


HOLD = r"""
import sys
have = [pd] if KIND == "pd" else []
n = int(sys.argv[1])
while len(have) < n:
    have.append(make())
print(json.dumps({"ready": len(have)}), flush=True)
sys.stdin.read()
"""


def start_holder(env, kind, n):
    p = subprocess.Popen([svtest.PYTHON, "-c", svtest.PRELUDE + f"KIND = {kind!r}\n" +
                          KINDS + HOLD, str(n)], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = readline(p, svtest.TIMEOUT)
    if not out:
        p.kill()
        raise AssertionError(f"holder failed: {p.communicate(timeout=svtest.TIMEOUT)}")
    assert json.loads(out)["ready"] == n
    return p


def stop(p, kill=False):
    if kill:
        p.kill()
    else:
        p.stdin.close()
    try:
        p.wait(timeout=svtest.TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for f in (p.stdin, p.stdout, p.stderr):
            if f and not f.closed:
                f.close()


@pytest.mark.parametrize("kind", ["pd", "cq", "ah"])
def test_count_is_device_wide_across_processes(env, kind):
    """A second process shares the first's budget; the first's objects count
    until it is gone, even when it dies without destroying them."""
    e = kind_env(env, kind, 4)
    holder = start_holder(e, kind, 3)
    try:
        r = pyverbs(f"KIND = {kind!r}\n" + KINDS + """
have = [pd] if KIND == "pd" else []
res = {}
o, res["first"] = attempt()
if o is not None:
    have.append(o)
o, res["second"] = attempt()
cleanup([x for x in have if x is not pd] + [o])
out(res)
""", e)
        # The child's own PD counts too for max_pd: it had room for none.
        if kind == "pd":
            assert r == {"first": errno.ENOMEM, "second": errno.ENOMEM}
        else:
            assert r == {"first": 0, "second": errno.ENOMEM}
    finally:
        stop(holder, kill=True)
    # Killed without destroying anything: its share comes back once the
    # dead process is reaped, which a create at the limit does itself.
    r = pyverbs(f"KIND = {kind!r}\n" + KINDS + """
have = [pd] if KIND == "pd" else []
while len(have) < 4:
    o, err = attempt()
    if err:
        break
    have.append(o)
o, over = attempt()
cleanup([x for x in have if x is not pd] + [o])
out({"made": len(have), "over": over})
""", e)
    assert r == {"made": 4, "over": errno.ENOMEM}


def test_first_process_fixes_the_limits(env):
    """Every process of a fabric enforces the limits its creator wrote."""
    first = pyverbs("ctx = d.Context(name='loop0'); out(ctx.query_device().max_pd)",
                    kind_env(env, "pd", 5))
    e = kind_env(env, "pd", 500)
    second = pyverbs("""
from pyverbs.pd import PD
ctx = d.Context(name='loop0')
pds = []
err = 0
while not err and len(pds) < 10:
    try:
        pds.append(PD(ctx))
    except PyverbsRDMAError as x:
        err = x.error_code
for p in pds:
    p.close()
out([ctx.query_device().max_pd, len(pds), err])
""", e)
    assert first == 5
    assert second == [5, 5, errno.ENOMEM]


QP_RACE = r"""
import sys, time
from pyverbs.pd import PD
from pyverbs.cq import CQ
from pyverbs.qp import QP, QPInitAttr, QPCap
ctx = d.Context(name="loop0")
pd = PD(ctx)
cq = CQ(ctx, 8)
print("ready", flush=True)
sys.stdin.readline()   # Both start together
qps, err = [], 0
cap = QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
while not err:
    try:
        qps.append(QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap)))
    except PyverbsRDMAError as x:
        err = x.error_code
out({"made": len(qps), "err": err})
sys.stdout.flush()
sys.stdin.readline()   # Held until both are done
for q in qps:
    q.close()
cq.close()
pd.close()
"""


def readline(p, timeout):
    # readline() has no timeout of its own: an alarm bounds it.
    def late(*_):
        p.kill()
        raise TimeoutError("child did not answer in time (a hang?)")
    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(timeout)
    try:
        return p.stdout.readline()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("limit", [16, 4096])
def test_qp_limit_from_two_processes_does_not_hang(env, limit):
    """Two processes create QPs until the fabric refuses: they get exactly
    the limit between them and ENOMEM, within the timeout (at 4096 the QP
    table itself is full, the case that deadlocked the whole fabric), and
    the fabric stays usable after."""
    e = kind_env(env, "qp", limit)
    procs = [subprocess.Popen([svtest.PYTHON, "-c", svtest.PRELUDE + QP_RACE], env=e,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            assert readline(p, svtest.TIMEOUT).strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        res = []
        for p in procs:
            line = readline(p, 120)
            assert line, p.communicate(timeout=svtest.TIMEOUT)
            res.append(json.loads(line))
        for p in procs:
            out, err = p.communicate("done\n", timeout=120)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [r["err"] for r in res] == [errno.ENOMEM, errno.ENOMEM]
    assert sum(r["made"] for r in res) == limit
    # Both exited: the registry lock is free and their QPs come back.
    p = svtest.run([svtest.PYTHON, "-c", svtest.PRELUDE + QP_RACE], e, timeout=120,
                   input="go\ndone\n")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == {"made": limit, "err": errno.ENOMEM}


def test_sizes_over_the_limit_are_einval(env):
    r = pyverbs(r"""
from pyverbs.pd import PD
from pyverbs.cq import CQ
from pyverbs.qp import QP, QPInitAttr, QPCap
from pyverbs.srq import SRQ, SrqInitAttr, SrqAttr
ctx = d.Context(name="loop0")
a = ctx.query_device()
pd = PD(ctx)
cq = CQ(ctx, 8)
def err(f, *x):
    try:
        f(*x)
    except PyverbsRDMAError as ex:
        return ex.error_code
    return 0
def qp(**kw):
    c = dict(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1,
             max_inline_data=0)
    c.update(kw)
    return QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(**c)))
res = {
    "cqe": err(CQ, ctx, a.max_cqe + 1),
    "cqe_ok": err(lambda: CQ(ctx, a.max_cqe).close()),
    "send_wr": err(lambda: qp(max_send_wr=a.max_qp_wr + 1)),
    "recv_wr": err(lambda: qp(max_recv_wr=a.max_qp_wr + 1)),
    "send_sge": err(lambda: qp(max_send_sge=a.max_sge + 1)),
    "recv_sge": err(lambda: qp(max_recv_sge=a.max_sge + 1)),
    "inline": err(lambda: qp(max_inline_data=257)),
    "at_max": err(lambda: qp(max_send_wr=a.max_qp_wr, max_send_sge=a.max_sge,
                             max_recv_sge=a.max_sge, max_inline_data=256).close()),
    "srq_wr": err(SRQ, pd, SrqInitAttr(SrqAttr(max_wr=a.max_srq_wr + 1, max_sge=1))),
    "srq_sge": err(SRQ, pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=a.max_srq_sge + 1))),
}
cq2 = CQ(ctx, 4)
res["resize"] = err(cq2.resize, a.max_cqe + 1)
# The size a CQ reports is one it may be given back: never above max_cqe.
big = CQ(ctx, a.max_cqe)
sizes = [big.cqe, a.max_cqe, err(big.resize, big.cqe)]
big.close()
for o in (cq2, cq, pd):
    o.close()
res["sizes"] = sizes
out(res)
""", env)
    assert r.pop("cqe_ok") == 0 and r.pop("at_max") == 0
    got, most, resized = r.pop("sizes")
    assert got <= most and resized == 0, (got, most, resized)
    assert r == {k: errno.EINVAL for k in r}, r


@pytest.mark.parametrize("var,value", [
    ("SOFTVERBS_MAX_QP", "0"),
    ("SOFTVERBS_MAX_QP", "4097"),
    ("SOFTVERBS_MAX_MR", "16384"),   # with max_mw 4095: more keys than the table
    ("SOFTVERBS_MAX_CQ", "4000"),    # with 4096 QPs and 1024 SRQs: too many queues
    ("SOFTVERBS_MAX_PD", "many"),
])
def test_bad_limit_is_refused_with_a_message(env, var, value):
    e = dict(env)
    e[var] = value
    p = svtest.run([svtest.PYTHON, "-c", svtest.PRELUDE + """
try:
    d.get_device_list()
    out("listed")
except PyverbsRDMAError as x:
    out("refused")
"""], e)
    assert p.stdout.strip().endswith('"refused"'), p.stdout + p.stderr
    assert var in p.stderr or var.lower().replace("softverbs_", "") in p.stderr, p.stderr


def test_full_dev_shm_is_enomem_not_sigbus(env):
    """A queue's memory is taken when it is created: on a /dev/shm too small
    for it (a container's is 64 MiB) creation fails with ENOMEM, where a
    lazily filled segment would raise SIGBUS later in whichever process first
    touched the missing page.  Run in a mount namespace of its own with
    an 8 MiB /dev/shm (needs unshare -m, so root or user namespaces)."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("unshare -m is not allowed here")
    script = r"""
import json
import pyverbs.device as d
from pyverbs.cq import CQ
from pyverbs.pyverbs_error import PyverbsRDMAError
ctx = d.Context(name="loop0")
small = CQ(ctx, 100)
res = {}
try:
    big = CQ(ctx, 60000)  # about 16 MiB of ring and payload
    res["big"] = 0
except PyverbsRDMAError as ex:
    res["big"] = ex.error_code
CQ(ctx, 100).close()
res["small"] = 0
small.close()
print(json.dumps(res))
"""
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c",
         'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$0" -c "$1"',
         "/usr/bin/python3", script],
        env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert json.loads(p.stdout.splitlines()[-1]) == {"big": errno.ENOMEM, "small": 0}, p.stdout


def test_full_dev_shm_never_faults_the_registry(env):
    """The fabric's registry (2.6 MB in /dev/shm) is reserved whole when it
    is made, as queues are: on a /dev/shm too small for it the device list
    fails with a message naming /dev/shm; made while there was room, a
    process that comes after /dev/shm filled up touches registry pages no
    one had used yet without a fault.  (Before, it was only sized: SIGBUS,
    in every process of the fabric, at the first touch of such a page.)"""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("unshare -m is not allowed here")
    alloc = ("import pyverbs.device as d; from pyverbs.pd import PD; "
             "ctx = d.Context(name='loop0'); pds = [PD(ctx) for _ in range(64)]; print('pds ok')")
    sh = (
        'mount -t tmpfs -o size=2m tmpfs /dev/shm || exit 90; '
        'ibv_devinfo -l; echo "small rc=$?"; umount /dev/shm; '
        'mount -t tmpfs -o size=16m tmpfs /dev/shm || exit 91; '
        'ibv_devinfo -l >/dev/null; echo "made rc=$?"; '
        'dd if=/dev/zero of=/dev/shm/filler bs=4k 2>/dev/null; '
        '"$0" -c "$1"; echo "full rc=$?"')
    p = subprocess.run(["unshare", "-m", "sh", "-c", sh, "/usr/bin/python3", alloc],
                       env=env, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "small rc=" in out and "small rc=0" not in out and "small rc=135" not in out, out
    assert "/dev/shm is full" in out, out
    assert "made rc=0" in out, out
    assert "pds ok" in out and "full rc=0" in out, out


def test_registry_removed_by_its_creator_is_made_again(env, fabric):
    """A process that finds the fabric's registry being set up waits for
    it; if its creator removes it instead (it could not reserve it: a full
    /dev/shm), the waiter starts again and makes it itself, rather than
    waiting out the setup time and calling the segment "never initialised
    (its creator died?)".  The creator here is a file made as the library
    makes it (O_EXCL, 0600, empty) and removed 0.3 s later."""
    path = f"/dev/shm/softverbs-{os.geteuid()}-{fabric}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.close(fd)
    try:
        p = subprocess.Popen(["ibv_devinfo", "-l"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        time.sleep(0.3)
    finally:
        os.unlink(path)
    out = p.communicate(timeout=60)[0]
    assert p.returncode == 0 and "loop0" in out, out


def test_message_and_address_limits(env):
    """Found by a helper's audit of what loop0 advertises:
    - a WR whose SGEs add up to more than the port's max_msg_sz (2^31) is
      EINVAL at post, as rxe's validate_send_wr and post_one_recv answer:
      ibv_post_send, an ibv_wr_* batch (posting none of it) and
      ibv_post_recv; a receive of exactly max_msg_sz is taken (before, all
      were posted, and a 2^31 + 1 byte SEND completed SUCCESS);
    - a GRH's source GID index naming an empty slot of the table is
      ENODATA from ibv_create_ah and from the AV of ibv_modify_qp (the
      kernel's rdma_get_gid_attr), one beyond the table EINVAL (the empty
      slot was taken);
    - ibv_alloc_dm above max_dm_size is EINVAL (it was ENOMEM, the answer
      for a pool used up);
    - ibv_create_srq takes any srq_limit (ibv_create_srq(3): irrelevant to
      create; rxe and mlx5 do not check it): it was EINVAL above max_wr."""
    r = svtest.pyverbs(exverbs.SETUP + r"""
from pyverbs.wr import SendWR
from pyverbs.qp import QPInitAttr
from pyverbs.addr import GlobalRoute
from pyverbs.srq import SRQ, SrqInitAttr, SrqAttr
from pyverbs.device import DM, AllocDmAttr
a = ctx.query_device()
pa = ctx.query_port(1)
n = min(32, a.max_sge)
chunk = (pa.max_msg_sz + 1 + n - 1) // n
mr = MR(pd, (chunk + 4095) // 4096 * 4096, ACC)
cq = CQ(ctx, 16)
q = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                      cap=QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=n, max_recv_sge=n)))
to_rts(q, q.qp_num)
over = [SGE(mr.buf, chunk, mr.lkey) for _ in range(n)]
res = {"sges": n, "total": n * chunk, "max": pa.max_msg_sz}
res["send"] = errno_of(q.post_send, SendWR(opcode=e.IBV_WR_SEND, num_sge=n, sg=over))
res["recv"] = errno_of(q.post_recv, RecvWR(num_sge=n, sg=over))
exact = [SGE(mr.buf, chunk, mr.lkey) for _ in range(n - 1)]
exact.append(SGE(mr.buf, pa.max_msg_sz - (n - 1) * chunk, mr.lkey))
res["recv_exact"] = errno_of(q.post_recv, RecvWR(num_sge=n, sg=exact))
xcq = cq_ex()
x = qp_ex(xcq, max_sge=n)
to_rts(x, x.qp_num)
def batch():
    x.wr_start()
    x.wr_id = 1
    x.wr_send()
    x.wr_set_sge_list(n, over)
    return x.wr_complete()
res["wr_batch"] = errno_of(batch)
gid = ctx.query_gid(1, 0)
def ah(index):
    return AH(pd, attr=AHAttr(port_num=1, dlid=pa.lid, is_global=1,
                              gr=GlobalRoute(dgid=gid, sgid_index=index)))
res["ah_empty"] = errno_of(ah, 5)
res["ah_beyond"] = errno_of(ah, pa.gid_tbl_len)
res["ah_ok"] = errno_of(ah, 0)
r = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                      cap=QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)))
i = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
i.pkey_index = 0
i.qp_access_flags = ACC
r.modify(i, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
def rtr(index):
    t = QPAttr(qp_state=e.IBV_QPS_RTR)
    t.path_mtu = e.IBV_MTU_1024
    t.dest_qp_num = q.qp_num
    t.rq_psn = 0
    t.max_dest_rd_atomic = 1
    t.min_rnr_timer = 1
    t.ah_attr = AHAttr(port_num=1, dlid=pa.lid, is_global=1,
                       gr=GlobalRoute(dgid=gid, sgid_index=index))
    r.modify(t, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN |
             e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
res["rtr_empty"] = errno_of(rtr, 5)
res["rtr_ok"] = errno_of(rtr, 0)
dmax = ctx.query_device_ex().max_dm_size
res["dm_over"] = errno_of(DM, ctx, AllocDmAttr(length=dmax + 1))
res["dm_max"] = errno_of(lambda: DM(ctx, AllocDmAttr(length=dmax)).close())
res["srq_limit"] = errno_of(lambda: SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1,
                                                                srq_limit=5))).close())
out(res)
""", env, timeout=120)
    assert r.pop("total") > r.pop("max"), r
    assert r.pop("sges") >= 2
    assert r == {"send": errno.EINVAL, "recv": errno.EINVAL, "recv_exact": 0,
                 "wr_batch": errno.EINVAL, "ah_empty": errno.ENODATA,
                 "ah_beyond": errno.EINVAL, "ah_ok": 0, "rtr_empty": errno.ENODATA,
                 "rtr_ok": 0, "dm_over": errno.EINVAL, "dm_max": 0, "srq_limit": 0}, r
