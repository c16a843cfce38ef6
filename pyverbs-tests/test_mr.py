# SPDX-License-Identifier: MIT
"""Memory regions: access flags, IOVA, rereg, bounds, relaxed ordering."""
import errno

from memsv import RC
from svtest import pyverbs


def test_every_access_flag_registers(env):
    r = pyverbs(RC + """
res = {}
mem = MR(pd, 8192, RW)
for name in ["ZERO_BASED", "ON_DEMAND", "HUGETLB", "RELAXED_ORDERING", "MW_BIND",
             "REMOTE_ATOMIC"]:
    # An address of our own: pyverbs would allocate huge pages for HUGETLB.
    res[name] = err(MR, pd, 4096, RW | getattr(e, "IBV_ACCESS_" + name), address=mem.buf)
res["rw_no_lw"] = err(MR, pd, 4096, e.IBV_ACCESS_REMOTE_WRITE)
res["atomic_no_lw"] = err(MR, pd, 4096, e.IBV_ACCESS_REMOTE_ATOMIC)
res["unknown"] = err(MR, pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | (1 << 15))
res["unmapped"] = err(MR, pd, 4096, e.IBV_ACCESS_LOCAL_WRITE, address=0x10000)
out(res)
""", env)
    for k in ("ZERO_BASED", "ON_DEMAND", "HUGETLB", "RELAXED_ORDERING", "MW_BIND",
              "REMOTE_ATOMIC"):
        assert r[k] == 0, k
    assert r["rw_no_lw"] == errno.EINVAL
    assert r["atomic_no_lw"] == errno.EINVAL
    assert r["unknown"] == errno.EINVAL
    assert r["unmapped"] == errno.EFAULT


def test_registration_needs_the_protection_pinning_would(env):
    """As the kernel's ib_umem_get pins (for writing when the access writes:
    LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC, MW_BIND): a read-only mapping
    registers for remote reads only, a PROT_NONE one not at all (EFAULT).
    They used to register, and the requester's later fault in them was
    blamed on the responder, whose QP went to ERR."""
    r = pyverbs(RC + """
import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
def region(prot):
    return libc.mmap(None, 8192, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
ro, none = region(mmap.PROT_READ), region(0)  # PROT_NONE is 0
wo = region(mmap.PROT_WRITE)
res = {"ro_lw": err(MR, pd, 8192, e.IBV_ACCESS_LOCAL_WRITE, address=ro),
       "ro_read": err(MR, pd, 8192, e.IBV_ACCESS_REMOTE_READ, address=ro),
       "ro_bind": err(MR, pd, 8192, e.IBV_ACCESS_MW_BIND, address=ro),
       "none": err(MR, pd, 8192, 0, address=none),
       "none_read": err(MR, pd, 8192, e.IBV_ACCESS_REMOTE_READ, address=none),
       "wo_lw": err(MR, pd, 8192, e.IBV_ACCESS_LOCAL_WRITE, address=wo)}
m = MR(pd, 8192, e.IBV_ACCESS_REMOTE_READ, address=ro)
res["rereg_to_write"] = err(m.rereg, e.IBV_REREG_MR_CHANGE_ACCESS, None, 0, 0,
                            e.IBV_ACCESS_LOCAL_WRITE)
out(res)
""", env)
    # A write-only mapping pins for writing (VM_WRITE is what counts), and
    # an MR made writable by rereg where it stays is pinned for it anew.
    assert r == {"ro_lw": errno.EFAULT, "ro_read": 0, "ro_bind": errno.EFAULT,
                 "none": errno.EFAULT, "none_read": errno.EFAULT, "wo_lw": 0,
                 "rereg_to_write": errno.EFAULT}, r


def test_zero_based_iova_and_bounds(env):
    r = pyverbs(RC + """
a, b = pair()
tgt = MR(pd, 8192, RW | e.IBV_ACCESS_ZERO_BASED)
src = MR(pd, 8192, RW)
src.write(b"z" * 16, 16)
ok = write(a, src, 100, tgt.rkey, 16)           # IOVA 100: byte 100 of the buffer
data = tgt.read(16, 100)
b2, a2 = pair()
bad = write(b2, src, tgt.buf, tgt.rkey, 16)      # Its virtual address is no IOVA
c, d = pair()
past = write(c, src, 8190, tgt.rkey, 16)         # Runs past the end
out({"ok": ok.status, "data": data.decode(), "bad": bad.status, "past": past.status,
     "rem": e.IBV_WC_REM_ACCESS_ERR})
""", env)
    assert r["ok"] == 0 and r["data"] == "z" * 16
    assert r["bad"] == r["rem"] and r["past"] == r["rem"]


def test_rereg_access_pd_translation(env):
    r = pyverbs(RC + """
a, b = pair()
tgt = MR(pd, 4096, RW)
src = MR(pd, 4096, RW)
first = write(a, src, tgt.buf, tgt.rkey, 8).status
tgt.rereg(e.IBV_REREG_MR_CHANGE_ACCESS, pd, 0, 0, e.IBV_ACCESS_LOCAL_WRITE)
no_rights = write(a, src, tgt.buf, tgt.rkey, 8).status
bad_flags = err(tgt.rereg, 1 << 5, pd, 0, 0, 0)
bad_access = err(tgt.rereg, e.IBV_REREG_MR_CHANGE_ACCESS, pd, 0, 0, e.IBV_ACCESS_REMOTE_WRITE)
c, d = pair()
tgt.rereg(e.IBV_REREG_MR_CHANGE_ACCESS, pd, 0, 0, RW)
again = write(c, src, tgt.buf, tgt.rkey, 8).status
pd2 = PD(ctx)
tgt.rereg(e.IBV_REREG_MR_CHANGE_PD, pd2, 0, 0, 0)
other_pd = write(c, src, tgt.buf, tgt.rkey, 8).status
out({"first": first, "no_rights": no_rights, "bad_flags": bad_flags, "bad_access": bad_access,
     "again": again, "other_pd": other_pd, "rem": e.IBV_WC_REM_ACCESS_ERR})
""", env)
    assert r["first"] == 0 and r["again"] == 0
    assert r["no_rights"] == r["rem"] and r["other_pd"] == r["rem"]
    assert r["bad_flags"] != 0 and r["bad_access"] != 0


def test_relaxed_ordering_large_write_lands_whole(env):
    r = pyverbs(RC + """
a, b = pair()
n = 1 << 20
res = {}
for ro in (0, e.IBV_ACCESS_RELAXED_ORDERING):
    tgt = MR(pd, n, RW | ro)
    src = MR(pd, n, RW)
    pattern = bytes(range(256)) * (n // 256)
    src.write(pattern, n)
    st = write(a, src, tgt.buf, tgt.rkey, n).status
    res[str(ro)] = [st, tgt.read(n, 0) == pattern]
    # Three SGEs whose last two are shorter than the 16 KiB placed first:
    # the tail that lands first spans pieces, and one piece is cut.
    tgt.write(bytes(n), n)
    cuts = [0, n - 10000 - 3000, n - 10000, n]
    sg = [SGE(src.buf + cuts[i], cuts[i + 1] - cuts[i], src.lkey) for i in range(3)]
    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=3, sg=sg)
    wr.set_wr_rdma(tgt.rkey, tgt.buf)
    a.qp.post_send(wr)
    st = poll(a.cq)[0].status
    res[str(ro) + "_sges"] = [st, tgt.read(n, 0) == pattern]
out(res)
""", env)
    assert len(r) == 4 and all(v == [0, True] for v in r.values()), r


def test_overlapping_write_within_one_process_gives_memmoves_result(env):
    """A WRITE whose source and target overlap in one process (undefined on
    an HCA) keeps memmove's result for each SGE, in SGE order, with and
    without relaxed ordering: the last bytes' piece of an ordered WRITE and
    the first-placed tail of a relaxed one (docs/memory.md) must not copy
    bytes another piece of the same WRITE already wrote."""
    r = pyverbs(RC + """
a, b = pair()
res = {}
for ro in (0, e.IBV_ACCESS_RELAXED_ORDERING):
    for n in (1000, 200000):
        for nsge in (1, 2):
            size = 2 * n + 4096
            mr = MR(pd, size, RW | ro)
            init = bytes((i * 7 + 3) % 251 for i in range(size))
            mr.write(init, size)
            half = n // 2
            cuts = [(0, half), (half, n - half)] if nsge == 2 else [(0, n)]
            sg = [SGE(mr.buf + off, ln, mr.lkey) for off, ln in cuts]
            wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=nsge, sg=sg)
            wr.set_wr_rdma(mr.rkey, mr.buf + 1)
            a.qp.post_send(wr)
            st = poll(a.cq)[0].status
            want = bytearray(init)
            dst = 1
            for off, ln in cuts:
                want[dst:dst + ln] = bytes(want[off:off + ln])
                dst += ln
            res[f"{ro}/{n}/{nsge}"] = [st, mr.read(size, 0) == bytes(want)]
out(res)
""", env)
    assert len(r) == 8 and all(v == [0, True] for v in r.values()), r


def test_key_changes_reach_a_qp_that_used_the_key(env):
    """A QP keeps the keys it resolved last (key_cache in loop.h); each
    step below first uses a key on a QP, then changes the key, and the same
    QP's next use must see the change: a deregistered rkey, a new
    translation of a zero-based rkey, a deregistered local lkey, a
    deregistered receive lkey."""
    r = pyverbs(RC + """
def raw_send(side, buf, lkey, n):
    side.qp.post_send(SendWR(opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(buf, n, lkey)]))
    return poll(side.cq)[0].status

res = {}
src = MR(pd, 4096, RW)
src.write(b"A" * 64, 64)
# An rkey, deregistered.
a, b = pair()
tgt = MR(pd, 4096, RW)
res["rkey_first"] = write(a, src, tgt.buf, tgt.rkey, 64).status
rkey, taddr = tgt.rkey, tgt.buf
tgt.close()
res["rkey_gone"] = write(a, src, taddr, rkey, 64).status
# A zero-based rkey given a new translation: the same iova now names
# other memory.
c, d = pair()
old = MR(pd, 4096, RW)
new = MR(pd, 4096, RW)
zb = MR(pd, 4096, RW | e.IBV_ACCESS_ZERO_BASED, address=old.buf)
res["zb_first"] = write(c, src, 0, zb.rkey, 64).status
zb.rereg(e.IBV_REREG_MR_CHANGE_TRANSLATION | e.IBV_REREG_MR_CHANGE_ACCESS, pd, new.buf, 4096,
         RW | e.IBV_ACCESS_ZERO_BASED)
src.write(b"B" * 64, 64)
res["zb_second"] = write(c, src, 0, zb.rkey, 64).status
res["zb_old"] = old.read(64, 0).decode()
res["zb_new"] = new.read(64, 0).decode()
# A local lkey, deregistered.
g, h = pair()
rbuf = MR(pd, 4096, RW)
recv(h, rbuf, 64)
recv(h, rbuf, 64, wr_id=8)
loc = MR(pd, 4096, RW)
res["lkey_first"] = raw_send(g, loc.buf, loc.lkey, 64)
poll(h.cq)
lbuf, lkey = loc.buf, loc.lkey
loc.close()
res["lkey_gone"] = raw_send(g, lbuf, lkey, 64)
# A receive lkey, deregistered after its receive was posted.
i, j = pair()
rb = MR(pd, 4096, RW)
recv(j, rb, 64)
recv(j, rb, 64, wr_id=8)
res["recv_first"] = raw_send(i, src.buf, src.lkey, 64)
res["recv_first_rc"] = poll(j.cq)[0].status
rb.close()
res["recv_gone"] = raw_send(i, src.buf, src.lkey, 64)
res["recv_gone_rc"] = poll(j.cq)[0].status
res["codes"] = [e.IBV_WC_REM_ACCESS_ERR, e.IBV_WC_LOC_PROT_ERR, e.IBV_WC_REM_OP_ERR]
out(res)
""", env)
    rem_access, loc_prot, rem_op = r["codes"]
    assert r["rkey_first"] == 0 and r["rkey_gone"] == rem_access, r
    assert r["zb_first"] == 0 and r["zb_second"] == 0, r
    assert r["zb_old"] == "A" * 64 and r["zb_new"] == "B" * 64, r
    assert r["lkey_first"] == 0 and r["lkey_gone"] == loc_prot, r
    assert r["recv_first"] == 0 and r["recv_first_rc"] == 0, r
    assert r["recv_gone"] == rem_op and r["recv_gone_rc"] == loc_prot, r
