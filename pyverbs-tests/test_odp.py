# SPDX-License-Identifier: MIT
"""On-demand paging: caps, lazy and implicit MRs, advise_mr, unmapped memory."""
import errno

from memsv import RC
from svtest import pyverbs

MMAP = """
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
def E(name):
    return getattr(e, name) if hasattr(e, name) else getattr(e, "_" + name)
def anon(n):
    return libc.mmap(None, n, 3, 0x22, -1, 0)   # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
"""


def test_odp_caps(env):
    r = pyverbs(RC + """
a = ctx.query_device_ex()
o = a.odp_caps
out([o.general_caps, o.rc_odp_caps, o.uc_odp_caps, o.ud_odp_caps,
     e.IBV_ODP_SUPPORT | e.IBV_ODP_SUPPORT_IMPLICIT,
     e.IBV_ODP_SUPPORT_SEND | e.IBV_ODP_SUPPORT_RECV | e.IBV_ODP_SUPPORT_WRITE |
     e.IBV_ODP_SUPPORT_READ | e.IBV_ODP_SUPPORT_ATOMIC | e.IBV_ODP_SUPPORT_SRQ_RECV])
""", env)
    gen, rc, uc, ud, want_gen, want_rc = r
    assert gen & want_gen == want_gen and rc == want_rc and uc and ud


def test_odp_lazy_implicit_and_unmapped(env):
    r = pyverbs(RC + MMAP + """
res = {}
n = 1 << 16
a, b = pair()
src = MR(pd, 4096, RW)
src.write(b"odp!" * 4, 16)
addr = anon(n)   # Never touched: not a page is present yet
odp = MR(pd, n, RW | e.IBV_ACCESS_ON_DEMAND, address=addr)
res["lazy"] = write(a, src, addr + 8192, odp.rkey, 16).status
res["lazy_data"] = ctypes.string_at(addr + 8192, 16).decode()
imp = MR(pd, 0, RW | e.IBV_ACCESS_ON_DEMAND, implicit=True)
res["implicit"] = write(a, src, addr + 100, imp.rkey, 16).status
res["implicit_data"] = ctypes.string_at(addr + 100, 16).decode()
# Gone at access time (PROT_NONE in place, so nothing else can land
# there): an error status, never a crash.
libc.mmap(addr, n, 0, 0x32, -1, 0)   # PROT_NONE, MAP_PRIVATE|ANONYMOUS|FIXED
res["unmapped_remote"] = write(a, src, addr, odp.rkey, 16).status
c, d = pair()
res["unmapped_local"] = write(c, odp, src.buf, src.rkey, 16).status
res["codes"] = [e.IBV_WC_REM_ACCESS_ERR]
out(res)
""", env)
    assert r["lazy"] == 0 and r["lazy_data"] == "odp!" * 4
    assert r["implicit"] == 0 and r["implicit_data"] == "odp!" * 4
    assert r["unmapped_remote"] == r["codes"][0]
    assert r["unmapped_local"] != 0


def test_advise_mr(env):
    r = pyverbs(RC + MMAP + """
n = 1 << 16
addr = anon(n)
odp = MR(pd, n, RW | e.IBV_ACCESS_ON_DEMAND, address=addr)
plain = MR(pd, 4096, RW)
res = {}
for name in ("PREFETCH", "PREFETCH_WRITE", "PREFETCH_NO_FAULT"):
    adv = E("IBV_ADVISE_MR_ADVICE_" + name)
    res[name] = err(pd.advise_mr, adv, E("IBV_ADVISE_MR_FLAG_FLUSH"), [SGE(addr, n, odp.lkey)])
res["not_odp"] = err(pd.advise_mr, E("IBV_ADVISE_MR_ADVICE_PREFETCH"), 0,
                     [SGE(plain.buf, 4096, plain.lkey)])
res["bad_key"] = err(pd.advise_mr, E("IBV_ADVISE_MR_ADVICE_PREFETCH"), 0,
                     [SGE(addr, n, odp.lkey ^ 0x55)])
res["out_of_range"] = err(pd.advise_mr, E("IBV_ADVISE_MR_ADVICE_PREFETCH"), 0,
                          [SGE(addr, n + 4096, odp.lkey)])
out(res)
""", env)
    assert r["PREFETCH"] == 0 and r["PREFETCH_WRITE"] == 0 and r["PREFETCH_NO_FAULT"] == 0
    assert r["not_odp"] == errno.EINVAL and r["bad_key"] == errno.EINVAL
    assert r["out_of_range"] == errno.EINVAL
