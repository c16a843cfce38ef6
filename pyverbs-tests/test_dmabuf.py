# SPDX-License-Identifier: MIT
"""ibv_reg_dmabuf_mr and softverbs_reg_mr_fd / softverbs_rereg_mr_fd, called
through ctypes (pyverbs allocates dma-bufs only from a GPU).  Data moving
between processes through fd-backed MRs is checked by test_invalidate's run
of docs/examples/fastreg_fd."""
import errno
import os

import pytest

from svtest import pyverbs

CT = r"""
import ctypes, os, tempfile
lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
P = ctypes.c_void_p
lib.ibv_get_device_list.restype = ctypes.POINTER(P)
lib.ibv_open_device.restype = P
lib.ibv_open_device.argtypes = [P]
lib.ibv_alloc_pd.restype = P
lib.ibv_alloc_pd.argtypes = [P]
lib.ibv_reg_dmabuf_mr.restype = P
lib.ibv_reg_dmabuf_mr.argtypes = [P, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint64,
                                  ctypes.c_int, ctypes.c_int]
lib.softverbs_reg_mr_fd.restype = P
lib.softverbs_reg_mr_fd.argtypes = [P, ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                                    ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint]
lib.softverbs_rereg_mr_fd.argtypes = [P, ctypes.c_int, P, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint64,
                                      ctypes.c_uint]
lib.ibv_dereg_mr.argtypes = [P]
LW, RW = 1, 1 | 2 | 4
DMABUF, MEMFD = 1, 2
ctx = lib.ibv_open_device(lib.ibv_get_device_list(None)[0])
pd = lib.ibv_alloc_pd(ctx)

def keys(mr):
    v = (ctypes.c_uint32 * 3).from_address(mr + 32)
    return v[1], v[2]

def reg(fd, off, n, access=RW, kind=MEMFD, dmabuf=False, iova=0x1000):
    ctypes.set_errno(0)
    if dmabuf:
        mr = lib.ibv_reg_dmabuf_mr(pd, off, n, iova, fd, access)
    else:
        mr = lib.softverbs_reg_mr_fd(pd, fd, kind, off, n, iova, access)
    return mr, (0 if mr else ctypes.get_errno())

def memfd(n):
    fd = os.memfd_create("t")
    os.ftruncate(fd, n)
    return fd
"""


def test_reg_fd_kinds_and_errors(env, tmp_path):
    (tmp_path / "ro").write_bytes(b"\0" * 8192)
    r = pyverbs(CT + """
res = {}
fd = memfd(1 << 16)
mr, res["memfd"] = reg(fd, 4096, 8192)
res["keys"] = keys(mr)
os.close(fd)   # The MR keeps its own reference
res["dereg"] = lib.ibv_dereg_mr(mr)
shm = os.open("/dev/shm/sv-dmabuf-%d" % os.getpid(), os.O_RDWR | os.O_CREAT, 0o600)
os.unlink("/dev/shm/sv-dmabuf-%d" % os.getpid())
os.ftruncate(shm, 1 << 16)
mr, res["shm"] = reg(shm, 0, 1 << 16)
mr2, res["dmabuf_verb"] = reg(shm, 4096 + 100, 1000, dmabuf=True, iova=0x1000 + 100)
# The IOVA keeps the offset's place in its page (ibv_reg_mr(3)), else EINVAL.
res["iova_page_offset"] = reg(shm, 100, 1000, dmabuf=True)[1]
res["bad_fd"] = reg(-1, 0, 4096)[1]
res["closed_fd"] = reg(9999, 0, 4096)[1]
res["past_end"] = reg(shm, 61440, 8192)[1]
res["zero_len"] = reg(shm, 0, 0)[1]
res["bad_type"] = reg(shm, 0, 4096, kind=7)[1]
res["bad_access"] = reg(shm, 0, 4096, access=2)[1]
ro = os.open(tmpf, os.O_RDONLY)
res["unmappable"] = reg(ro, 0, 4096)[1]
res["read_only_ok"] = reg(ro, 0, 4096, access=4)[1]
res["rereg_pd_access"] = lib.softverbs_rereg_mr_fd(mr, 2 | 4, pd, -1, 0, 0, 0, 0, LW)
res["rereg_move"] = lib.softverbs_rereg_mr_fd(mr, 1, None, shm, MEMFD, 8192, 4096, 0, 0)
res["rereg_bad"] = lib.softverbs_rereg_mr_fd(mr, 1, None, shm, MEMFD, 1 << 20, 4096, 0, 0)
res["rereg_keys_kept"] = keys(mr)
out(res)
""".replace("tmpf", repr(str(tmp_path / "ro"))), env)
    assert r["memfd"] == 0 and r["dereg"] == 0 and r["keys"][0] == r["keys"][1]
    assert r["shm"] == 0 and r["dmabuf_verb"] == 0
    assert r["iova_page_offset"] == errno.EINVAL
    assert r["bad_fd"] == errno.EBADF and r["closed_fd"] == errno.EBADF
    assert r["past_end"] == errno.EINVAL and r["zero_len"] == errno.EINVAL
    assert r["bad_type"] == errno.EINVAL and r["bad_access"] == errno.EINVAL
    assert r["unmappable"] == errno.EACCES and r["read_only_ok"] == 0
    assert r["rereg_pd_access"] == 0 and r["rereg_move"] == 0
    assert r["rereg_bad"] == errno.EINVAL


@pytest.mark.skipif(not os.path.exists("/dev/udmabuf"), reason="no /dev/udmabuf here")
def test_udmabuf(env):
    r = pyverbs(CT + """
import fcntl
fd = memfd(1 << 16)
fcntl.fcntl(fd, 1033, 2 | 4)   # F_ADD_SEALS: F_SEAL_SHRINK | F_SEAL_GROW, as udmabuf needs
libc = ctypes.CDLL(None, use_errno=True)
class Create(ctypes.Structure):
    _fields_ = [("memfd", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("offset", ctypes.c_uint64), ("size", ctypes.c_uint64)]
u = os.open("/dev/udmabuf", os.O_RDWR)
c = Create(fd, 1, 0, 1 << 16)   # UDMABUF_FLAGS_CLOEXEC
dfd = libc.ioctl(u, 0x40187542, ctypes.byref(c))   # UDMABUF_CREATE
mr, err = reg(dfd, 4096, 8192, kind=DMABUF, dmabuf=True)
out([dfd >= 0, err])
""", env)
    assert r == [True, 0]
