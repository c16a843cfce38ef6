# SPDX-License-Identifier: MIT
"""Child-side code shared by test_qpex.py and test_cqex.py.

SETUP is prepended to each scenario, which runs in a child /usr/bin/python3
through svtest.pyverbs() (so the test process never loads libibverbs).  It
opens loop0 and offers helpers to make extended CQs and QPs and to bring two
QPs of this process to RTS against each other.
"""

SETUP = r"""
import time
import pyverbs.enums as e
from pyverbs.pd import PD
from pyverbs.mr import MR
from pyverbs.cq import CQ, CQEX, CqInitAttrEx, PollCqAttr
from pyverbs.qp import QP, QPEx, QPInitAttrEx, QPCap, QPAttr
from pyverbs.addr import AHAttr, AH
from pyverbs.wr import SGE, RecvWR

ctx = d.Context(name="loop0")
pd = PD(ctx)
LID = ctx.query_port(1).lid
ACC = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ |
       e.IBV_ACCESS_REMOTE_ATOMIC)
ALL_WC = (e.IBV_WC_EX_WITH_BYTE_LEN | e.IBV_WC_EX_WITH_IMM | e.IBV_WC_EX_WITH_QP_NUM |
          e.IBV_WC_EX_WITH_SRC_QP | e.IBV_WC_EX_WITH_SLID | e.IBV_WC_EX_WITH_SL |
          e.IBV_WC_EX_WITH_DLID_PATH_BITS | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
          e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
RC_OPS = (e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_SEND_WITH_IMM | e.IBV_QP_EX_WITH_RDMA_WRITE |
          e.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | e.IBV_QP_EX_WITH_RDMA_READ |
          e.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | e.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)


def errno_of(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except PyverbsRDMAError as x:
        return x.error_code
    return 0


def cq_ex(wc_flags=ALL_WC, flags=None, cqe=256):
    if flags is None:
        return CQEX(ctx, CqInitAttrEx(cqe=cqe, wc_flags=wc_flags))
    return CQEX(ctx, CqInitAttrEx(cqe=cqe, wc_flags=wc_flags,
                                  comp_mask=e.IBV_CQ_INIT_ATTR_MASK_FLAGS, flags=flags))


def qp_ex(cq, qpt=e.IBV_QPT_RC, ops=RC_OPS, max_send_wr=32, max_sge=4, inline=64, qpd=None):
    cap = QPCap(max_send_wr=max_send_wr, max_recv_wr=64, max_send_sge=max_sge,
                max_recv_sge=max_sge, max_inline_data=inline)
    a = QPInitAttrEx(qp_type=qpt, scq=cq, rcq=cq, cap=cap, pd=qpd or pd,
                     comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                     send_ops_flags=ops)
    return QPEx(ctx, a)


def to_rts(q, dst=0, sl=0, path_bits=0):
    t = q.qp_type
    a = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    a.pkey_index = 0
    mask = e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
    if t == e.IBV_QPT_UD:
        a.qkey = 0x1234
        mask |= e.IBV_QP_QKEY
    else:
        a.qp_access_flags = ACC
        mask |= e.IBV_QP_ACCESS_FLAGS
    q.modify(a, mask)
    a = QPAttr(qp_state=e.IBV_QPS_RTR)
    mask = e.IBV_QP_STATE
    if t != e.IBV_QPT_UD:
        a.path_mtu = e.IBV_MTU_1024
        a.dest_qp_num = dst
        a.rq_psn = 0
        a.ah_attr = AHAttr(dlid=LID, port_num=1, sl=sl, src_path_bits=path_bits)
        mask |= e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
        if t == e.IBV_QPT_RC:
            a.max_dest_rd_atomic = 4
            a.min_rnr_timer = 1
            mask |= e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER
    q.modify(a, mask)
    a = QPAttr(qp_state=e.IBV_QPS_RTS)
    a.sq_psn = 0
    mask = e.IBV_QP_STATE | e.IBV_QP_SQ_PSN
    if t == e.IBV_QPT_RC:
        a.timeout = 14
        a.retry_cnt = 7
        a.rnr_retry = 7
        a.max_rd_atomic = 4
        mask |= e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_MAX_QP_RD_ATOMIC
    q.modify(a, mask)


def pair(qpt=e.IBV_QPT_RC, ops=RC_OPS, wc_flags=ALL_WC, sl=0, **kw):
    # Two QPs of this process, connected to each other, each with its CQ.
    ca, cb = cq_ex(wc_flags), cq_ex(wc_flags)
    a, b = qp_ex(ca, qpt, ops, **kw), qp_ex(cb, qpt, ops, **kw)
    to_rts(a, b.qp_num, sl)
    to_rts(b, a.qp_num, sl)
    return a, b, ca, cb


def recv(q, mr, length=4096, wr_id=0, offset=0):
    q.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(mr.buf + offset, length, mr.lkey)]))


READERS = {
    e.IBV_WC_EX_WITH_BYTE_LEN: ("byte_len", "read_byte_len"),
    e.IBV_WC_EX_WITH_IMM: ("imm", "read_imm_data"),
    e.IBV_WC_EX_WITH_QP_NUM: ("qp_num", "read_qp_num"),
    e.IBV_WC_EX_WITH_SRC_QP: ("src_qp", "read_src_qp"),
    e.IBV_WC_EX_WITH_SLID: ("slid", "read_slid"),
    e.IBV_WC_EX_WITH_SL: ("sl", "read_sl"),
    e.IBV_WC_EX_WITH_DLID_PATH_BITS: ("dlid_path_bits", "read_dlid_path_bits"),
    e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: ("ts", "read_timestamp"),
    e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: ("wallclock", "read_completion_wallclock_ns"),
}


def poll(cq, n, wc_flags=ALL_WC, timeout=5.0):
    # Polls n completions with start_poll/next_poll/end_poll, as dicts.
    out = []
    end = time.monotonic() + timeout
    while len(out) < n:
        if time.monotonic() > end:
            raise TimeoutError(f"{len(out)} of {n} completions: {out}")
        if cq.start_poll(PollCqAttr()) != 0:
            continue
        while True:
            c = {"wr_id": cq.wr_id, "status": cq.status, "opcode": cq.read_opcode(),
                 "flags": cq.read_wc_flags()}
            for bit, (name, reader) in READERS.items():
                if wc_flags & bit:
                    c[name] = getattr(cq, reader)()
            out.append(c)
            if len(out) >= n or cq.poll_next() != 0:
                break
        cq.end_poll()
    return out


def empty(cq):
    if cq.start_poll(PollCqAttr()) == 0:
        c = cq.wr_id
        cq.end_poll()
        return False
    return True
"""
