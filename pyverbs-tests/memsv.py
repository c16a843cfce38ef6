# SPDX-License-Identifier: MIT
"""Child-side code shared by the memory tests (test_mr, test_mw, test_odp,
test_invalidate, test_dmabuf): an RC pair on loop0, looped back within the
child, and helpers to post and poll.  Prepended to each scenario."""

RC = r"""
import ctypes, mmap, os
from pyverbs.pd import PD
from pyverbs.cq import CQ
from pyverbs.qp import QP, QPInitAttr, QPCap, QPAttr
from pyverbs.mr import MR, MW, MWBindInfo, MWBind
from pyverbs.wr import SendWR, RecvWR, SGE
from pyverbs.addr import AHAttr
ctx = d.Context(name="loop0")
pd = PD(ctx)
LID = ctx.query_port(1).lid
RW = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ

class Side:
    def __init__(self, pd_=None):
        self.pd = pd_ or pd
        self.cq = CQ(ctx, 64)
        cap = QPCap(max_send_wr=32, max_recv_wr=32, max_send_sge=4, max_recv_sge=4)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                          cap=cap))

def connect(a, b):
    for x, y in ((a, b), (b, a)):
        at = QPAttr(port_num=1)
        at.qp_access_flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
                              e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)
        at.dest_qp_num = y.qp.qp_num
        at.ah_attr = AHAttr(port_num=1, dlid=LID)
        at.timeout = 10
        at.retry_cnt = 1
        at.rnr_retry = 1
        x.qp.to_rts(at)

def pair():
    a, b = Side(), Side()
    connect(a, b)
    return a, b

def poll(cq, n=1):
    got = []
    for _ in range(2000000):
        k, wcs = cq.poll(n - len(got))
        got += wcs[:k]
        if len(got) >= n:
            return got
    raise RuntimeError("no completion")

def write(side, mr, raddr, rkey, length, off=0, opcode=None, signaled=True):
    wr = SendWR(opcode=opcode if opcode is not None else e.IBV_WR_RDMA_WRITE, num_sge=1,
                sg=[SGE(mr.buf + off, length, mr.lkey)])
    wr.set_wr_rdma(rkey, raddr)
    side.qp.post_send(wr)
    return poll(side.cq)[0]

def read(side, mr, raddr, rkey, length):
    return write(side, mr, raddr, rkey, length, opcode=e.IBV_WR_RDMA_READ)

def recv(side, mr, length, wr_id=7):
    side.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(mr.buf, length, mr.lkey)]))

def send(side, mr, length, opcode=e.IBV_WR_SEND, imm=None):
    wr = SendWR(opcode=opcode, num_sge=1 if length else 0,
                sg=[SGE(mr.buf, length, mr.lkey)] if length else None)
    if imm is not None:
        wr.imm_data = imm
    side.qp.post_send(wr)
    return poll(side.cq)[0]

def err(f, *a, **k):
    try:
        f(*a, **k)
    except PyverbsRDMAError as x:
        return x.error_code
    return 0

libc = ctypes.CDLL(None, use_errno=True)
"""
