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
out(res)
""", env)
    assert all(v == [0, True] for v in r.values()), r
