# SPDX-License-Identifier: MIT
"""ibv_create_qp_ex with send_ops_flags and the ibv_wr_* API (pyverbs QPEx).

Each scenario runs in a child python on its own fabric (see conftest.py);
two QPs of the child are connected to each other and every op moves data
that the test checks, with the completions each side gets.
"""
import errno
import socket

import pytest

import exverbs
import svtest

WC_SEND, WC_RDMA_WRITE, WC_RDMA_READ, WC_COMP_SWAP, WC_FETCH_ADD = 0, 1, 2, 3, 4
WC_RECV, WC_RECV_RDMA_WITH_IMM = 128, 129
WITH_IMM = 2


def imm(v):
    """What pyverbs reads back for an immediate it was given: its wr_*_imm
    convert to network order, read_imm_data returns the __be32 as it is."""
    return socket.ntohl(v)


def run(code, env):
    return svtest.pyverbs(exverbs.SETUP + code, env)


def brief(cs, *keys):
    return [tuple(c[k] for k in ("wr_id", "status", "opcode") + keys) for c in cs]


def test_send_and_send_imm(env):
    r = run("""
a, b, ca, cb = pair()
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
ma.write(b"hello, wr api", 13)
recv(b, mb, wr_id=100)
recv(b, mb, wr_id=101, offset=2048, length=2048)
a.wr_start()
a.wr_id = 1
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_send()
a.wr_set_sge(SGE(ma.buf, 13, ma.lkey))
a.wr_id = 2
a.wr_send_imm(0x12345678)
a.wr_set_sge(SGE(ma.buf, 5, ma.lkey))
a.wr_complete()
out({"send": poll(ca, 2), "recv": poll(cb, 2), "data": mb.read(13, 0).decode(),
     "data2": mb.read(5, 2048).decode(), "qpn": [a.qp_num, b.qp_num]})
""", env)
    qa, qb = r["qpn"]
    assert brief(r["send"], "byte_len") == [(1, 0, WC_SEND, 13), (2, 0, WC_SEND, 5)]
    rv = r["recv"]
    assert brief(rv, "byte_len") == [(100, 0, WC_RECV, 13), (101, 0, WC_RECV, 5)]
    assert rv[1]["flags"] & WITH_IMM and not rv[0]["flags"] & WITH_IMM
    assert rv[1]["imm"] == imm(0x12345678)
    assert all(c["qp_num"] == qb and c["src_qp"] == qa for c in rv)
    assert r["data"] == "hello, wr api" and r["data2"] == "hello"


def test_rdma_write_write_imm_and_read(env):
    r = run("""
a, b, ca, cb = pair()
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
ma.write(b"written by a", 12)
mb.write(b"b's own bytes", 13, 1024)
recv(b, mb, wr_id=200, offset=3072, length=16)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_id = 10
a.wr_rdma_write(mb.rkey, mb.buf)
a.wr_set_sge(SGE(ma.buf, 12, ma.lkey))
a.wr_id = 11
a.wr_rdma_write_imm(mb.rkey, mb.buf + 100, 0xabcdef01)
a.wr_set_sge(SGE(ma.buf, 7, ma.lkey))
a.wr_id = 12
a.wr_rdma_read(mb.rkey, mb.buf + 1024)
a.wr_set_sge(SGE(ma.buf + 2048, 13, ma.lkey))
a.wr_complete()
out({"send": poll(ca, 3), "recv": poll(cb, 1), "w": mb.read(12, 0).decode(),
     "wi": mb.read(7, 100).decode(), "r": ma.read(13, 2048).decode()})
""", env)
    assert brief(r["send"], "byte_len") == [(10, 0, WC_RDMA_WRITE, 12), (11, 0, WC_RDMA_WRITE, 7),
                                            (12, 0, WC_RDMA_READ, 13)]
    rv = r["recv"][0]
    assert (rv["wr_id"], rv["status"], rv["opcode"], rv["byte_len"]) == \
        (200, 0, WC_RECV_RDMA_WITH_IMM, 7)
    assert rv["imm"] == imm(0xabcdef01) and rv["flags"] & WITH_IMM
    assert r["w"] == "written by a" and r["wi"] == "written" and r["r"] == "b's own bytes"


def test_atomics(env):
    r = run("""
import struct
a, b, ca, cb = pair()
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
mb.write(struct.pack("<QQ", 40, 7), 16)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_id = 20
a.wr_atomic_fetch_add(mb.rkey, mb.buf, 2)
a.wr_set_sge(SGE(ma.buf, 8, ma.lkey))
a.wr_id = 21
a.wr_atomic_cmp_swp(mb.rkey, mb.buf + 8, 7, 99)
a.wr_set_sge(SGE(ma.buf + 8, 8, ma.lkey))
a.wr_id = 22
a.wr_atomic_cmp_swp(mb.rkey, mb.buf + 8, 7, 1234)
a.wr_set_sge(SGE(ma.buf + 16, 8, ma.lkey))
a.wr_complete()
out({"send": poll(ca, 3), "remote": struct.unpack("<QQ", mb.read(16, 0)),
     "local": struct.unpack("<QQQ", ma.read(24, 0))})
""", env)
    assert brief(r["send"], "byte_len") == [(20, 0, WC_FETCH_ADD, 8), (21, 0, WC_COMP_SWAP, 8),
                                            (22, 0, WC_COMP_SWAP, 8)]
    assert r["remote"] == [42, 99]
    assert r["local"] == [40, 7, 99]  # The old values: the second swap failed


def test_sge_list_and_inline(env):
    r = run("""
from pyverbs.wr import SGE
a, b, ca, cb = pair()
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
ma.write(b"abcdefghijklmnop", 16)
for i in range(3):
    recv(b, mb, wr_id=300 + i, offset=1024 * i, length=1024)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_id = 30
a.wr_send()
a.wr_set_sge_list(3, [SGE(ma.buf + 12, 4, ma.lkey), SGE(ma.buf, 3, ma.lkey),
                      SGE(ma.buf + 6, 2, ma.lkey)])
# Inline data is copied when set: change the buffer before completing.
buf = bytearray(b"inline!")
import ctypes
cbuf = (ctypes.c_char * 7).from_buffer(buf)
a.wr_id = 31
a.wr_send()
a.wr_set_inline_data(ctypes.addressof(cbuf), 7)
buf[0:7] = b"XXXXXXX"
a.wr_id = 32
a.wr_send_imm(5)
from pyverbs.qp import DataBuffer
bufs = [bytearray(x) for x in (b"one-", b"two-", b"three")]
cbufs = [(ctypes.c_char * len(x)).from_buffer(x) for x in bufs]
a.wr_set_inline_data_list(3, [DataBuffer(ctypes.addressof(c), len(c)) for c in cbufs])
a.wr_complete()
out({"send": poll(ca, 3), "recv": poll(cb, 3), "d0": mb.read(9, 0).decode(),
     "d1": mb.read(7, 1024).decode(), "d2": mb.read(13, 2048).decode()})
""", env)
    assert brief(r["send"], "byte_len") == [(30, 0, WC_SEND, 9), (31, 0, WC_SEND, 7),
                                            (32, 0, WC_SEND, 13)]
    assert [c["byte_len"] for c in r["recv"]] == [9, 7, 13]
    assert r["d0"] == "mnopabcgh" and r["d1"] == "inline!" and r["d2"] == "one-two-three"


def test_unsignaled_wrs_do_not_complete(env):
    r = run("""
a, b, ca, cb = pair()
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
a.wr_start()
for i in range(8):
    a.wr_id = 40 + i
    a.wr_flags = e.IBV_SEND_SIGNALED if i in (3, 7) else 0
    a.wr_rdma_write(mb.rkey, mb.buf + i)
    a.wr_set_sge(SGE(ma.buf, 1, ma.lkey))
a.wr_complete()
got = poll(ca, 2)
more = not empty(ca)
# The time-free check that the unsignaled six never complete: a signaled
# marker after them is the next completion.
a.wr_start()
a.wr_id = 48
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_rdma_write(mb.rkey, mb.buf + 8)
a.wr_set_sge(SGE(ma.buf, 1, ma.lkey))
a.wr_complete()
out({"send": [c["wr_id"] for c in got], "more": more,
     "marker": [c["wr_id"] for c in poll(ca, 1)]})
""", env)
    assert r == {"send": [43, 47], "more": False, "marker": [48]}


def test_uc_send_and_write(env):
    r = run("""
ops = e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_RDMA_WRITE | e.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
a, b, ca, cb = pair(e.IBV_QPT_UC, ops)
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
ma.write(b"uc data", 7)
recv(b, mb, wr_id=500, offset=2048, length=64)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_id = 50
a.wr_rdma_write(mb.rkey, mb.buf)
a.wr_set_sge(SGE(ma.buf, 7, ma.lkey))
a.wr_id = 51
a.wr_send()
a.wr_set_sge(SGE(ma.buf, 2, ma.lkey))
a.wr_complete()
read_err = errno_of(qp_ex, ca, e.IBV_QPT_UC, e.IBV_QP_EX_WITH_RDMA_READ)
out({"send": poll(ca, 2), "recv": poll(cb, 1), "w": mb.read(7, 0).decode(),
     "s": mb.read(2, 2048).decode(), "read_err": read_err})
""", env)
    assert brief(r["send"]) == [(50, 0, WC_RDMA_WRITE), (51, 0, WC_SEND)]
    assert brief(r["recv"], "byte_len") == [(500, 0, WC_RECV, 2)]
    assert r["w"] == "uc data" and r["s"] == "uc"
    assert r["read_err"] == errno.EOPNOTSUPP


def test_ud_send_with_set_ud_addr(env):
    r = run("""
ops = e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_SEND_WITH_IMM
ca, cb = cq_ex(), cq_ex()
a, b = qp_ex(ca, e.IBV_QPT_UD, ops), qp_ex(cb, e.IBV_QPT_UD, ops)
to_rts(a)
to_rts(b)
ah = AH(pd, attr=AHAttr(dlid=LID, port_num=1, sl=2))
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
ma.write(b"datagram", 8)
recv(b, mb, wr_id=600, length=40 + 64)
recv(b, mb, wr_id=601, offset=1024, length=40 + 64)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_id = 60
a.wr_send()
a.wr_set_ud_addr(ah, b.qp_num, 0x1234)
a.wr_set_sge(SGE(ma.buf, 8, ma.lkey))
a.wr_id = 61
a.wr_send_imm(77)
a.wr_set_sge(SGE(ma.buf, 4, ma.lkey))
a.wr_set_ud_addr(ah, b.qp_num, 0x1234)
a.wr_complete()
# A UD WR without an address is misuse; so is an RDMA op on a UD QP.
a.wr_start()
a.wr_send()
a.wr_set_sge(SGE(ma.buf, 4, ma.lkey))
noaddr = errno_of(a.wr_complete)
rdma = errno_of(qp_ex, ca, e.IBV_QPT_UD, e.IBV_QP_EX_WITH_RDMA_WRITE)
out({"send": poll(ca, 2), "recv": poll(cb, 2), "d": mb.read(8, 40).decode(),
     "noaddr": noaddr, "rdma": rdma, "qpn": [a.qp_num, b.qp_num]})
""", env)
    assert brief(r["send"]) == [(60, 0, WC_SEND), (61, 0, WC_SEND)]
    rv = r["recv"]
    assert brief(rv, "byte_len") == [(600, 0, WC_RECV, 48), (601, 0, WC_RECV, 44)]
    assert all(c["src_qp"] == r["qpn"][0] and c["sl"] == 2 for c in rv)
    assert rv[1]["imm"] == imm(77)
    assert r["d"] == "datagram"
    assert r["noaddr"] == errno.EINVAL and r["rdma"] == errno.EOPNOTSUPP


MISUSE = {
    # name: (code after a good WR, between wr_start and wr_complete, errno)
    "op_not_in_send_ops_flags": ("a.wr_rdma_read(mb.rkey, mb.buf)\n"
                                 "a.wr_set_sge(SGE(ma.buf, 4, ma.lkey))", errno.EINVAL),
    "too_many_sges": ("a.wr_send()\na.wr_set_sge_list(3, [SGE(ma.buf, 1, ma.lkey)] * 3)",
                      errno.ENOMEM),
    # 64 bytes of inline data asked for: the slot holds 64 (sq_create), not 257
    "inline_too_long": ("a.wr_send()\na.wr_set_inline_data(ma.buf, 257)", errno.ENOMEM),
    "inline_on_read": ("a.wr_rdma_write(mb.rkey, mb.buf)\na.wr_set_ud_addr(ah, 1, 1)",
                       errno.EINVAL),
    "too_many_wrs": ("for i in range(9):\n    a.wr_send()\n    "
                     "a.wr_set_sge(SGE(ma.buf, 1, ma.lkey))", errno.ENOMEM),
    "xrc_srqn_on_rc": ("a.wr_send()\na.wr_set_xrc_srqn(5)", errno.EINVAL),
}


@pytest.mark.parametrize("case", list(MISUSE))
def test_misuse_posts_nothing_and_qp_stays_usable(env, case):
    body, want = MISUSE[case]
    r = run(f"""
ops = e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_RDMA_WRITE
a, b, ca, cb = pair(ops=ops, max_send_wr=8, max_sge=2, inline=64)
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
ah = AH(pd, attr=AHAttr(dlid=LID, port_num=1))
recv(b, mb, wr_id=700)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_id = 1
a.wr_send()  # A good WR first: it must not be posted either
a.wr_set_sge(SGE(ma.buf, 4, ma.lkey))
{body}
err = errno_of(a.wr_complete)
# Nothing now; and the time-free check: the next completions on both sides
# are those of the good SEND below (poll(ca, 1), poll(cb, 1)).
nothing = empty(ca) and empty(cb)
# The QP still works.
ma.write(b"after", 5)
a.wr_start()
a.wr_id = 2
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_send()
a.wr_set_sge(SGE(ma.buf, 5, ma.lkey))
a.wr_complete()
out({{"err": err, "nothing": nothing, "send": poll(ca, 1), "recv": poll(cb, 1),
      "d": mb.read(5, 0).decode()}})
""", env)
    assert r["err"] == want
    assert r["nothing"]
    assert brief(r["send"]) == [(2, 0, WC_SEND)]
    assert brief(r["recv"], "byte_len") == [(700, 0, WC_RECV, 5)]
    assert r["d"] == "after"


def test_complete_without_start_abort_and_double_start(env):
    r = run("""
a, b, ca, cb = pair(ops=e.IBV_QP_EX_WITH_SEND)
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
recv(b, mb, wr_id=800)
no_start = errno_of(a.wr_complete)
a.wr_start()
a.wr_set_sge(SGE(ma.buf, 4, ma.lkey))  # A setter before any op
a.wr_send()
a.wr_set_sge(SGE(ma.buf, 4, ma.lkey))
setter_first = errno_of(a.wr_complete)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_send()
a.wr_set_sge(SGE(ma.buf, 4, ma.lkey))
a.wr_abort()
after_abort = errno_of(a.wr_complete)
a.wr_start()
a.wr_start()
double = errno_of(a.wr_complete)
# Nothing now; the next completion is the good SEND's (poll(ca, 1) below).
nothing = empty(ca) and empty(cb)
a.wr_start()
a.wr_id = 9
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_send()
a.wr_set_sge(SGE(ma.buf, 4, ma.lkey))
ok = errno_of(a.wr_complete)
out({"no_start": no_start, "setter_first": setter_first, "after_abort": after_abort,
     "double": double,
     "nothing": nothing, "ok": ok, "send": poll(ca, 1)})
""", env)
    assert r["no_start"] == errno.EINVAL and r["after_abort"] == errno.EINVAL
    assert r["setter_first"] == errno.EINVAL
    assert r["double"] == errno.EINVAL
    assert r["nothing"] and r["ok"] == 0
    assert brief(r["send"]) == [(9, 0, WC_SEND)]


def test_wr_complete_before_rts_fails_whole_batch(env):
    r = run("""
cq = cq_ex()
a = qp_ex(cq, ops=e.IBV_QP_EX_WITH_SEND)
mr = MR(pd, 4096, ACC)
a.wr_start()
a.wr_send()
a.wr_set_sge(SGE(mr.buf, 4, mr.lkey))
out({"err": errno_of(a.wr_complete), "empty": empty(cq)})
""", env)
    assert r == {"err": errno.EINVAL, "empty": True}


@pytest.mark.parametrize("flag", ["IBV_QP_EX_WITH_TSO", "1 << 40"])
def test_unsupported_send_ops_flags_refused(env, flag):
    expr = flag if flag.startswith("1") else f"e.{flag}"
    r = run(f"""
cq = cq_ex()
out({{"err": errno_of(qp_ex, cq, e.IBV_QPT_RC, e.IBV_QP_EX_WITH_SEND | {expr})}})
""", env)
    assert r["err"] == errno.EOPNOTSUPP


def test_atomic_write_offered_on_rc_only(env):
    """Atomic write (IBTA 1.5) is an RC/XRC operation: offered there, refused
    on UD.  Its traffic is checked by rdma-core's test_qp_ex_rc_atomic_write.
    The device says so: IB_UVERBS_DEVICE_ATOMIC_WRITE (bit 40) in
    device_cap_flags_ex (a helper's probe found it worked unadvertised)."""
    r = run("""
cq = cq_ex()
out({"rc": errno_of(qp_ex, cq, e.IBV_QPT_RC, e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_ATOMIC_WRITE),
     "ud": errno_of(qp_ex, cq, e.IBV_QPT_UD, e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_ATOMIC_WRITE),
     "cap": ctx.query_device_ex().device_cap_flags_ex})
""", env)
    assert r["rc"] == 0, r
    assert r["ud"] == errno.EOPNOTSUPP, r
    assert r["cap"] & (1 << 40), r


def test_bind_mw_send_inv_and_local_inv(env):
    r = run("""
from pyverbs.mr import MW, MWBindInfo
ops = RC_OPS | e.IBV_QP_EX_WITH_BIND_MW | e.IBV_QP_EX_WITH_LOCAL_INV | e.IBV_QP_EX_WITH_SEND_WITH_INV
a, b, ca, cb = pair(ops=ops)
ma = MR(pd, 4096, ACC)
mb = MR(pd, 4096, ACC | e.IBV_ACCESS_MW_BIND)
mw = MW(pd, e.IBV_MW_TYPE_2)
key = (mw.rkey & ~0xff) | 0x42
info = MWBindInfo(mb, mb.buf + 1024, 64, e.IBV_ACCESS_REMOTE_WRITE)
# b binds a window on its memory; a writes through it, then invalidates it.
b.wr_start()
b.wr_id = 1
b.wr_flags = e.IBV_SEND_SIGNALED
b.wr_bind_mw(mw, key, info)
b.wr_complete()
bind = poll(cb, 1)
ma.write(b"through the window", 18)
recv(b, mb, wr_id=2, offset=0, length=64)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_id = 3
a.wr_rdma_write(key, mb.buf + 1024)
a.wr_set_sge(SGE(ma.buf, 18, ma.lkey))
a.wr_id = 4
a.wr_send_inv(key)
a.wr_set_sge(SGE(ma.buf, 4, ma.lkey))
a.wr_complete()
sent = poll(ca, 2)
got = poll(cb, 1)
# Bound again under a new key, then invalidated locally.
key2 = (key & ~0xff) | 0x43
b.wr_start()
b.wr_flags = e.IBV_SEND_SIGNALED
b.wr_id = 5
b.wr_bind_mw(mw, key2, info)
b.wr_id = 6
b.wr_local_inv(key2)
b.wr_complete()
local = poll(cb, 2)
# A type 1 window is not bound through the wr API.
mw1 = MW(pd, e.IBV_MW_TYPE_1)
b.wr_start()
b.wr_bind_mw(mw1, mw1.rkey, info)
type1 = errno_of(b.wr_complete)
out({"bind": bind, "sent": sent, "got": got, "local": local, "type1": type1,
     "d": mb.read(18, 1024).decode(), "key": key})
""", env)
    assert brief(r["bind"]) == [(1, 0, 5)]  # IBV_WC_BIND_MW
    assert brief(r["sent"]) == [(3, 0, WC_RDMA_WRITE), (4, 0, WC_SEND)]
    g = r["got"][0]
    assert (g["wr_id"], g["status"], g["opcode"], g["byte_len"]) == (2, 0, WC_RECV, 4)
    assert g["flags"] & 8  # IBV_WC_WITH_INV
    assert brief(r["local"]) == [(5, 0, 5), (6, 0, 6)]  # BIND_MW, LOCAL_INV
    assert r["type1"] == errno.EINVAL
    assert r["d"] == "through the window"


def test_flush_after_error_state(env):
    r = run("""
a, b, ca, cb = pair(ops=e.IBV_QP_EX_WITH_SEND)
mr = MR(pd, 4096, ACC)
at = QPAttr(qp_state=e.IBV_QPS_ERR)
a.modify(at, e.IBV_QP_STATE)
a.wr_start()
a.wr_id = 77
a.wr_flags = 0
a.wr_send()
a.wr_set_sge(SGE(mr.buf, 4, mr.lkey))
err = errno_of(a.wr_complete)
out({"err": err, "send": poll(ca, 1)})
""", env)
    assert r["err"] == 0
    assert brief(r["send"]) == [(77, 5, WC_SEND)]  # IBV_WC_WR_FLUSH_ERR


def test_two_processes(env):
    """The wr API between two processes: a child sends, another receives."""
    import json
    import subprocess
    server = exverbs.SETUP + r"""
import sys
cq = cq_ex()
q = qp_ex(cq, ops=e.IBV_QP_EX_WITH_SEND)
mr = MR(pd, 4096, ACC)
print(json.dumps({"qpn": q.qp_num}), flush=True)
peer = json.loads(sys.stdin.readline())["qpn"]
to_rts(q, peer)
recv(q, mr, wr_id=900)
print(json.dumps({"ready": 1}), flush=True)
c = poll(cq, 1, timeout=15)
out({"recv": c, "d": mr.read(c[0]["byte_len"], 0).decode()})
"""
    client = exverbs.SETUP + r"""
import sys
cq = cq_ex()
q = qp_ex(cq, ops=e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_RDMA_WRITE)
mr = MR(pd, 4096, ACC)
mr.write(b"across processes", 16)
print(json.dumps({"qpn": q.qp_num}), flush=True)
peer = json.loads(sys.stdin.readline())["qpn"]
to_rts(q, peer)
sys.stdin.readline()
q.wr_start()
q.wr_id = 5
q.wr_flags = e.IBV_SEND_SIGNALED
q.wr_send()
q.wr_set_sge(SGE(mr.buf, 16, mr.lkey))
q.wr_complete()
out({"send": poll(cq, 1)})
"""
    procs = [subprocess.Popen([svtest.PYTHON, "-c", svtest.PRELUDE + code], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for code in (server, client)]
    def line(p):
        text = p.stdout.readline()
        if not text:
            p.kill()
            raise AssertionError(f"child failed: {p.stderr.read()}")
        return json.loads(text)

    try:
        s, c = procs
        sq = line(s)["qpn"]
        cqn = line(c)["qpn"]
        s.stdin.write(json.dumps({"qpn": cqn}) + "\n")
        s.stdin.flush()
        assert line(s)["ready"]
        c.stdin.write(json.dumps({"qpn": sq}) + "\n" + "go\n")
        c.stdin.flush()
        cout, cerr = c.communicate(timeout=svtest.TIMEOUT)
        sout, serr = s.communicate(timeout=svtest.TIMEOUT)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert c.returncode == 0, cerr
    assert s.returncode == 0, serr
    cr = json.loads(cout.splitlines()[-1])
    sr = json.loads(sout.splitlines()[-1])
    assert brief(cr["send"], "byte_len") == [(5, 0, WC_SEND, 16)]
    assert brief(sr["recv"], "byte_len") == [(900, 0, WC_RECV, 16)]
    assert sr["recv"][0]["src_qp"] == cqn and sr["d"] == "across processes"


def test_atomic_write_through_post_send(env):
    """IBV_WR_ATOMIC_WRITE posted with ibv_post_send (not ibv_wr_*): wr.rdma
    names the target and one 8-byte SGE the value.  It once ran with the
    target and value of whatever the WR before it left behind: the RDMA
    WRITE before it in the chain had its own target overwritten and the
    atomic's target stayed zero, with a success completion."""
    r = run("""
from pyverbs.wr import SendWR
from pyverbs.pyverbs_error import PyverbsRDMAError
a, b, ca, cb = pair()
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
ma.write(bytes(range(16)), 16)
ma.write(bytes.fromhex("8877665544332211"), 8, 512)
w1 = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(ma.buf, 16, ma.lkey)],
            send_flags=e.IBV_SEND_SIGNALED)
w1.set_wr_rdma(mb.rkey, mb.buf)
w2 = SendWR(wr_id=2, opcode=e.IBV_WR_ATOMIC_WRITE, num_sge=1,
            sg=[SGE(ma.buf + 512, 8, ma.lkey)], send_flags=e.IBV_SEND_SIGNALED)
w2.set_wr_rdma(mb.rkey, mb.buf + 1024)
w1.next_wr = w2
a.post_send(w1)
cs = poll(ca, 2)
bad = SendWR(wr_id=3, opcode=e.IBV_WR_ATOMIC_WRITE, num_sge=1,
             sg=[SGE(ma.buf + 512, 4, ma.lkey)], send_flags=e.IBV_SEND_SIGNALED)
bad.set_wr_rdma(mb.rkey, mb.buf + 2048)
try:
    a.post_send(bad)
    short = 0
except PyverbsRDMAError as x:
    short = x.error_code
out({"cs": [(c["wr_id"], c["status"]) for c in cs], "head": mb.read(16, 0).hex(),
     "word": mb.read(8, 1024).hex(), "short": short, "untouched": mb.read(8, 2048).hex()})
""", env)
    assert r["cs"] == [[1, 0], [2, 0]], r
    assert r["head"] == bytes(range(16)).hex()
    assert r["word"] == "8877665544332211"
    assert r["short"] == errno.EINVAL and r["untouched"] == "00" * 8
