# SPDX-License-Identifier: MIT
"""Memory windows: type 1 (ibv_bind_mw) and type 2B (IBV_WR_BIND_MW)."""
import errno

from memsv import RC
from svtest import pyverbs


def test_caps_advertise_windows(env):
    r = pyverbs(RC + """
a = ctx.query_device()
out({"caps": a.device_cap_flags, "max_mw": a.max_mw,
     "want": e.IBV_DEVICE_MEM_WINDOW | e.IBV_DEVICE_MEM_WINDOW_TYPE_2B |
             e.IBV_DEVICE_MEM_MGT_EXTENSIONS})
""", env)
    assert r["caps"] & r["want"] == r["want"] and r["max_mw"] > 0


def test_type1_bind_bounds_rights_and_busy_mr(env):
    r = pyverbs(RC + """
a, b = pair()
tgt = MR(pd, 8192, RW | e.IBV_ACCESS_MW_BIND)
src = MR(pd, 8192, RW)
mw = MW(pd, e.IBV_MW_TYPE_1)
old = mw.rkey
b.qp.bind_mw(mw, MWBind(MWBindInfo(tgt, tgt.buf + 4096, 1024, e.IBV_ACCESS_REMOTE_WRITE),
                        e.IBV_SEND_SIGNALED))
wc = poll(b.cq)[0]
res = {"bind": [wc.status, wc.opcode], "new_key": mw.rkey != old and (mw.rkey >> 8) == (old >> 8)}
res["in"] = write(a, src, tgt.buf + 4096, mw.rkey, 1024).status
res["busy"] = err(tgt.close)
c, d = pair()
res["out"] = write(c, src, tgt.buf + 4000, mw.rkey, 200).status
a2, b2 = pair()
res["read"] = read(a2, src, tgt.buf + 4096, mw.rkey, 8).status
a3, b3 = pair()
res["old"] = write(a3, src, tgt.buf + 4096, old, 8).status
res["type3"] = err(MW, pd, 3)
mw.close()
res["freed"] = err(tgt.close)
res["ok"] = [e.IBV_WC_BIND_MW, e.IBV_WC_REM_ACCESS_ERR]
out(res)
""", env)
    assert r["bind"] == [0, r["ok"][0]] and r["new_key"]
    assert r["in"] == 0
    assert r["busy"] == errno.EBUSY
    rem = r["ok"][1]
    assert r["out"] == rem and r["read"] == rem and r["old"] == rem
    assert r["type3"] == errno.EINVAL and r["freed"] == 0


def test_type2_bound_to_one_qp_and_bound_once(env):
    r = pyverbs(RC + """
a, b = pair()
tgt = MR(pd, 4096, RW | e.IBV_ACCESS_MW_BIND)
src = MR(pd, 4096, RW)
mw = MW(pd, e.IBV_MW_TYPE_2)
wr = SendWR(opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
wr.set_bind_wr(mw, MWBindInfo(tgt, tgt.buf, 4096, e.IBV_ACCESS_REMOTE_WRITE))
b.qp.post_send(wr)
wc = poll(b.cq)[0]
res = {"bind": [wc.status, wc.opcode, e.IBV_WC_BIND_MW]}
res["via_bound_qp"] = write(a, src, tgt.buf, wr.rkey, 64).status
c, d = pair()   # d is not the QP the window is bound to
res["via_other_qp"] = write(c, src, tgt.buf, wr.rkey, 64).status
wr2 = SendWR(opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
wr2.set_bind_wr(mw, MWBindInfo(tgt, tgt.buf, 4096, e.IBV_ACCESS_REMOTE_WRITE))
b.qp.post_send(wr2)
res["rebind"] = poll(b.cq)[0].status
res["codes"] = [e.IBV_WC_REM_ACCESS_ERR, e.IBV_WC_MW_BIND_ERR]
out(res)
""", env)
    assert r["bind"][0] == 0 and r["bind"][1] == r["bind"][2]
    assert r["via_bound_qp"] == 0
    assert r["via_other_qp"] == r["codes"][0]
    assert r["rebind"] == r["codes"][1]


def test_type1_cannot_be_posted_as_a_wr(env):
    r = pyverbs(RC + """
a, b = pair()
tgt = MR(pd, 4096, RW | e.IBV_ACCESS_MW_BIND)
mw = MW(pd, e.IBV_MW_TYPE_1)
wr = SendWR(opcode=e.IBV_WR_BIND_MW)
wr.set_bind_wr(mw, MWBindInfo(tgt, tgt.buf, 4096, e.IBV_ACCESS_REMOTE_WRITE))
out(err(b.qp.post_send, wr))
""", env)
    assert r == errno.EINVAL


def test_bind_shapes_hcas_refuse(env):
    """Found by a helper's probe: a type 2 window bound with length 0 is a
    bind error (IBTA o10-37.2.40; rxe's rxe_check_bind_mw), and the window
    stays unbound, so its MR deregisters (it completed SUCCESS and left
    the window bound: the MR was EBUSY and the next bind failed); a type 1
    window bound zero-based is EINVAL (o10-36.2.2; mlx5_bind_mw), where
    type 2 zero-based stays allowed."""
    r = pyverbs(RC + """
a, b = pair()
tgt = MR(pd, 4096, RW | e.IBV_ACCESS_MW_BIND)
src = MR(pd, 4096, RW)
mw = MW(pd, e.IBV_MW_TYPE_2)
wr = SendWR(opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
wr.set_bind_wr(mw, MWBindInfo(tgt, tgt.buf, 0, e.IBV_ACCESS_REMOTE_WRITE))
b.qp.post_send(wr)
res = {"zero_len": poll(b.cq)[0].status, "codes": [e.IBV_WC_MW_BIND_ERR]}
# Unbound: a new QP binds it zero-based, and a WRITE at window offset 0 lands.
c, d = pair()
wr2 = SendWR(opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
wr2.set_bind_wr(mw, MWBindInfo(tgt, tgt.buf + 1024, 1024,
                               e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_ZERO_BASED))
d.qp.post_send(wr2)
res["type2_zero_based"] = poll(d.cq)[0].status
res["write"] = write(c, src, 0, wr2.rkey, 64).status
mw.close()
m1 = MW(pd, e.IBV_MW_TYPE_1)
f, g = pair()
res["type1_zero_based"] = err(g.qp.bind_mw, m1, MWBind(MWBindInfo(
    tgt, tgt.buf, 1024, e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_ZERO_BASED), e.IBV_SEND_SIGNALED))
m1.close()
res["dereg"] = err(tgt.close)
out(res)
""", env)
    assert r["zero_len"] == r["codes"][0], r
    assert r["type2_zero_based"] == 0 and r["write"] == 0, r
    assert r["type1_zero_based"] == errno.EINVAL, r
    assert r["dereg"] == 0, r
