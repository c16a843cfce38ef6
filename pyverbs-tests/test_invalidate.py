# SPDX-License-Identifier: MIT
"""LOCAL_INV and SEND_WITH_INV; BMME fast-register through the C example."""
import os
import subprocess

import svtest
from memsv import RC
from svtest import pyverbs

BIND2 = """
def bind2(side, tgt):
    mw = MW(pd, e.IBV_MW_TYPE_2)
    wr = SendWR(opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
    wr.set_bind_wr(mw, MWBindInfo(tgt, tgt.buf, 4096, e.IBV_ACCESS_REMOTE_WRITE))
    side.qp.post_send(wr)
    assert poll(side.cq)[0].status == 0
    return mw, wr.rkey
"""


def test_local_invalidate(env):
    r = pyverbs(RC + BIND2 + """
a, b = pair()
tgt = MR(pd, 4096, RW | e.IBV_ACCESS_MW_BIND)
src = MR(pd, 4096, RW)
mw, rkey = bind2(b, tgt)
inv = SendWR(opcode=e.IBV_WR_LOCAL_INV, send_flags=e.IBV_SEND_SIGNALED)
inv.imm_data = rkey   # The union with invalidate_rkey
b.qp.post_send(inv)
wc = poll(b.cq)[0]
res = {"inv": [wc.status, wc.opcode, e.IBV_WC_LOCAL_INV]}
res["after"] = write(a, src, tgt.buf, rkey, 8).status
c, d = pair()
inv = SendWR(opcode=e.IBV_WR_LOCAL_INV, send_flags=e.IBV_SEND_SIGNALED)
inv.imm_data = tgt.rkey   # A reg_mr key cannot be invalidated
d.qp.post_send(inv)
res["mr"] = poll(d.cq)[0].status
res["codes"] = [e.IBV_WC_REM_ACCESS_ERR, e.IBV_WC_LOC_QP_OP_ERR]
out(res)
""", env)
    assert r["inv"][0] == 0 and r["inv"][1] == r["inv"][2]
    assert r["after"] == r["codes"][0]
    assert r["mr"] == r["codes"][1]


def test_send_with_invalidate(env):
    r = pyverbs(RC + BIND2 + """
a, b = pair()
tgt = MR(pd, 4096, RW | e.IBV_ACCESS_MW_BIND)
src = MR(pd, 4096, RW)
rbuf = MR(pd, 4096, RW)
mw, rkey = bind2(b, tgt)
recv(b, rbuf, 64)
wc = send(a, src, 16, opcode=e.IBV_WR_SEND_WITH_INV, imm=rkey)
rc = poll(b.cq)[0]
res = {"send": wc.status, "recv": [rc.status, rc.opcode, rc.wc_flags & e.IBV_WC_WITH_INV,
                                    rc.imm_data, rkey]}
a2, b2 = pair()   # the responder moved nothing to error: a fresh pair for the check
res["after"] = write(a, src, tgt.buf, rkey, 8).status
c, d = pair()
recv(d, rbuf, 64)
res["bogus"] = send(c, src, 16, opcode=e.IBV_WR_SEND_WITH_INV, imm=0x1234500).status
res["bogus_recv"] = poll(d.cq)[0].status
res["codes"] = [e.IBV_WC_RECV, e.IBV_WC_REM_ACCESS_ERR, e.IBV_WC_REM_OP_ERR,
                e.IBV_WC_LOC_PROT_ERR]
out(res)
""", env)
    st, op, flag, imm, rkey = r["recv"]
    assert r["send"] == 0 and st == 0 and op == r["codes"][0] and flag
    swapped = int.from_bytes(rkey.to_bytes(4, "little"), "big")
    assert imm in (rkey, swapped), (hex(imm), hex(rkey))
    assert r["after"] == r["codes"][1]
    assert r["bogus"] == r["codes"][2] and r["bogus_recv"] == r["codes"][3]


def test_fastreg_fd_example(build_dir, env):
    exe = build_dir / "docs" / "examples" / "fastreg_fd"
    p = svtest.run([str(exe)], env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "server: fd MR, fast-register, SEND_WITH_INV, LOCAL_INV: ok" in p.stdout
