# SPDX-License-Identifier: MIT
"""Debian's python3-pyverbs, unmodified, through our libibverbs.so.1."""
import errno
import os

import pytest

import svtest
from svtest import pyverbs


def test_device_list(env):
    r = pyverbs("""
l = d.get_device_list()
out([{"name": x.name.decode(), "guid": x.guid, "node_type": x.node_type} for x in l])
""", env)
    assert [x["name"] for x in r] == ["loop0"]
    assert r[0]["guid"] != 0
    assert r[0]["node_type"] == 1  # IBV_NODE_CA


def test_open_context_and_query_device(env):
    r = pyverbs("""
guid = d.get_device_list()[0].guid
with d.Context(name="loop0") as ctx:
    a = ctx.query_device()
    out({"list_guid": guid, "node_guid": a.node_guid, "ports": a.phys_port_cnt,
         "max_qp": a.max_qp, "max_cq": a.max_cq, "max_mr": a.max_mr, "max_pd": a.max_pd,
         "vendor": a.vendor_id})
""", env)
    assert r["ports"] == 1
    # ibv_query_device returns the GUID big-endian, the device list host
    # order (pyverbs converts neither): the same 8 bytes either way.
    assert r["node_guid"] in (r["list_guid"],
                              int.from_bytes(r["list_guid"].to_bytes(8, "big"), "little"))
    for k in ("max_qp", "max_cq", "max_mr", "max_pd"):
        assert r[k] > 0, k


def test_query_port(env):
    r = pyverbs("""
with d.Context(name="loop0") as ctx:
    p = ctx.query_port(1)
    out({"state": p.state, "lid": p.lid, "ll": p.link_layer, "gids": p.gid_tbl_len,
         "pkeys": p.pkey_tbl_len, "mtu": p.active_mtu, "active": e.IBV_PORT_ACTIVE,
         "ib": e.IBV_LINK_LAYER_INFINIBAND})
""", env)
    assert r["state"] == r["active"]
    assert r["lid"] != 0
    assert r["ll"] == r["ib"]
    assert r["gids"] >= 1 and r["pkeys"] >= 1
    assert 1 <= r["mtu"] <= 5


def test_query_gid_is_link_local_with_port_guid(env, fabric):
    r = pyverbs("""
with d.Context(name="loop0") as ctx:
    out({"gid": str(ctx.query_gid(1, 0))})
""", env)
    gid = r["gid"]
    assert gid.startswith("fe80:0000:0000:0000:"), gid
    # The interface id is the port GUID that the registry holds; read it
    # from the segment, not from the library under test.
    import softverbs_fabric
    port = softverbs_fabric.fabric(fabric)["devices"][0]["ports"][0]
    assert gid == "fe80:0000:0000:0000:" + svtest.format_guid(port["port_guid"])


def test_query_pkey(env):
    r = pyverbs("""
with d.Context(name="loop0") as ctx:
    out(ctx.query_pkey(1, 0))
""", env)
    assert r == 0xffff  # The default partition, full membership


def test_two_devices_have_distinct_guids_and_lids(env):
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    r = pyverbs("""
res = []
for dev in d.get_device_list():
    with d.Context(name=dev.name.decode()) as ctx:
        res.append({"name": dev.name.decode(), "guid": ctx.query_device().node_guid,
                    "lid": ctx.query_port(1).lid, "gid": str(ctx.query_gid(1, 0))})
out(res)
""", env)
    assert [x["name"] for x in r] == ["loop0", "loop1"]
    assert r[0]["guid"] != r[1]["guid"]
    assert r[0]["lid"] != r[1]["lid"]
    assert 0 not in (r[0]["lid"], r[1]["lid"])
    assert r[0]["gid"] != r[1]["gid"]


def test_processes_on_one_fabric_agree(env):
    """The registry is shared: a second process with a longer device list
    sees the first one's records unchanged and adds its own."""
    code = """
res = {}
for dev in d.get_device_list():
    with d.Context(name=dev.name.decode()) as ctx:
        res[dev.name.decode()] = [ctx.query_device().node_guid, ctx.query_port(1).lid]
out(res)
"""
    first = pyverbs(code, env)
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    second = pyverbs(code, env)
    assert second["loop0"] == first["loop0"]
    assert second["loop1"][1] not in (0, first["loop0"][1])


def test_fabrics_are_separate(env, fabric):
    code = """
with d.Context(name="loop0") as ctx:
    out([ctx.query_device().node_guid, ctx.query_port(1).lid])
"""
    a = pyverbs(code, env)
    other = svtest.new_fabric_name()
    try:
        env["SOFTVERBS_FABRIC"] = other
        b = pyverbs(code, env)
    finally:
        svtest.remove_fabric(other)
    assert a[0] != b[0], "the same device name on two fabrics is two HCAs"


@pytest.mark.parametrize("call", [
    "ctx.query_port(0)",
    "ctx.query_port(2)",
    "ctx.query_port(255)",
    "ctx.query_gid_ex(1, 16)",
    "ctx.query_gid_ex(1, 1000)",
    "ctx.query_gid_ex(2, 0)",
    "ctx.query_gid_ex(0, 0)",
])
def test_bad_port_or_index_raises_einval(env, call):
    # The GID table has 16 slots (gid_tbl_len); index 16 is past its end.
    r = pyverbs(f"""
with d.Context(name="loop0") as ctx:
    try:
        {call}
        out({{"raised": False}})
    except PyverbsRDMAError as ex:
        out({{"raised": True, "errno": ex.error_code, "msg": str(ex)}})
""", env)
    assert r["raised"], f"{call} did not raise"
    assert r["errno"] == errno.EINVAL, r


@pytest.mark.parametrize("call", [
    "lib.ibv_query_gid(ctx, 1, 16, buf)",
    "lib.ibv_query_gid(ctx, 2, 0, buf)",
    "lib.ibv_query_pkey(ctx, 1, 4096, buf)",
    "lib.ibv_query_pkey(ctx, 3, 0, buf)",
])
def test_bad_index_sets_errno_einval(env, call):
    """pyverbs' query_gid/query_pkey drop errno; check it at the C API."""
    r = pyverbs(f"""
import ctypes, ctypes.util
lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
lib.ibv_open_device.restype = ctypes.c_void_p
lib.ibv_open_device.argtypes = [ctypes.c_void_p]
lib.ibv_query_gid.argtypes = [ctypes.c_void_p, ctypes.c_uint8, ctypes.c_int, ctypes.c_void_p]
lib.ibv_query_pkey.argtypes = [ctypes.c_void_p, ctypes.c_uint8, ctypes.c_int, ctypes.c_void_p]
n = ctypes.c_int()
devs = lib.ibv_get_device_list(ctypes.byref(n))
ctx = lib.ibv_open_device(devs[0])
assert ctx
buf = ctypes.create_string_buffer(16)
ok = lib.ibv_query_gid(ctx, 1, 0, buf)
ctypes.set_errno(0)
ret = {call}
out({{"ok": ok, "ret": ret, "errno": ctypes.get_errno(), "path": lib._name}})
""", env)
    assert r["ok"] == 0, "the good query must work for the bad one to mean anything"
    assert r["ret"] == -1
    assert r["errno"] == errno.EINVAL, r


@pytest.mark.parametrize("var,value,why", [
    ("SOFTVERBS_DEVICES", "bad name", "'bad name' is not a device name"),
    ("SOFTVERBS_DEVICES", "loop0,,loop1", "'' is not a device name"),
    ("SOFTVERBS_DEVICES", "loop0,loop0", "'loop0' is listed twice"),
    ("SOFTVERBS_FABRIC", "no/slash", "'no/slash' is not a fabric name"),
    ("SOFTVERBS_FABRIC", "x" * 33, "is not a fabric name"),
])
def test_bad_variable_is_reported_by_name(env, var, value, why):
    env[var] = value
    p = svtest.run([svtest.PYTHON, "-c", """
import pyverbs.device as d
from pyverbs.pyverbs_error import PyverbsRDMAError
try:
    l = d.get_device_list()
except PyverbsRDMAError:
    raise SystemExit(3)
raise SystemExit(0 if not l else 4)
"""], env)
    assert p.returncode in (0, 3), p.stderr  # No devices, or an error: never a device
    assert f"softverbs: {var}: " in p.stderr, p.stderr
    assert why in p.stderr, p.stderr
    if var == "SOFTVERBS_FABRIC":
        assert not os.path.exists(f"/dev/shm/{svtest.segment_prefix()}{value}")


def test_empty_gid_slot_is_enodata(env):
    """An InfiniBand port fills GID index 0 only, as HCAs do: the other slots
    of its 16-entry table are empty (ENODATA), and ibv_query_gid reads zeros."""
    r = pyverbs("""
with d.Context(name="loop0") as ctx:
    assert ctx.query_port(1).gid_tbl_len == 16
    try:
        ctx.query_gid_ex(1, 1)
        out({"raised": False})
    except PyverbsRDMAError as ex:
        out({"raised": True, "errno": ex.error_code, "zero": str(ctx.query_gid(1, 1))})
""", env)
    assert r["raised"] and r["errno"] == errno.ENODATA, r
    assert r["zero"] == "0000:0000:0000:0000:0000:0000:0000:0000", r


def test_import_of_another_process_context_is_not_supported(env):
    """ibv_import_device takes a command fd of a context of this process
    (design.md, "Device memory and imports").  A context's fd of another
    process (here reopened through /proc, as one passed over a socket would
    be) is EOPNOTSUPP, not EINVAL as for an fd that is no context at all;
    one of this process imports."""
    r = pyverbs(r"""
import os, subprocess, sys
ctx = d.Context(name="loop0")
mine = d.Context(cmd_fd=os.dup(ctx.cmd_fd))
child = '''
import os, sys, json
import pyverbs.device as d
from pyverbs.pyverbs_error import PyverbsRDMAError
res = {}
for name, path in (("theirs", sys.argv[1]), ("memfd", None)):
    fd = os.open(path, os.O_RDWR) if path else os.memfd_create("other")
    try:
        d.Context(cmd_fd=fd)
        res[name] = 0
    except PyverbsRDMAError as e:
        res[name] = e.error_code
print(json.dumps(res))
'''
p = subprocess.run([sys.executable, "-c", child, f"/proc/{os.getpid()}/fd/{ctx.cmd_fd}"],
                   capture_output=True, text=True, timeout=60)
out(dict(json.loads(p.stdout.splitlines()[-1]), imported=mine.cmd_fd >= 0))
""", env)
    assert r == {"theirs": errno.EOPNOTSUPP, "memfd": errno.EINVAL, "imported": True}, r
