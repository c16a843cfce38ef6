# SPDX-License-Identifier: MIT
"""Error order and key semantics, one test per row of docs/error-semantics.md
(issue 9, item 12).  Each scenario runs on a fresh RC pair looped back in
one child (memsv.RC): `a` posts, `b` is the responder.  Besides the
completion status, each checks both QPs' states and what the target memory
holds afterwards, so that "nothing happened at the responder" is checked,
not assumed.
"""
import pytest

import exverbs

from memsv import RC
import svtest
from svtest import pyverbs

SETUP = RC + r"""
import struct
AT = RW | e.IBV_ACCESS_REMOTE_ATOMIC
STATE = {e.IBV_QPS_RTS: "RTS", e.IBV_QPS_ERR: "ERR"}
WC = {getattr(e, n): n[len("IBV_WC_"):] for n in dir(e) if n.startswith("IBV_WC_") and
      n.endswith(("_ERR", "SUCCESS"))}

def state(side):
    return STATE.get(side.qp.query(e.IBV_QP_STATE)[0].qp_state, "other")

def atomic(side, mr, length, raddr, rkey, op=e.IBV_WR_ATOMIC_FETCH_AND_ADD,
           cmp_add=5, swap=0, lkey=None):
    wr = SendWR(opcode=op, num_sge=1,
                sg=[SGE(mr.buf, length, mr.lkey if lkey is None else lkey)])
    wr.set_wr_atomic(rkey=rkey, addr=raddr, compare_add=cmp_add, swap=swap)
    side.qp.post_send(wr)
    return poll(side.cq)[0]

def rdma(side, mr, raddr, rkey, length, op, lkey=None):
    wr = SendWR(opcode=op, num_sge=1,
                sg=[SGE(mr.buf, length, mr.lkey if lkey is None else lkey)])
    wr.set_wr_rdma(rkey, raddr)
    side.qp.post_send(wr)
    return poll(side.cq)[0]

a, b = pair()
src = MR(pd, 4096, AT)
tgt = MR(pd, 4096, AT)
src.write(bytes(range(256)) * 16, 4096)
tgt.write(struct.pack("<Q", 1000) + bytes(4088), 4096)
BAD_LKEY = src.lkey ^ 0x5500   # Another slot: names no MR of ours
BAD_RKEY = tgt.rkey ^ 0x5500

def word():
    return struct.unpack("<Q", tgt.read(8, 0))[0]

def result(wc, **extra):
    r = {"status": WC.get(wc.status, wc.status), "req": state(a), "resp": state(b)}
    r.update(extra)
    return r
"""


def run(env, body):
    return pyverbs(SETUP + body, env)


def test_write_bad_lkey_and_bad_rkey_is_local_protection(env):
    """The requester gathers a WRITE's data before it sends anything."""
    r = run(env, """
wc = rdma(a, src, tgt.buf + 64, BAD_RKEY, 64, e.IBV_WR_RDMA_WRITE, lkey=BAD_LKEY)
out(result(wc, untouched=tgt.read(64, 64) == bytes(64)))
""")
    assert r == {"status": "LOC_PROT_ERR", "req": "ERR", "resp": "RTS", "untouched": True}


def test_write_bad_rkey_is_remote_access(env):
    r = run(env, """
wc = rdma(a, src, tgt.buf + 64, BAD_RKEY, 64, e.IBV_WR_RDMA_WRITE)
out(result(wc, untouched=tgt.read(64, 64) == bytes(64)))
""")
    assert r == {"status": "REM_ACCESS_ERR", "req": "ERR", "resp": "ERR", "untouched": True}


@pytest.mark.parametrize("op", ["IBV_WR_RDMA_READ", "IBV_WR_ATOMIC_FETCH_AND_ADD",
                                "IBV_WR_ATOMIC_CMP_AND_SWP"])
def test_read_and_atomic_bad_lkey_and_bad_rkey_is_remote_access(env, op):
    """An HCA sends the request first: the responder's access error comes
    back before the local key is ever looked at."""
    r = run(env, f"""
op = e.{op}
if op == e.IBV_WR_RDMA_READ:
    wc = rdma(a, src, tgt.buf, BAD_RKEY, 64, op, lkey=BAD_LKEY)
else:
    wc = atomic(a, src, 8, tgt.buf, BAD_RKEY, op=op, cmp_add=1000, swap=7, lkey=BAD_LKEY)
out(result(wc, word=word()))
""")
    assert r == {"status": "REM_ACCESS_ERR", "req": "ERR", "resp": "ERR", "word": 1000}


def test_read_good_rkey_bad_lkey_is_local_protection(env):
    r = run(env, """
before = src.read(64, 0)
wc = rdma(a, src, tgt.buf, tgt.rkey, 64, e.IBV_WR_RDMA_READ, lkey=BAD_LKEY)
out(result(wc, local_untouched=src.read(64, 0) == before))
""")
    assert r == {"status": "LOC_PROT_ERR", "req": "ERR", "resp": "RTS",
                 "local_untouched": True}


@pytest.mark.parametrize("op", ["IBV_WR_ATOMIC_FETCH_AND_ADD", "IBV_WR_ATOMIC_CMP_AND_SWP"])
def test_atomic_good_rkey_bad_lkey_executes_then_local_protection(env, op):
    """The responder executes the atomic and answers; the response cannot be
    placed: LOC_PROT_ERR, with the target updated, as on an HCA."""
    r = run(env, f"""
wc = atomic(a, src, 8, tgt.buf, tgt.rkey, op=e.{op}, cmp_add=1000, swap=7, lkey=BAD_LKEY)
out(result(wc, word=word()))
""")
    want = 1005 if op.endswith("ADD") else 7
    # FETCH_AND_ADD adds compare_add (1000): 1000 + 1000.
    if op.endswith("ADD"):
        want = 2000
    assert r == {"status": "LOC_PROT_ERR", "req": "ERR", "resp": "RTS", "word": want}


@pytest.mark.parametrize("length", [0, 4, 16])
@pytest.mark.parametrize("op", ["IBV_WR_ATOMIC_FETCH_AND_ADD", "IBV_WR_ATOMIC_CMP_AND_SWP"])
def test_atomic_sge_not_8_bytes_is_local_length(env, op, length):
    """The response is 8 bytes: any other SGE length fails before the
    request is sent, so the target is unchanged (rxe refuses it at post
    time; mlx5 silently moves 8 bytes)."""
    r = run(env, f"""
src.write(bytes(16), 16)
wc = atomic(a, src, {length}, tgt.buf, tgt.rkey, op=e.{op}, cmp_add=1000, swap=7)
out(result(wc, word=word(), local=src.read(16, 0) == bytes(16)))
""")
    assert r == {"status": "LOC_LEN_ERR", "req": "ERR", "resp": "RTS", "word": 1000,
                 "local": True}


def test_atomic_8_bytes_succeeds_and_returns_the_old_value(env):
    r = run(env, """
wc = atomic(a, src, 8, tgt.buf, tgt.rkey, op=e.IBV_WR_ATOMIC_CMP_AND_SWP, cmp_add=1000, swap=7)
old = struct.unpack("<Q", src.read(8, 0))[0]
out(result(wc, word=word(), old=old, len=wc.byte_len))
""")
    assert r == {"status": "SUCCESS", "req": "RTS", "resp": "RTS", "word": 7, "old": 1000,
                 "len": 8}


def test_atomic_misaligned_good_rkey_is_invalid_request(env):
    r = run(env, """
wc = atomic(a, src, 8, tgt.buf + 4, tgt.rkey)
out(result(wc, word=word()))
""")
    assert r == {"status": "REM_INV_REQ_ERR", "req": "ERR", "resp": "ERR", "word": 1000}


def test_atomic_misaligned_bad_rkey_is_remote_access(env):
    """The responder checks the key and range before the alignment."""
    r = run(env, """
wc = atomic(a, src, 8, tgt.buf + 4, BAD_RKEY)
out(result(wc, word=word()))
""")
    assert r == {"status": "REM_ACCESS_ERR", "req": "ERR", "resp": "ERR", "word": 1000}


def test_type2_bind_takes_only_the_low_8_bits_of_the_rkey(env):
    """As on rxe and mlx5: the window keeps its index, the WR's rkey gives
    only the new key byte (ibv_wr_bind_mw takes the rkey as given)."""
    r = pyverbs(exverbs.SETUP + """
from pyverbs.mr import MW, MWBindInfo
a, b, ca, cb = pair(ops=RC_OPS | e.IBV_QP_EX_WITH_BIND_MW)
ma = MR(pd, 4096, ACC)
mb = MR(pd, 4096, ACC | e.IBV_ACCESS_MW_BIND)
mw = MW(pd, e.IBV_MW_TYPE_2)
asked = (((mw.rkey >> 8) ^ 0x1234) << 8) | 0x42     # Upper bits not the window's
real = (mw.rkey & ~0xff) | 0x42
b.wr_start()
b.wr_id = 1
b.wr_flags = e.IBV_SEND_SIGNALED
b.wr_bind_mw(mw, asked, MWBindInfo(mb, mb.buf, 4096, e.IBV_ACCESS_REMOTE_WRITE))
b.wr_complete()
bind = poll(cb, 1)[0]["status"]
def put(key, off):
    a.wr_start()
    a.wr_id = 2
    a.wr_flags = e.IBV_SEND_SIGNALED
    a.wr_rdma_write(key, mb.buf + off)
    a.wr_set_sge(SGE(ma.buf, 64, ma.lkey))
    a.wr_complete()
    return poll(ca, 1)[0]["status"]
ma.write(b"\\xab" * 64, 64)
ok = put(real, 0)
data = mb.read(64, 0) == b"\\xab" * 64
bad = put(asked, 128)
out({"bind": bind, "real_key": ok, "data": data, "asked_key": bad,
     "codes": [e.IBV_WC_SUCCESS, e.IBV_WC_REM_ACCESS_ERR]})
""", env)
    ok, rem = r.pop("codes")
    assert r == {"bind": ok, "real_key": ok, "data": True, "asked_key": rem}


def test_send_queue_drain_and_error_states(env, build_dir):
    """SQD and SQE as IB 10.3.1 defines them (tests/progs/sv_sqd.c): RTS ->
    SQD raises IBV_EVENT_SQ_DRAINED when asked, after a SEND already
    started (an RNR wait) finishes, with sq_draining 1 until then; WRs
    posted in SQD start only at SQD -> RTS (no completion, no byte moved
    before); a UC QP's local send error parks it in SQE, flushing what
    follows, while its receive queue goes on; SQE -> RTS resumes it.  SQD
    was accepted and ignored: no event, WRs ran at once; a UD or UC send
    error left the QP sending (UD) or took it to ERR (UC)."""
    p = svtest.run([svtest.built_prog(build_dir, "sv_sqd")], env, timeout=90)
    assert p.returncode == 0 and p.stdout.strip() == "OK sv_sqd", (p.stdout, p.stderr)


def test_comm_est_last_wqe_and_one_multicast_copy(env, build_dir):
    """tests/progs/sv_async.c: IBV_EVENT_COMM_EST once on a QP in RTR at its
    first request (a SEND; a WRITE, which takes the express way), none for
    a responder already in RTS; IBV_EVENT_QP_LAST_WQE_REACHED when a QP on
    an SRQ goes to ERR, by modify and by a responder error; one multicast
    copy for a QP attached to two groups of one LID.  The two events were
    never raised, and the QP got two copies."""
    p = svtest.run([svtest.built_prog(build_dir, "sv_async")], env, timeout=90)
    assert p.returncode == 0 and p.stdout.strip() == "OK sv_async", (p.stdout, p.stderr)
