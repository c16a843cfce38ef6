# SPDX-License-Identifier: MIT
"""ibv_open_qp: a forked process opens another's XRC target QP by number
through a shared XRC domain, modifies it through its handle and closes the
handle; the QP lives on with its creator (tests/progs/sv_open_qp.c), and
on without it while another process holds it open (sv_xrc_share.c)."""
import errno

import pytest

import svtest


def test_open_xrc_target_qp_from_another_process(build_dir, env):
    prog = build_dir / "tests" / "progs" / "sv_open_qp"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir}")
    p = svtest.run([str(prog)], env, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.stdout, p.stderr)


@pytest.mark.parametrize("mode", ["destroy", "exit", "kill"])
def test_xrc_target_qp_outlives_its_creator(build_dir, env, mode):
    """The creator of a shared XRC target QP lets go of it (destroys it,
    exits without cleaning up, or is killed) while another process holds
    it open: traffic through it still arrives whole, and the last handle's
    close ends it (tests/progs/sv_xrc_share.c)."""
    prog = build_dir / "tests" / "progs" / "sv_xrc_share"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir}")
    p = svtest.run([str(prog), mode], env, timeout=150)
    assert p.returncode == 0 and p.stdout.strip() == f"OK sv_xrc_share {mode}", \
        (p.returncode, p.stdout, p.stderr)


def test_cq_moderation_by_count(build_dir, env):
    """ibv_modify_cq with cq_count 4: the channel signals on the 4th
    completion, not before; a period is refused (tests/progs/sv_cq_mod.c)."""
    prog = build_dir / "tests" / "progs" / "sv_cq_mod"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir}")
    p = svtest.run([str(prog)], env, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.stdout, p.stderr)


XRCD_CHILD = r"""
import os, sys
import pyverbs.device as d
from pyverbs.xrcd import XRCD, XRCDInitAttr
import pyverbs.enums as e
ctx = d.Context(name="loop0")
fd = os.open(sys.argv[1], os.O_RDONLY)
x = XRCD(ctx, XRCDInitAttr(e.IBV_XRCD_INIT_ATTR_FD | e.IBV_XRCD_INIT_ATTR_OFLAGS, os.O_CREAT, fd))
print("holding", flush=True)
sys.stdin.read()
"""


def test_xrc_domain_oflags_across_processes(env, tmp_path):
    """ibv_open_xrcd on a file as the kernel answers it: without O_CREAT a
    domain must exist (EAGAIN), with O_EXCL it must not (EINVAL); a handle
    held by another process is the domain existing, one of a process
    killed is not; bits beside O_CREAT and O_EXCL are ignored; comp_mask
    needs both the descriptor and the flags (EINVAL), and an unknown bit
    is EOPNOTSUPP (rdma-core's ibv_cmd_open_xrcd).  Before, any call made
    or joined the domain."""
    import os
    import signal
    import subprocess
    path = tmp_path / "xrcd-file"
    path.write_bytes(b"")
    r = svtest.pyverbs(f"""
import os, subprocess, signal
from pyverbs.xrcd import XRCD, XRCDInitAttr
ctx = d.Context(name="loop0")
FD, FL = e.IBV_XRCD_INIT_ATTR_FD, e.IBV_XRCD_INIT_ATTR_OFLAGS
fd = os.open({str(path)!r}, os.O_RDONLY)
def op(flags, mask=FD | FL):
    try:
        return XRCD(ctx, XRCDInitAttr(mask, flags, fd))
    except PyverbsRDMAError as ex:
        return errno.errorcode.get(ex.error_code, ex.error_code)
res = {{}}
res["none"] = op(0)
x1 = op(os.O_CREAT)
res["create"] = isinstance(x1, XRCD)
res["excl"] = op(os.O_CREAT | os.O_EXCL)
x2 = op(0)
res["join"] = isinstance(x2, XRCD)
x1.close(); x2.close()
res["after_close"] = op(0)
child = subprocess.Popen([sys.executable, "-c", {XRCD_CHILD!r}, {str(path)!r}],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
line = child.stdout.readline()
if "holding" in line:
    pass
else:
    res["child"] = line
res["child_holds"] = op(0)
res["child_holds"] = isinstance(res["child_holds"], XRCD) and (res["child_holds"].close() or True)
res["child_excl"] = op(os.O_CREAT | os.O_EXCL)
child.kill(); child.wait()
res["child_killed"] = op(0)
x3 = op(os.O_CREAT | os.O_RDWR)
res["extra_bits"] = isinstance(x3, XRCD)
x3.close()
res["no_oflags"] = op(os.O_CREAT, FD)
res["unknown_bit"] = op(os.O_CREAT, FD | FL | 4)
out({{k: (v if isinstance(v, (str, bool, int)) else repr(v)) for k, v in res.items()}})
""", env)
    assert r == {"none": "EAGAIN", "create": True, "excl": "EINVAL", "join": True,
                 "after_close": "EAGAIN", "child_holds": True, "child_excl": "EINVAL",
                 "child_killed": "EAGAIN", "extra_bits": True, "no_oflags": "EINVAL",
                 "unknown_bit": errno.errorcode[errno.EOPNOTSUPP]}, r
