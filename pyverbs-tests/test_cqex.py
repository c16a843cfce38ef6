# SPDX-License-Identifier: MIT
"""ibv_create_cq_ex, the start_poll/next_poll/end_poll iterator and each
wc_flags bit; the rest of the _ex family (query_device_ex, rt values,
parent domains, ECE, SRQ ops).  Each scenario runs in a child python on a
fabric of its own (see conftest.py)."""
import errno
import time

import pytest

import exverbs
import svtest

WC_RECV = 128
UD_GRH = 40


def run(code, env):
    return svtest.pyverbs(exverbs.SETUP + code, env)


# A UD datagram carries every field a wc_flags bit asks for.
UD_TRAFFIC = """
import time as _t
ops = e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_SEND_WITH_IMM
ca, cb = cq_ex(FLAGS), cq_ex(FLAGS)
a, b = qp_ex(ca, e.IBV_QPT_UD, ops), qp_ex(cb, e.IBV_QPT_UD, ops)
to_rts(a)
to_rts(b)
ah = AH(pd, attr=AHAttr(dlid=LID, port_num=1, sl=3))
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
recv(b, mb, wr_id=1, length=UD_GRH + 100)
clk0 = ctx.query_rt_values_ex()
wall0 = _t.time_ns()
a.wr_start()
a.wr_id = 2
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_send_imm(0x01020304)
a.wr_set_ud_addr(ah, b.qp_num, 0x1234)
a.wr_set_sge(SGE(ma.buf, 100, ma.lkey))
a.wr_complete()
s = poll(ca, 1, FLAGS)[0]
r = poll(cb, 1, FLAGS)[0]
clk1 = ctx.query_rt_values_ex()
wall1 = _t.time_ns()
out({"s": s, "r": r, "clk": [clk0[0] * 10**9 + clk0[1], clk1[0] * 10**9 + clk1[1]],
     "wall": [wall0, wall1], "qpn": [a.qp_num, b.qp_num], "lid": LID})
"""

BITS = ["IBV_WC_EX_WITH_BYTE_LEN", "IBV_WC_EX_WITH_IMM", "IBV_WC_EX_WITH_QP_NUM",
        "IBV_WC_EX_WITH_SRC_QP", "IBV_WC_EX_WITH_SLID", "IBV_WC_EX_WITH_SL",
        "IBV_WC_EX_WITH_DLID_PATH_BITS", "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP",
        "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK", "ALL_WC"]


@pytest.mark.parametrize("bit", BITS)
def test_each_wc_flag(env, bit):
    flags = bit if bit == "ALL_WC" else f"e.{bit}"
    r = run(f"FLAGS = {flags}\nUD_GRH = {UD_GRH}\n" + UD_TRAFFIC, env)
    s, rv = r["s"], r["r"]
    qa, qb = r["qpn"]
    assert (s["wr_id"], s["status"], s["opcode"]) == (2, 0, 0)
    assert (rv["wr_id"], rv["status"], rv["opcode"]) == (1, 0, WC_RECV)
    assert rv["flags"] & 2  # IBV_WC_WITH_IMM
    every = bit == "ALL_WC"
    if every or bit.endswith("BYTE_LEN"):
        assert rv["byte_len"] == UD_GRH + 100 and s["byte_len"] == 100
    if every or bit.endswith("_IMM"):
        assert rv["imm"] == 0x04030201  # pyverbs: sent in network order, read back raw
    if every or bit.endswith("QP_NUM"):
        assert rv["qp_num"] == qb and s["qp_num"] == qa
    if every or bit.endswith("SRC_QP"):
        assert rv["src_qp"] == qa
    if every or bit.endswith("SLID"):
        assert rv["slid"] == r["lid"]
    if every or bit.endswith("_SL"):
        assert rv["sl"] == 3
    if every or bit.endswith("PATH_BITS"):
        assert rv["dlid_path_bits"] == 0
    if every or bit.endswith("TIMESTAMP"):
        lo, hi = r["clk"]
        assert lo <= s["ts"] <= hi and lo <= rv["ts"] <= hi
    if every or bit.endswith("WALLCLOCK"):
        lo, hi = r["wall"]
        # The monotonic stamp moved to the wall clock: within a few ms.
        assert lo - 5_000_000 <= rv["wallclock"] <= hi + 5_000_000
    # Only the asked-for fields were read (no reader for the rest was used).
    if not every:
        names = {n for n, _ in exverbs_readers().values()}
        wanted = exverbs_readers()[bit][0]
        assert not (set(rv) & names) - {wanted}


def exverbs_readers():
    # The same table as exverbs.READERS, keyed by flag name.
    return {
        "IBV_WC_EX_WITH_BYTE_LEN": ("byte_len", None), "IBV_WC_EX_WITH_IMM": ("imm", None),
        "IBV_WC_EX_WITH_QP_NUM": ("qp_num", None), "IBV_WC_EX_WITH_SRC_QP": ("src_qp", None),
        "IBV_WC_EX_WITH_SLID": ("slid", None), "IBV_WC_EX_WITH_SL": ("sl", None),
        "IBV_WC_EX_WITH_DLID_PATH_BITS": ("dlid_path_bits", None),
        "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP": ("ts", None),
        "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK": ("wallclock", None),
    }


def test_rc_completions_and_timestamps_in_order(env):
    r = run("""
a, b, ca, cb = pair(sl=5)
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
for i in range(16):
    recv(b, mb, wr_id=100 + i, offset=64 * i, length=64)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
for i in range(16):
    a.wr_id = i
    a.wr_send()
    a.wr_set_sge(SGE(ma.buf, i + 1, ma.lkey))
a.wr_complete()
out({"s": poll(ca, 16), "r": poll(cb, 16), "qpn": [a.qp_num, b.qp_num], "lid": LID})
""", env)
    assert [c["wr_id"] for c in r["s"]] == list(range(16))
    assert [c["wr_id"] for c in r["r"]] == list(range(100, 116))
    assert [c["byte_len"] for c in r["r"]] == list(range(1, 17))
    assert all(c["sl"] == 5 and c["slid"] == r["lid"] and c["src_qp"] == r["qpn"][0]
               for c in r["r"])
    ts = [c["ts"] for c in r["r"]]
    assert ts == sorted(ts)


def test_empty_cq_and_end_of_batch(env):
    r = run("""
cq = cq_ex()
first = cq.start_poll(PollCqAttr())
a, b, ca, cb = pair()
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
a.wr_start()
a.wr_id = 1
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_rdma_write(mb.rkey, mb.buf)
a.wr_set_sge(SGE(ma.buf, 8, ma.lkey))
a.wr_complete()
time.sleep(0.02)
got = ca.start_poll(PollCqAttr())
wr = ca.wr_id
nxt = ca.poll_next()
ca.end_poll()
again = ca.start_poll(PollCqAttr())
out({"first": first, "got": got, "wr": wr, "next": nxt, "again": again})
""", env)
    assert r == {"first": errno.ENOENT, "got": 0, "wr": 1, "next": errno.ENOENT,
                 "again": errno.ENOENT}


def test_single_threaded_cq(env):
    r = run("""
ca = cq_ex(flags=e.IBV_CREATE_CQ_ATTR_SINGLE_THREADED)
cb = cq_ex()
a, b = qp_ex(ca), qp_ex(cb)
to_rts(a, b.qp_num)
to_rts(b, a.qp_num)
ma, mb = MR(pd, 4096, ACC), MR(pd, 4096, ACC)
a.wr_start()
a.wr_flags = e.IBV_SEND_SIGNALED
for i in range(3):
    a.wr_id = i
    a.wr_rdma_write(mb.rkey, mb.buf)
    a.wr_set_sge(SGE(ma.buf, 8, ma.lkey))
a.wr_complete()
out([c["wr_id"] for c in poll(ca, 3)])
""", env)
    assert r == [0, 1, 2]


@pytest.mark.parametrize("what", [
    "wc_flags=e.IBV_WC_EX_WITH_CVLAN", "wc_flags=e.IBV_WC_EX_WITH_FLOW_TAG",
    "wc_flags=e.IBV_WC_EX_WITH_TM_INFO", "flags=e.IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN"])
def test_unsupported_cq_attrs_refused(env, what):
    r = run(f"out(errno_of(cq_ex, {what}))", env)
    assert r == errno.EOPNOTSUPP


def test_query_device_ex_caps(env):
    r = run("""
a = ctx.query_device_ex()
out({"clock": a.hca_core_clock, "mask": a.completion_timestamp_mask,
     "tso": a.tso_caps.max_tso, "rss": a.rss_caps.supported_qpts,
     "tm": a.tm_caps.max_num_tags, "cq_mod": [a.cq_mod_caps.max_cq_count,
                                              a.cq_mod_caps.max_cq_period],
     "pacing": a.packet_pacing_caps.qp_rate_limit_max, "ports": a.phys_port_cnt_ex,
     "max_qp": a.orig_attr.max_qp})
""", env)
    assert r["clock"] == 1_000_000  # kHz: the CQE clock counts nanoseconds
    assert r["mask"] == 2**64 - 1
    # ODP is the memory code's to advertise; these are honestly absent.
    assert r["tso"] == 0 and r["rss"] == 0
    # CQ moderation by count (ibv_modify_cq), no period: see sv_cq_mod.c.
    assert r["tm"] == 0 and r["cq_mod"] == [65535, 0] and r["pacing"] == 0
    assert r["ports"] >= 1 and r["max_qp"] > 0


def test_rt_values_track_the_monotonic_clock(env):
    r = run("""
import time as _t
before = _t.clock_gettime_ns(_t.CLOCK_MONOTONIC)
v = ctx.query_rt_values_ex()
after = _t.clock_gettime_ns(_t.CLOCK_MONOTONIC)
out([before, v[0] * 10**9 + v[1], after])
""", env)
    assert r[0] <= r[1] <= r[2]


def test_parent_domain_stands_for_its_pd(env):
    r = run("""
from pyverbs.pd import ParentDomain, ParentDomainInitAttr, ParentDomainContext
calls = []
def alloc(pd, ctx_, size, align, rtype):
    calls.append(hex(rtype))
    return e._IBV_ALLOCATOR_USE_DEFAULT  # The library's own memory (SQ and RQ rings)
def free(pd, ctx_, ptr, rtype):
    calls.append("free")
pctx = ParentDomainContext(pd, alloc, free)
pdom = ParentDomain(ctx, attr=ParentDomainInitAttr(pd=pd, pd_context=pctx))
ca, cb = cq_ex(), cq_ex()
a = qp_ex(ca, qpd=pdom)
b = qp_ex(cb)
to_rts(a, b.qp_num)
to_rts(b, a.qp_num)
ma = MR(pd, 4096, ACC)    # Keys of the protection domain serve the parent domain's QP
mb = MR(pdom, 4096, ACC)  # and an MR registered on the parent domain is in that PD
ma.write(b"via parent", 10)
a.wr_start()
a.wr_id = 1
a.wr_flags = e.IBV_SEND_SIGNALED
a.wr_rdma_write(mb.rkey, mb.buf)
a.wr_set_sge(SGE(ma.buf, 10, ma.lkey))
a.wr_complete()
s = poll(ca, 1)
out({"s": [s[0]["wr_id"], s[0]["status"]], "d": mb.read(10, 0).decode(), "calls": calls})
""", env)
    # The QP's send-queue and receive-queue rings were asked of the allocator
    # (SOFTVERBS_RES_TYPE_SQ, _RQ), which declined.
    assert r == {"s": [1, 0], "d": "via parent",
                 "calls": ["0x5356000000000001", "0x5356000000000003"]}


def test_ece_through_pyverbs(env):
    """ibv_query_ece: the device's vendor (as ibv_query_device), no options;
    ibv_set_ece accepts none of the options asked for (loop has none) and
    refuses another vendor (pyverbs' QP.query_ece, QP.set_ece)."""
    r = run("""
from pyverbs.qp import ECE
a, b, ca, cb = pair()
q = a.query_ece()
other = errno_of(a.set_ece, ECE(0x1234, 1, 0))
ok = errno_of(a.set_ece, ECE(0xffffff, 5, 0))
q2 = a.query_ece()
out({"q": [q.vendor_id, q.options, q.comp_mask], "other": other, "ok": ok,
     "q2": [q2.vendor_id, q2.options], "vendor": ctx.query_device().vendor_id})
""", env)
    assert r == {"q": [0xffffff, 0, 0], "other": errno.EINVAL, "ok": 0, "q2": [0xffffff, 0],
                 "vendor": 0xffffff}, r
