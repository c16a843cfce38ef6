# SPDX-License-Identifier: MIT
"""Traffic driven by Debian's python3-pyverbs through our library.  Each
scenario runs in a child /usr/bin/python3 (svtest.pyverbs) on a fabric of
its own, with a timeout; the child checks the data and reports facts that
the test then asserts."""
import pytest

from svtest import pyverbs

# Two QPs in one process connected to each other, with helpers.
LIB = r"""
import struct, time
from pyverbs.pd import PD
from pyverbs.cq import CQ
from pyverbs.qp import QP, QPInitAttr, QPCap, QPAttr
from pyverbs.mr import MR
from pyverbs.wr import SGE, SendWR, RecvWR
from pyverbs.addr import AH, AHAttr, GlobalRoute

ALL = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ |
       e.IBV_ACCESS_REMOTE_ATOMIC)

class Side:
    def __init__(self, dev, qpt=e.IBV_QPT_RC, access=ALL, inline=0, sig_all=True):
        self.ctx = d.Context(name=dev)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 128)
        self.lid = self.ctx.query_port(1).lid
        self.gid = self.ctx.query_gid(1, 0)
        cap = QPCap(max_send_wr=32, max_recv_wr=32, max_send_sge=4, max_recv_sge=4,
                    max_inline_data=inline)
        self.qp = QP(self.pd, QPInitAttr(qp_type=qpt, scq=self.cq, rcq=self.cq, cap=cap,
                                         sq_sig_all=sig_all))
        self.mr = MR(self.pd, 65536, access)
        self.access = access

def connect(a, b, rnr_retry=7, min_rnr_timer=1):
    for x, y in ((a, b), (b, a)):
        at = QPAttr()
        at.qp_state = e.IBV_QPS_INIT
        at.pkey_index = 0
        at.port_num = 1
        at.qp_access_flags = x.access
        x.qp.modify(at, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT |
                    e.IBV_QP_ACCESS_FLAGS)
    for x, y in ((a, b), (b, a)):
        at = QPAttr()
        at.qp_state = e.IBV_QPS_RTR
        at.path_mtu = e.IBV_MTU_1024
        at.dest_qp_num = y.qp.qp_num
        at.rq_psn = 0
        at.max_dest_rd_atomic = 4
        at.min_rnr_timer = min_rnr_timer
        at.ah_attr = AHAttr(dlid=y.lid, port_num=1)
        x.qp.modify(at, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN |
                    e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
        at = QPAttr()
        at.qp_state = e.IBV_QPS_RTS
        at.sq_psn = 0
        at.timeout = 14
        at.retry_cnt = 3
        at.rnr_retry = rnr_retry
        at.max_rd_atomic = 4
        x.qp.modify(at, e.IBV_QP_STATE | e.IBV_QP_SQ_PSN | e.IBV_QP_TIMEOUT |
                    e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_MAX_QP_RD_ATOMIC)

def poll(cq, secs=5.0):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        n, wcs = cq.poll(1)
        if n:
            return wcs[0]
        time.sleep(0.0002)
    raise AssertionError("no completion")

def empty(cq, secs=0.05):
    time.sleep(secs)
    n, wcs = cq.poll(1)
    return n == 0

def wcd(wc):
    return {"wr_id": wc.wr_id, "status": wc.status, "opcode": wc.opcode,
            "byte_len": wc.byte_len, "imm": wc.imm_data, "src_qp": wc.src_qp,
            "slid": wc.slid, "flags": wc.wc_flags, "qp_num": wc.qp_num}

def send_wr(wr_id, op, sges, flags=e.IBV_SEND_SIGNALED, imm=0):
    return SendWR(wr_id=wr_id, opcode=op, num_sge=len(sges), sg=sges, send_flags=flags,
                  imm_data=imm)

def recv(side, wr_id, off, length):
    side.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(side.mr.buf + off, length,
                                                               side.mr.lkey)]))

def qstate(qp):
    at, _ = qp.query(e.IBV_QP_STATE)
    return at.qp_state
"""


def run(code, env, devs=("loop0", "loop0")):
    return pyverbs(LIB + f"\nDEV_A, DEV_B = {devs[0]!r}, {devs[1]!r}\n" + code, env, timeout=60)


RC_OPS = r"""
a = Side(DEV_A); b = Side(DEV_B)
connect(a, b)
r = {}
data = bytes((i * 7 + 3) & 255 for i in range(5000))
# SEND and SEND_WITH_IMM
a.mr.write(data, len(data), 0)
recv(b, 1, 0, 8192)
a.qp.post_send(send_wr(10, e.IBV_WR_SEND, [SGE(a.mr.buf, 5000, a.mr.lkey)]))
r["send"] = wcd(poll(a.cq)); r["recv"] = wcd(poll(b.cq))
r["send_ok"] = b.mr.read(5000, 0) == data
recv(b, 2, 0, 8192)
a.qp.post_send(send_wr(11, e.IBV_WR_SEND_WITH_IMM, [SGE(a.mr.buf, 100, a.mr.lkey)], imm=0x01020304))
r["send_imm"] = wcd(poll(a.cq)); r["recv_imm"] = wcd(poll(b.cq))
# RDMA WRITE
w = send_wr(12, e.IBV_WR_RDMA_WRITE, [SGE(a.mr.buf, 5000, a.mr.lkey)])
w.set_wr_rdma(b.mr.rkey, b.mr.buf + 10000)
a.qp.post_send(w)
r["write"] = wcd(poll(a.cq))
r["write_ok"] = b.mr.read(5000, 10000) == data
# No receive completion: nothing now, and (below) the next completion on
# b.cq is the WRITE_WITH_IMM's, for its receive 3 (a time-free check).
r["write_no_recv_cqe"] = empty(b.cq, 0)
# RDMA WRITE WITH IMM
recv(b, 3, 0, 16)
w = send_wr(13, e.IBV_WR_RDMA_WRITE_WITH_IMM, [SGE(a.mr.buf, 3000, a.mr.lkey)], imm=0x0a0b0c0d)
w.set_wr_rdma(b.mr.rkey, b.mr.buf + 20000)
a.qp.post_send(w)
r["write_imm"] = wcd(poll(a.cq)); r["recv_write_imm"] = wcd(poll(b.cq))
r["write_imm_ok"] = b.mr.read(3000, 20000) == data[:3000]
# RDMA READ
other = bytes((i * 13 + 1) & 255 for i in range(4000))
b.mr.write(other, 4000, 30000)
w = send_wr(14, e.IBV_WR_RDMA_READ, [SGE(a.mr.buf + 40000, 4000, a.mr.lkey)])
w.set_wr_rdma(b.mr.rkey, b.mr.buf + 30000)
a.qp.post_send(w)
r["read"] = wcd(poll(a.cq))
r["read_ok"] = a.mr.read(4000, 40000) == other
# CMP_AND_SWP (hit, then miss) and FETCH_AND_ADD
b.mr.write(struct.pack("<Q", 42), 8, 50000)
res = SGE(a.mr.buf + 60000, 8, a.mr.lkey)
w = send_wr(15, e.IBV_WR_ATOMIC_CMP_AND_SWP, [res])
w.set_wr_atomic(b.mr.rkey, b.mr.buf + 50000, 42, 1000)
a.qp.post_send(w)
r["cas"] = wcd(poll(a.cq))
r["cas_old"] = struct.unpack("<Q", a.mr.read(8, 60000))[0]
w = send_wr(16, e.IBV_WR_ATOMIC_CMP_AND_SWP, [res])
w.set_wr_atomic(b.mr.rkey, b.mr.buf + 50000, 42, 7)
a.qp.post_send(w)
poll(a.cq)
r["cas_miss_old"] = struct.unpack("<Q", a.mr.read(8, 60000))[0]
w = send_wr(17, e.IBV_WR_ATOMIC_FETCH_AND_ADD, [res])
w.set_wr_atomic(b.mr.rkey, b.mr.buf + 50000, 5, 0)
a.qp.post_send(w)
r["faa"] = wcd(poll(a.cq))
r["faa_old"] = struct.unpack("<Q", a.mr.read(8, 60000))[0]
r["final"] = struct.unpack("<Q", b.mr.read(8, 50000))[0]
r["qpn_a"], r["qpn_b"], r["lid_a"] = a.qp.qp_num, b.qp.qp_num, a.lid
out(r)
"""


@pytest.mark.parametrize("devs", [("loop0", "loop0"), ("loop0", "loop1")])
def test_rc_operations(env, devs):
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    r = run(RC_OPS, env, devs)
    S = 0  # IBV_WC_SUCCESS
    for k in ("send", "recv", "send_imm", "recv_imm", "write", "write_imm", "recv_write_imm",
              "read", "cas", "faa"):
        assert r[k]["status"] == S, (k, r[k])
    assert r["send"]["opcode"] == 0 and r["send"]["wr_id"] == 10  # IBV_WC_SEND
    assert r["recv"]["opcode"] == 128 and r["recv"]["byte_len"] == 5000  # IBV_WC_RECV
    assert r["recv"]["src_qp"] == r["qpn_a"] and r["recv"]["qp_num"] == r["qpn_b"]
    assert r["recv"]["slid"] == r["lid_a"]
    assert r["send_ok"] and r["write_ok"] and r["write_imm_ok"] and r["read_ok"]
    assert r["recv_imm"]["flags"] & 2 and r["recv_imm"]["imm"] == 0x01020304  # WITH_IMM
    assert r["recv_imm"]["byte_len"] == 100
    assert r["write"]["opcode"] == 1  # IBV_WC_RDMA_WRITE
    assert r["write_no_recv_cqe"]
    assert r["recv_write_imm"]["opcode"] == 129  # IBV_WC_RECV_RDMA_WITH_IMM
    assert r["recv_write_imm"]["wr_id"] == 3
    assert r["recv_write_imm"]["imm"] == 0x0a0b0c0d and r["recv_write_imm"]["byte_len"] == 3000
    assert r["read"]["opcode"] == 2  # IBV_WC_RDMA_READ
    assert r["cas"]["opcode"] == 3 and r["faa"]["opcode"] == 4
    assert r["cas_old"] == 42 and r["cas_miss_old"] == 1000 and r["faa_old"] == 1000
    assert r["final"] == 1005


UD = r"""
from pyverbs.qp import QPInitAttr
a = Side(DEV_A, e.IBV_QPT_UD); b = Side(DEV_B, e.IBV_QPT_UD)
for s in (a, b):
    at = QPAttr(); at.qp_state = e.IBV_QPS_INIT; at.port_num = 1; at.pkey_index = 0
    at.qkey = 0x1234
    s.qp.modify(at, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY)
    at = QPAttr(); at.qp_state = e.IBV_QPS_RTR
    s.qp.modify(at, e.IBV_QP_STATE)
    at = QPAttr(); at.qp_state = e.IBV_QPS_RTS; at.sq_psn = 0
    s.qp.modify(at, e.IBV_QP_STATE | e.IBV_QP_SQ_PSN)
data = bytes(range(256)) * 2
a.mr.write(data, 512, 0)
ah_lid = AH(a.pd, attr=AHAttr(dlid=b.lid, port_num=1, sl=2))
gr = GlobalRoute(dgid=b.gid, sgid_index=0)
gr.hop_limit = 9
ah_grh = AH(a.pd, attr=AHAttr(dlid=b.lid, port_num=1, is_global=1, gr=gr))
r = {"qpn_a": a.qp.qp_num, "lid_a": a.lid}
for name, ah in (("lid", ah_lid), ("grh", ah_grh)):
    b.mr.write(b"\xcc" * 1000, 1000, 0)
    recv(b, 1, 0, 1000)
    w = send_wr(2, e.IBV_WR_SEND, [SGE(a.mr.buf, 512, a.mr.lkey)])
    w.set_wr_ud(ah, b.qp.qp_num, 0x1234)
    a.qp.post_send(w)
    r[name + "_send"] = wcd(poll(a.cq))
    r[name] = wcd(poll(b.cq))
    r[name + "_data"] = b.mr.read(512, 40) == data
    r[name + "_after"] = b.mr.read(1, 552) == b"\xcc"
    r[name + "_grh"] = list(b.mr.read(40, 0))
# A wrong Q_Key is dropped
recv(b, 3, 0, 1000)
w = send_wr(4, e.IBV_WR_SEND, [SGE(a.mr.buf, 16, a.mr.lkey)])
w.set_wr_ud(ah_lid, b.qp.qp_num, 0x4321)
a.qp.post_send(w)
r["bad_qkey_send"] = wcd(poll(a.cq))
r["bad_qkey_dropped"] = empty(b.cq, 0)
# Larger than the port's MTU
mtu = 128 << a.ctx.query_port(1).active_mtu
w = send_wr(5, e.IBV_WR_SEND, [SGE(a.mr.buf, mtu + 1, a.mr.lkey)])
w.set_wr_ud(ah_lid, b.qp.qp_num, 0x1234)
a.qp.post_send(w)
r["too_long"] = wcd(poll(a.cq))
r["too_long_not_delivered"] = empty(b.cq, 0)
r["too_long_state"] = qstate(a.qp)
# A send error (a bad lkey) parks the UD QP in SQE (IB 10.3.1): a WR
# posted now completes flushed; SQE -> RTS resumes it.
w = send_wr(10, e.IBV_WR_SEND, [SGE(a.mr.buf, 16, a.mr.lkey ^ 0x5a5a00)])
w.set_wr_ud(ah_lid, b.qp.qp_num, 0x1234)
a.qp.post_send(w)
r["bad_lkey"] = wcd(poll(a.cq))
r["sqe_state"] = qstate(a.qp)
a.mr.write(b"MARKER-0123456789", 17, 4096)
w = send_wr(6, e.IBV_WR_SEND, [SGE(a.mr.buf + 4096, 17, a.mr.lkey)])
w.set_wr_ud(ah_lid, b.qp.qp_num, 0x1234)
a.qp.post_send(w)
r["sqe_flushed"] = wcd(poll(a.cq))
at = QPAttr(); at.qp_state = e.IBV_QPS_RTS; at.cur_qp_state = e.IBV_QPS_SQE
a.qp.modify(at, e.IBV_QP_STATE | e.IBV_QP_CUR_STATE)
r["resumed_state"] = qstate(a.qp)
# The time-free check that neither was delivered: a good SEND of marked
# bytes after them is what receive 3 (posted before both) gets.
a.qp.post_send(w)
r["marker_send"] = wcd(poll(a.cq))
r["marker"] = wcd(poll(b.cq))
r["marker_data"] = b.mr.read(17, 40) == b"MARKER-0123456789"
r["gid_b"] = b.gid.gid
r["gid_a"] = a.gid.gid
# A UD SEND to a connected RC QP's number is not that QP's to take: it is
# dropped, its receive stays posted and its buffer untouched; the RC peer's
# SEND after it is what that receive gets.
c = Side(DEV_B); dd = Side(DEV_B)
connect(c, dd)
c.mr.write(b"\xcc" * 64, 64, 0)
recv(c, 7, 0, 64)
a.mr.write(b"UD-INTRUDER", 11, 8192)
w = send_wr(8, e.IBV_WR_SEND, [SGE(a.mr.buf + 8192, 11, a.mr.lkey)])
w.set_wr_ud(ah_lid, c.qp.qp_num, 0x1234)
a.qp.post_send(w)
r["intruder_send"] = wcd(poll(a.cq))
r["intruder_dropped"] = empty(c.cq, 0) and c.mr.read(64, 0) == b"\xcc" * 64
dd.mr.write(b"RC-PEER", 7, 0)
dd.qp.post_send(send_wr(9, e.IBV_WR_SEND, [SGE(dd.mr.buf, 7, dd.mr.lkey)]))
r["rc_send"] = wcd(poll(dd.cq))
r["rc_recv"] = wcd(poll(c.cq))
r["rc_data"] = c.mr.read(8, 0) == b"RC-PEER\xcc"
r["rc_state"] = qstate(c.qp)
out(r)
"""


@pytest.mark.parametrize("devs", [("loop0", "loop0"), ("loop1", "loop0")])
def test_ud(env, devs):
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    r = run(UD, env, devs)
    for name, grh in (("lid", False), ("grh", True)):
        wc = r[name]
        assert r[name + "_send"]["status"] == 0
        assert wc["status"] == 0, wc
        assert wc["byte_len"] == 512 + 40
        assert wc["src_qp"] == r["qpn_a"] and wc["slid"] == r["lid_a"]
        assert bool(wc["flags"] & 1) == grh  # IBV_WC_GRH
        assert r[name + "_data"] and r[name + "_after"]
    g = bytes(r["grh_grh"])
    assert g[0] >> 4 == 6 and g[6] == 0x1b and g[7] == 9  # version, next header, hop limit
    # PayLen: BTH 12 + DETH 8 + 512 + ICRC 4 (IB 8.3.1), as on the wire
    assert int.from_bytes(g[4:6], "big") == 12 + 8 + 512 + 4
    assert g[8:24] == bytes.fromhex(r["gid_a"].replace(":", ""))
    assert g[24:40] == bytes.fromhex(r["gid_b"].replace(":", ""))
    assert r["bad_qkey_send"]["status"] == 0 and r["bad_qkey_dropped"]
    # Longer than the MTU: nothing sent, no error (IBTA C10-93.1.1, as rxe)
    assert r["too_long"]["status"] == 0 and r["too_long_state"] == 3  # RTS
    assert r["too_long_not_delivered"]
    assert r["bad_lkey"]["status"] == 4  # IBV_WC_LOC_PROT_ERR
    assert r["sqe_state"] == 5  # IBV_QPS_SQE
    assert (r["sqe_flushed"]["wr_id"], r["sqe_flushed"]["status"]) == (6, 5)  # WR_FLUSH_ERR
    assert r["resumed_state"] == 3  # RTS
    assert r["marker_send"]["status"] == 0
    assert (r["marker"]["wr_id"], r["marker"]["status"], r["marker"]["byte_len"]) == (3, 0, 17 + 40)
    assert r["marker_data"]
    # The UD SEND to an RC QP: sent (UD has no answers), not delivered.
    assert r["intruder_send"]["status"] == 0 and r["intruder_dropped"]
    assert r["rc_send"]["status"] == 0
    assert (r["rc_recv"]["wr_id"], r["rc_recv"]["status"], r["rc_recv"]["byte_len"]) == (7, 0, 7)
    assert r["rc_data"] and r["rc_state"] == 3  # RTS


ERRORS = r"""
r = {}
def pair(access_b=ALL, **kw):
    a = Side(DEV_A); b = Side(DEV_B, access=access_b)
    connect(a, b, **kw)
    return a, b
# bad rkey: REM_ACCESS_ERR, the next WR flushes, both QPs in ERR, B's receive flushed
a, b = pair()
recv(b, 90, 0, 100)
w = send_wr(1, e.IBV_WR_RDMA_WRITE, [SGE(a.mr.buf, 16, a.mr.lkey)])
w.set_wr_rdma(b.mr.rkey ^ 0x100, b.mr.buf)
a.qp.post_send(w)
a.qp.post_send(send_wr(2, e.IBV_WR_SEND, [SGE(a.mr.buf, 16, a.mr.lkey)]))
r["bad_rkey"] = [wcd(poll(a.cq)), wcd(poll(a.cq))]
r["bad_rkey_b"] = wcd(poll(b.cq))
r["bad_rkey_states"] = [qstate(a.qp), qstate(b.qp)]
# bad lkey
a, b = pair()
w = send_wr(3, e.IBV_WR_RDMA_WRITE, [SGE(a.mr.buf, 16, a.mr.lkey ^ 0x100)])
w.set_wr_rdma(b.mr.rkey, b.mr.buf)
a.qp.post_send(w)
r["bad_lkey"] = wcd(poll(a.cq))
# QP without remote read
a, b = pair(access_b=e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
w = send_wr(4, e.IBV_WR_RDMA_READ, [SGE(a.mr.buf, 16, a.mr.lkey)])
w.set_wr_rdma(b.mr.rkey, b.mr.buf)
a.qp.post_send(w)
r["no_read"] = wcd(poll(a.cq))
# out of bounds
a, b = pair()
w = send_wr(5, e.IBV_WR_RDMA_WRITE, [SGE(a.mr.buf, 16, a.mr.lkey)])
w.set_wr_rdma(b.mr.rkey, b.mr.buf + 65536 - 8)
a.qp.post_send(w)
r["oob"] = wcd(poll(a.cq))
# receive too small
a, b = pair()
recv(b, 91, 0, 10)
a.qp.post_send(send_wr(6, e.IBV_WR_SEND, [SGE(a.mr.buf, 11, a.mr.lkey)]))
r["small_req"] = wcd(poll(a.cq)); r["small_resp"] = wcd(poll(b.cq))
# RNR exhausted with rnr_retry 2
a, b = pair(rnr_retry=2)
a.qp.post_send(send_wr(7, e.IBV_WR_SEND, [SGE(a.mr.buf, 11, a.mr.lkey)]))
r["rnr"] = wcd(poll(a.cq))
r["rnr_state"] = qstate(a.qp)
out(r)
"""


def test_error_statuses(env):
    r = run(ERRORS, env)
    REM_ACCESS, FLUSH, LOC_PROT, LOC_LEN, REM_INV_REQ, RNR = 10, 5, 4, 1, 9, 13
    assert [w["status"] for w in r["bad_rkey"]] == [REM_ACCESS, FLUSH]
    assert [w["wr_id"] for w in r["bad_rkey"]] == [1, 2]
    assert r["bad_rkey_b"]["wr_id"] == 90 and r["bad_rkey_b"]["status"] == FLUSH
    assert r["bad_rkey_states"] == [6, 6]  # IBV_QPS_ERR
    assert r["bad_lkey"]["status"] == LOC_PROT
    assert r["no_read"]["status"] == REM_ACCESS
    assert r["oob"]["status"] == REM_ACCESS
    assert r["small_req"]["status"] == REM_INV_REQ
    assert r["small_resp"]["status"] == LOC_LEN and r["small_resp"]["wr_id"] == 91
    assert r["rnr"]["status"] == RNR and r["rnr_state"] == 6


POST_ERRORS = r"""
from pyverbs.pyverbs_error import PyverbsRDMAError
a = Side(DEV_A, inline=32); b = Side(DEV_B)
r = {}
w = send_wr(1, e.IBV_WR_SEND, [SGE(a.mr.buf, 8, a.mr.lkey)])
try:
    a.qp.post_send(w)
    r["reset"] = 0
except PyverbsRDMAError as x:
    r["reset"] = x.error_code
connect(a, b)
cap = a.qp.query(e.IBV_QP_CAP)[1].cap
r["max_inline"] = cap.max_inline_data
s = SGE(a.mr.buf, 8, a.mr.lkey)
keep = []
def chain(bad_kind):
    w1 = send_wr(11, e.IBV_WR_RDMA_WRITE, [s]); w1.set_wr_rdma(b.mr.rkey, b.mr.buf)
    if bad_kind == "sges":
        w2 = send_wr(12, e.IBV_WR_RDMA_WRITE, [s, s, s, s, s])
    elif bad_kind == "inline":
        w2 = send_wr(12, e.IBV_WR_RDMA_WRITE, [SGE(a.mr.buf, cap.max_inline_data + 1, 0)],
                     flags=e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE)
    else:
        w2 = send_wr(12, 99, [s])
    w2.set_wr_rdma(b.mr.rkey, b.mr.buf + 8)
    w3 = send_wr(13, e.IBV_WR_RDMA_WRITE, [s]); w3.set_wr_rdma(b.mr.rkey, b.mr.buf + 16)
    w1.next_wr = w2
    w2.next_wr = w3
    # pyverbs' next_wr links the C structs but holds no reference: keep w2
    # and w3 alive until post_send has read them.
    keep.extend([w2, w3])
    return w1
for kind in ("sges", "inline", "opcode"):
    bad = send_wr(0, e.IBV_WR_SEND, [s])
    try:
        a.qp.post_send(chain(kind), bad)
        r[kind] = [0, None]
    except PyverbsRDMAError as x:
        r[kind] = [x.error_code, bad.wr_id]
    # What completes before a signaled marker WRITE posted after the
    # refused chain: exactly what was posted (completions come in order, so
    # no wait for "nothing more" is needed).
    m = send_wr(99, e.IBV_WR_RDMA_WRITE, [s]); m.set_wr_rdma(b.mr.rkey, b.mr.buf + 32)
    a.qp.post_send(m)
    got = []
    while True:
        got.append(poll(a.cq).wr_id)
        if got[-1] == 99:
            break
    r[kind + "_done"] = got
out(r)
"""


def test_posting_errors(env):
    r = run(POST_ERRORS, env)
    assert r["reset"] == 22  # EINVAL in RESET
    assert r["max_inline"] >= 32
    for kind in ("sges", "inline", "opcode"):
        err, bad = r[kind]
        assert err != 0, kind
        assert bad == 12, (kind, bad)
        assert r[kind + "_done"] == [11, 99], (kind, r[kind + "_done"])


INLINE_EMPTY_SGE = r"""
a = Side(DEV_A, inline=64); b = Side(DEV_B)
connect(a, b)
a.mr.write(b"inline!!", 8, 0)
r = {}
# An inline SEND whose list holds an empty entry with a null address, as
# UCX's rc_verbs am_short posts for a message with no payload, and one of
# that entry alone: 8 bytes and 0 arrive.
recv(b, 1, 0, 64)
a.qp.post_send(send_wr(10, e.IBV_WR_SEND, [SGE(a.mr.buf, 8, a.mr.lkey), SGE(0, 0, 0)],
                       flags=e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE))
r["s1"] = wcd(poll(a.cq)); r["r1"] = wcd(poll(b.cq))
r["data"] = b.mr.read(8, 0).decode()
recv(b, 2, 64, 64)
a.qp.post_send(send_wr(11, e.IBV_WR_SEND, [SGE(0, 0, 0)],
                       flags=e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE))
r["s2"] = wcd(poll(a.cq)); r["r2"] = wcd(poll(b.cq))
out(r)
"""


def test_inline_send_empty_null_sge(env):
    """Regression (found by test_mpi under ASan+UBSan): the provider
    memcpy'd from each inline entry's address even when empty, a null
    source, which UBSan reports (memcpy's arguments are nonnull)."""
    r = run(INLINE_EMPTY_SGE, env)
    assert r["s1"]["status"] == 0 and r["s1"]["wr_id"] == 10
    assert r["r1"]["status"] == 0 and r["r1"]["byte_len"] == 8
    assert r["data"] == "inline!!"
    assert r["s2"]["status"] == 0 and r["s2"]["wr_id"] == 11
    assert r["r2"]["status"] == 0 and r["r2"]["byte_len"] == 0


QUERY = r"""
a = Side(DEV_A, inline=20, sig_all=False); b = Side(DEV_B)
connect(a, b, rnr_retry=5, min_rnr_timer=9)
at, ia = a.qp.query(0x1fffff)
r = {"state": at.qp_state, "dest": at.dest_qp_num, "mtu": at.path_mtu, "timeout": at.timeout,
     "retry": at.retry_cnt, "rnr": at.rnr_retry, "min_rnr": at.min_rnr_timer,
     "access": at.qp_access_flags, "port": at.port_num, "dlid": at.ah_attr.dlid,
     "max_rd": at.max_rd_atomic, "max_dest_rd": at.max_dest_rd_atomic,
     "inline": ia.cap.max_inline_data, "sig_all": ia.sq_sig_all, "b_qpn": b.qp.qp_num,
     "b_lid": b.lid}
bad = QPAttr(); bad.qp_state = e.IBV_QPS_RTS; bad.path_mtu = e.IBV_MTU_512
try:
    a.qp.modify(bad, e.IBV_QP_STATE | e.IBV_QP_PATH_MTU)
    r["bad_mask"] = 0
except PyverbsRDMAError as x:
    r["bad_mask"] = x.error_code
r["after"] = a.qp.query(e.IBV_QP_PATH_MTU)[0].path_mtu
out(r)
"""


def test_query_qp_and_bad_mask(env):
    r = run(QUERY, env)
    assert r["state"] == 3  # RTS
    assert r["dest"] == r["b_qpn"] and r["dlid"] == r["b_lid"] and r["port"] == 1
    assert r["mtu"] == 3 and r["timeout"] == 14 and r["retry"] == 3  # IBV_MTU_1024
    assert r["rnr"] == 5 and r["min_rnr"] == 9
    assert r["access"] == 15
    assert r["max_rd"] == 4 and r["max_dest_rd"] == 4
    assert r["inline"] >= 20 and r["sig_all"] == 0
    assert r["bad_mask"] == 22  # PATH_MTU cannot change in RTS->RTS
    assert r["after"] == 3


# A receive queue kept full, as perftest keeps it: every post follows the
# poll of a completion.  The poster's bound of the ring's cons comes from
# the receive completions it polled (loop_qp::rq_polled), so this checks
# that the bound lets exactly as many posts in as completions were polled,
# never one more, also across a RESET that drops WQEs nobody took (the
# RESET cleans the QP's completions out of the CQ, as mlx5 does: the count
# then lags cons, and the ring must still take exactly its depth, no more).
# Every message carries
# (round, index) and lands in the buffer of the WQE its completion names.
RQ_REFILL = r"""
from pyverbs.pyverbs_error import PyverbsRDMAError
a = Side(DEV_A); b = Side(DEV_B)
connect(a, b)
r = {"bad": [], "fill": [], "refill": []}
SLOT = 64
ids = iter(range(1, 1 << 30))
posted = {}  # wr_id -> buffer offset
def post_until_full():
    n = 0
    while n < 1000:
        i = next(ids)
        off = (i % 256) * SLOT
        try:
            recv(b, i, off, SLOT)
        except PyverbsRDMAError as x:
            return n, x.error_code
        posted[i] = off
        n += 1
    return n, 0
def send_round(rnd, count):
    for k in range(count):
        a.mr.write(struct.pack("<QQ", rnd, k), 16, 1024 + 16 * (k % 64))
        a.qp.post_send(send_wr(1000 * rnd + k, e.IBV_WR_SEND,
                               [SGE(a.mr.buf + 1024 + 16 * (k % 64), 16, a.mr.lkey)]))
        wc = poll(a.cq)
        if wc.status != e.IBV_WC_SUCCESS:
            r["bad"].append(["send", rnd, k, wc.status])
def take(rnd, count):
    for k in range(count):
        wc = poll(b.cq)
        off = posted.pop(wc.wr_id, None)
        if wc.status != e.IBV_WC_SUCCESS or off is None or wc.byte_len != 16:
            r["bad"].append(["recv", rnd, k, wc.status, wc.wr_id])
            continue
        got = struct.unpack("<QQ", b.mr.read(16, off))
        if got != (rnd, k):
            r["bad"].append(["data", rnd, k, got])
r["fill"].append(post_until_full())
depth = r["fill"][0][0]
for rnd in range(1, 7):
    # All of them, or part: the room is what was polled, no more.
    part = depth if rnd % 2 else depth // 2 + rnd
    send_round(rnd, part)
    take(rnd, part)
    r["refill"].append([part, post_until_full()])
    # The rest of the round's ring is still there, untaken: use it up.
    if part < depth:
        send_round(100 + rnd, depth - part)
        take(100 + rnd, depth - part)
        r["refill"].append([depth - part, post_until_full()])
# Messages taken but their completions not polled, then RESET: the WQEs
# nobody took are dropped (cons jumps to prod), the completions cleaned.
send_round(50, 5)
at = QPAttr(); at.qp_state = e.IBV_QPS_RESET
b.qp.modify(at, e.IBV_QP_STATE)
for x in (b,):
    at = QPAttr(); at.qp_state = e.IBV_QPS_INIT; at.pkey_index = 0; at.port_num = 1
    at.qp_access_flags = x.access
    x.qp.modify(at, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
    at = QPAttr(); at.qp_state = e.IBV_QPS_RTR; at.path_mtu = e.IBV_MTU_1024
    at.dest_qp_num = a.qp.qp_num; at.rq_psn = 0; at.max_dest_rd_atomic = 4; at.min_rnr_timer = 1
    at.ah_attr = AHAttr(dlid=a.lid, port_num=1)
    x.qp.modify(at, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN |
                e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
    at = QPAttr(); at.qp_state = e.IBV_QPS_RTS; at.sq_psn = 0; at.timeout = 14; at.retry_cnt = 3
    at.rnr_retry = 7; at.max_rd_atomic = 4
    x.qp.modify(at, e.IBV_QP_STATE | e.IBV_QP_SQ_PSN | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT |
                e.IBV_QP_RNR_RETRY | e.IBV_QP_MAX_QP_RD_ATOMIC)
old = 0
while True:
    n, wcs = b.cq.poll(1)
    if not n:
        break
    old += 1
    posted.pop(wcs[0].wr_id, None)
r["old_after_reset"] = old
posted.clear()
r["after_reset"] = post_until_full()
send_round(60, depth)
take(60, depth)
r["after_reset_refill"] = post_until_full()
out(r)
"""


def test_full_receive_queue_refills_by_polled_completions(env):
    r = run(RQ_REFILL, env)
    assert r["bad"] == []
    depth, err = r["fill"][0]
    assert depth >= 32 and err == 12, r["fill"]  # ENOMEM once full
    # After each round exactly as many posts as completions were polled.
    for took, (n, err) in r["refill"]:
        assert (n, err) == (took, 12), r["refill"]
    # The RESET cleaned the taken messages' completions out of the CQ;
    # the emptied ring takes exactly its depth.
    assert r["old_after_reset"] == 0
    assert r["after_reset"] == [depth, 12]
    assert r["after_reset_refill"] == [depth, 12]
