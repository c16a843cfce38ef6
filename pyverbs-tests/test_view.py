# SPDX-License-Identifier: MIT
"""The view (docs/design.md, "The view"): what programs run through
softverbs-run see under /sys/class/infiniband*, /sys/devices/virtual/
infiniband* and /dev/infiniband, reached through every libc entry point
(tests/progs/sv_viewprobe.c, one per call), Python, coreutils and
infiniband-diags, checked against ibv_devinfo -v and softverbs show on two
devices: loop0 with two InfiniBand ports, loop1 with one Ethernet port."""
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import pytest

from svtest import PYTHON, format_guid, run

CONFIG = """devices = loop0, loop1
loop0.ports = 2
loop1.link_layer = ethernet
"""
IB = "/sys/class/infiniband"


@pytest.fixture
def view_env(tool_env):
    """Two devices on the test's fabric; softverbs-run sets the library path."""
    pathlib.Path(tool_env["SOFTVERBS_CONFIG"]).write_text(CONFIG)
    return tool_env


@pytest.fixture
def probe(build_dir):
    return str(build_dir / "tests" / "progs" / "sv_viewprobe")


@pytest.fixture
def vrun(softverbs_run, view_env):
    """Runs argv through softverbs-run; returns stdout (checked)."""
    def go(*argv, check=True, env=None):
        p = run([softverbs_run, *argv], env or view_env, check=check)
        return p.stdout if check else p
    return go


def devinfo(text):
    """{hca: {"node_guid", "sys_image_guid", "fw_ver", "ports": {n: {...}}}}
    from ibv_devinfo -v."""
    hcas = {}
    cur = port = None
    for line in text.splitlines():
        m = re.match(r"hca_id:\s+(\S+)", line)
        if m:
            cur = hcas.setdefault(m.group(1), {"ports": {}})
            port = None
            continue
        m = re.match(r"\s+port:\s+(\d+)", line)
        if m and cur is not None:
            port = cur["ports"].setdefault(int(m.group(1)), {"gids": {}})
            continue
        m = re.match(r"\s+(\w+):\s+(.*\S)", line)
        if not m or cur is None:
            g = re.match(r"\s+GID\[\s*(\d+)\]:\s+(\S+?),?(?:\s+(RoCE v2|RoCE v1|IB))?$", line)
            if g and port is not None:
                port["gids"][int(g.group(1))] = g.group(2)
            continue
        key, val = m.group(1), m.group(2)
        if port is not None:
            port[key] = val
        else:
            cur[key] = val
    return hcas


def ipv6_full(text):
    """An ibv_devinfo GID (IPv6 text) as sysfs prints it (8 groups of 4)."""
    import ipaddress
    if re.fullmatch(r"([0-9a-f]{4}:){7}[0-9a-f]{4}", text):
        return text
    return ipaddress.IPv6Address(text).exploded


def cat(probe, vrun, path):
    return vrun(probe, "cat", path).rstrip("\n")


def test_values_agree_with_ibv_devinfo_and_softverbs_show(probe, vrun, softverbs, view_env,
                                                          fabric):
    info = devinfo(vrun("ibv_devinfo", "-v"))
    assert sorted(info) == ["loop0", "loop1"]
    show = run([softverbs, "show", fabric], view_env, check=True).stdout
    ls = vrun(probe, "scandir", IB).split()
    assert ls == ["loop0", "loop1"]
    for hca, d in info.items():
        base = f"{IB}/{hca}"
        assert cat(probe, vrun, base + "/node_guid") == d["node_guid"]
        assert f"device {hca}" in show and d["node_guid"] in show
        assert cat(probe, vrun, base + "/sys_image_guid") == d["sys_image_guid"]
        assert cat(probe, vrun, base + "/fw_ver") == d["fw_ver"]
        assert cat(probe, vrun, base + "/node_type") == "1: CA"
        assert cat(probe, vrun, base + "/hca_type") == "loop"
        assert cat(probe, vrun, base + "/board_id") == "SOFTVERBS_LOOP"
        ports = vrun(probe, "scandir", base + "/ports").split()
        assert ports == [str(p) for p in sorted(d["ports"])]
        for n, p in d["ports"].items():
            pd = f"{base}/ports/{n}"
            state = re.match(r"PORT_(\w+) \((\d+)\)", p["state"])
            assert cat(probe, vrun, pd + "/state") == f"{state.group(2)}: {state.group(1)}"
            assert cat(probe, vrun, pd + "/lid") == "0x%x" % int(p["port_lid"])
            assert cat(probe, vrun, pd + "/sm_lid") == "0x%x" % int(p["sm_lid"])
            assert cat(probe, vrun, pd + "/lid_mask_count") == p["port_lmc"].split()[0].replace(
                "0x", "").lstrip("0") or "0"
            assert cat(probe, vrun, pd + "/link_layer") == p["link_layer"]
            phys = re.match(r"(\w+) \((\d+)\)", p["phys_state"])
            assert cat(probe, vrun, pd + "/phys_state") == f"{phys.group(2)}: LinkUp"
            assert cat(probe, vrun, pd + "/rate") == "100 Gb/sec (4X EDR)"
            assert cat(probe, vrun, pd + "/pkeys/0") == "0xffff"
            for i, gid in p["gids"].items():
                assert cat(probe, vrun, f"{pd}/gids/{i}") == ipv6_full(gid)
                t = cat(probe, vrun, f"{pd}/gid_attrs/types/{i}")
                assert t == ("RoCE v2" if p["link_layer"] == "Ethernet" else "IB/RoCE v1")
            if p["link_layer"] == "InfiniBand":
                # LID agrees with softverbs show, GID 0 is fe80::<port GUID>
                assert re.search(rf"port {n}\n(.*\n){{2}}\s+LID:\s+{int(p['port_lid'])} ",
                                 show[show.index(f"device {hca}"):])
                port_guid = cat(probe, vrun, f"{pd}/gids/0")[20:]
                assert port_guid in show
                assert vrun(probe, "cat", f"{pd}/gid_attrs/ndevs/0").strip() == "errno 2"
            else:
                assert cat(probe, vrun, f"{pd}/gid_attrs/ndevs/0") == "lo"
            # An unused GID entry reads as zeros, as the kernel's do.
            unused = len(p["gids"])
            assert cat(probe, vrun, f"{pd}/gids/{unused}") == ":".join(["0000"] * 8)
    # uverbs devices name their ibdev
    assert cat(probe, vrun, "/sys/class/infiniband_verbs/uverbs0/ibdev") == "loop0"
    assert cat(probe, vrun, "/sys/class/infiniband_verbs/uverbs1/ibdev") == "loop1"
    assert cat(probe, vrun, "/sys/class/infiniband_verbs/uverbs1/abi_version") == "6"
    assert cat(probe, vrun, "/sys/class/infiniband_verbs/abi_version") == "6"
    assert cat(probe, vrun, "/sys/class/infiniband_verbs/uverbs1/dev") == "231:193"


def test_ibstat_and_ibstatus_agree_with_ibv_devinfo(vrun):
    if not shutil.which("ibstat"):
        pytest.skip("infiniband-diags not installed (scripts/deps.sh installs it)")
    info = devinfo(vrun("ibv_devinfo", "-v"))
    out = vrun("ibstat")
    cas = re.split(r"^CA '", out, flags=re.M)[1:]
    assert [c.split("'")[0] for c in cas] == ["loop0", "loop1"], out
    for ca in cas:
        name = ca.split("'")[0]
        d = info[name]
        assert f"Number of ports: {len(d['ports'])}" in ca
        assert f"Firmware version: {d['fw_ver']}" in ca
        assert "Node GUID: 0x" + d["node_guid"].replace(":", "") in ca
        assert "System image GUID: 0x" + d["sys_image_guid"].replace(":", "") in ca
        for n, p in d["ports"].items():
            block = re.split(r"\n\tPort \d+:", ca.split(f"\tPort {n}:")[1])[0]
            assert "State: Active" in block
            assert "Physical state: LinkUp" in block
            assert f"Base lid: {int(p['port_lid'])}" in block
            assert f"SM lid: {int(p['sm_lid'])}" in block
            assert f"Link layer: {p['link_layer']}" in block
            gid0 = ipv6_full(p["gids"][0]).replace(":", "")
            assert f"Port GUID: 0x{gid0[16:]}" in block
    assert vrun("ibstat", "-l").split() == ["loop0", "loop1"]
    st = vrun("ibstatus")
    for name, d in info.items():
        for n, p in d["ports"].items():
            block = st.split(f"device '{name}' port {n} status:")[1].split("device '")[0]
            assert f"base lid:\t 0x{int(p['port_lid']):x}" in block
            assert f"default gid:\t {ipv6_full(p['gids'][0])}" in block
            assert f"link_layer:\t {p['link_layer']}" in block


def test_mad_tools_fail_cleanly(vrun):
    """No umad device: MAD tools say so and exit non-zero, promptly."""
    for tool in ("ibnetdiscover", "sminfo", "perfquery"):
        if not shutil.which(tool):
            continue
        p = vrun(tool, check=False)
        assert p.returncode != 0
        assert "can't open UMAD port" in p.stderr, p.stderr


@pytest.mark.parametrize("op,args,expect", [
    ("cat", [f"{IB}/loop0/node_guid"], "guid"),
    ("fopen", [f"{IB}/loop0/node_guid"], "guid"),
    ("openat-dir", [IB, "loop0/node_guid"], "guid"),
    ("openat-odir", [IB + "/loop0", "node_guid"], "guid"),
    ("openat-odir", ["/", "sys/class/infiniband/loop0/node_guid"], "guid"),  # hwloc
    ("openat-dir", [IB + "/loop0/ports", "../node_guid"], "guid"),
    ("cwd", ["/sys/class", "infiniband/loop0/node_guid"], "guid"),
    ("cwd", [IB + "/loop0", "node_guid"], "guid"),
    ("cat", [f"//sys//class/./infiniband//loop1/../loop0/node_guid"], "guid"),
    ("cat", [f"{IB}/../infiniband/loop0/ports/../node_guid"], "guid"),
    ("cat", [f"/dev/../sys/class/infiniband/loop0/node_guid"], "guid"),
    ("stat", [IB], "d 0:0 755"),
    ("stat", [IB + "/"], "d 0:0 755"),
    ("stat", [f"{IB}/loop0"], "d 0:0 755"),
    ("lstat", [f"{IB}/loop0"], "l 0:0 777"),
    ("statx", [f"{IB}/loop0/node_guid"], "f 0:0 444"),
    ("fstatat", [f"{IB}/loop0", "ports"], "d 0:0 755"),
    ("access", [f"{IB}/loop0/node_guid", "r"], "ok"),
    ("access", [f"{IB}/loop0/node_guid", "w"], "errno 13"),
    ("readlink", [f"{IB}/loop0"], "../../devices/virtual/infiniband/loop0"),
    ("readlink", [f"{IB}/loop0/device"], "../../infiniband_hca/loop0"),
    ("readlink", [f"{IB}/loop1/device/net/lo"], "/sys/class/net/lo"),
    ("realpath", [f"{IB}/loop0/ports/"], "/sys/devices/virtual/infiniband/loop0/ports"),
    ("realpath", [f"{IB}/loop1/device/net/lo"], "/sys/devices/virtual/net/lo"),
    ("realpath", ["/sys/class/infiniband_verbs/uverbs1/device"],
     "/sys/devices/virtual/infiniband_hca/loop1"),
    ("scandir", [f"{IB}/loop0/device/net"], "lo"),
    ("scandir", [f"{IB}/loop1/device/net/"], "lo"),
    ("scandir", ["/dev/infiniband"], "uverbs0 uverbs1"),
    ("scandir", ["/sys/class/infiniband_verbs"], "abi_version uverbs0 uverbs1"),
    ("scandir", ["/sys/class/infiniband_mad"], "abi_version"),
    # What does not exist under the view is ENOENT, wherever it is asked.
    ("cat", [f"{IB}/loop2/node_guid"], "errno 2"),
    ("cat", [f"{IB}/loop0/ports/3/lid"], "errno 2"),
    ("stat", [f"{IB}/loop0/no_such_file"], "errno 2"),
    ("statx", ["/dev/infiniband/uverbs2"], "errno 2"),
    ("stat", ["/dev/infiniband/umad0"], "errno 2"),
    ("access", ["/dev/infiniband/rdma_cm", "rw"], "errno 2"),
    ("scandir", [f"{IB}/loop9"], "errno 2"),
    ("openat-dir", [IB, "loop0/nothing"], "errno 2"),
    ("readlink", [f"{IB}/loop0/nothing"], "errno 2"),
    ("realpath", [f"{IB}/nothing"], "errno 2"),
    # A file with a trailing slash, as the kernel says.
    ("cat", [f"{IB}/loop0/node_guid/"], "errno 20"),
    # Attributes are read-only (sysfs's are, for a user).
    ("fopen", [f"{IB}/loop0/node_guid", "w"], "errno 13"),
    ("openw", [f"{IB}/loop0/node_guid"], "errno 13"),
    ("openw", [f"{IB}/loop0/new_file", "create"], "errno 13"),
    ("openw", [f"{IB}/loop0/no_such_file"], "errno 2"),
])
def test_path_variants(probe, vrun, op, args, expect):
    guid = cat(probe, vrun, f"{IB}/loop0/node_guid")
    assert re.fullmatch(r"([0-9a-f]{4}:){3}[0-9a-f]{4}", guid), guid
    out = vrun(probe, op, *args).strip()
    if op == "cwd":
        out = out.splitlines()[-1]
    if op in ("stat", "lstat", "statx", "fstatat") and not expect.startswith("errno"):
        out = out.split()[0] + " 0:0 " + out.split()[2]
        if expect.startswith("l "):
            out = out[:6] + "777"  # A symlink's mode is 0777 everywhere
    assert out == (guid if expect == "guid" else expect)


def test_dotdot_out_of_the_view_reaches_the_real_tree(probe, vrun):
    """A '..' out of an emulated directory is the real parent, listed as the
    real one is (the host may have no /sys/class/infiniband at all)."""
    real = sorted(os.listdir("/sys/class"))
    n = len([e for e in real if not e.startswith(".")])
    assert vrun(probe, "readdir", f"{IB}/..").strip() == str(n)
    assert vrun(probe, "readdir", f"{IB}/loop0/../../").strip() != "errno 2"
    assert vrun(probe, "cat", f"{IB}/../../class/net/lo/ifindex").strip() == "1"
    assert vrun(probe, "openat-dir", IB, "../net/lo/ifindex").strip() == "1"
    assert vrun(probe, "cwd", IB, "../net/lo/ifindex").strip().splitlines()[-1] == "1"


def test_uverbs_is_a_character_device_whose_commands_fail(probe, vrun):
    for n in (0, 1):
        dev = f"/dev/infiniband/uverbs{n}"
        for op in ("stat", "statx", "lstat"):
            assert vrun(probe, op, dev).split() == ["c", f"231:{192 + n}", "666"]
        assert vrun(probe, "fstatat", "/dev/infiniband", f"uverbs{n}").split()[:2] == \
            ["c", f"231:{192 + n}"]
        assert vrun(probe, "access", dev, "rw").strip() == "ok"
        out = vrun(probe, "uverbs", dev)
        assert f"fstat c 231:{192 + n}" in out
        for call in ("write", "ioctl", "read", "dup-write"):
            assert f"{call} -1 errno 19" in out, out  # ENODEV
        assert "pipe-write 1 errno 0" in out  # an fd number reused is not refused
    # What UCX checks (stat, S_ISCHR, access R_OK|W_OK), from the shell too
    assert vrun("bash", "-c", "[[ -c /dev/infiniband/uverbs0 && -r /dev/infiniband/uverbs0 "
                "&& -w /dev/infiniband/uverbs0 ]] && echo yes").strip() == "yes"
    # A device the fabric does not have, and a directory
    assert vrun(probe, "uverbs", "/dev/infiniband/uverbs5").strip() == "errno 2"
    assert vrun(probe, "scandir", "/dev/infiniband/uverbs0").strip() == "errno 20"


def test_python_and_coreutils_see_the_view(vrun, probe):
    code = ("import os, json; b = '/sys/class/infiniband'; print(json.dumps([sorted(os.listdir(b)),"
            " os.path.realpath(b + '/loop1/device/net/lo'), open(b + '/loop0/ports/2/lid').read(),"
            " os.path.exists(b + '/loop0/device/net/'), [e.name for e in os.scandir(b + '/loop0/ports')],"
            " os.readlink(b + '/loop0'), os.access('/dev/infiniband/uverbs0', os.R_OK | os.W_OK)]))")
    import json
    got = json.loads(vrun(PYTHON, "-c", code))
    assert got[0] == ["loop0", "loop1"]
    assert got[1] == "/sys/devices/virtual/net/lo"
    assert got[2] == "0x2\n"
    assert got[3] is True
    assert sorted(got[4]) == ["1", "2"]
    assert got[5] == "../../devices/virtual/infiniband/loop0"
    assert got[6] is True
    # What rdma-core's tests run: ls of device/net/, then ip on its first line
    assert vrun("ls", f"{IB}/loop1/device/net/").split() == ["lo"]
    assert vrun("cat", f"{IB}/loop0/ports/1/state").strip() == "4: ACTIVE"
    ls = vrun("ls", "-l", "/dev/infiniband/")
    assert re.search(r"^crw-rw-rw- .* 231, 192 .* uverbs0$", ls, re.M), ls
    assert sorted(vrun("find", "/sys/class/infiniband/", "-maxdepth", "1", "-name", "loop*").split()) == \
        [f"{IB}/loop0", f"{IB}/loop1"]


def test_paths_outside_the_view_are_untouched(probe, vrun, view_env, tmp_path):
    # A real path whose name contains "infiniband" is looked at, and left alone.
    d = tmp_path / "infiniband"
    d.mkdir()
    (d / "notes").write_text("mine\n")
    assert vrun(probe, "cat", str(d / "notes")).strip() == "mine"
    assert vrun(probe, "openw", str(d / "new"), "create").strip() == "opened"
    assert (d / "new").exists()
    assert vrun(probe, "realpath", str(d / ".." / "infiniband" / "notes")).strip() == \
        str(d / "notes")
    os.symlink("infiniband", tmp_path / "link")
    assert vrun(probe, "readlink", str(tmp_path / "link")).strip() == "infiniband"
    for path in ("/etc/hostname", "/proc/self/comm", "/sys/class/net/lo/ifindex"):
        if os.path.exists(path):
            want = run([probe, "cat", path], view_env, check=True).stdout
            got = vrun(probe, "cat", path)
            if path != "/proc/self/comm":
                assert got == want
    assert vrun(probe, "scandir", "/sys/class/net").split() == \
        sorted(e for e in os.listdir("/sys/class/net"))
    # getcwd and realpath never show the private directory
    out = vrun("bash", "-c", f"cd {IB}/loop0/ports && pwd -P && /bin/pwd")
    assert out.split() == ["/sys/devices/virtual/infiniband/loop0/ports"] * 2, out


def test_without_softverbs_run_nothing_is_emulated(probe, env, build_dir):
    """LD_LIBRARY_PATH alone (the env fixture) gives the library, not the view."""
    for path in (IB, "/dev/infiniband/uverbs0", "/sys/class/infiniband_verbs"):
        want = "errno 2" if not os.path.exists(path) else None
        got = run([probe, "stat", path], env, check=True).stdout.strip()
        if want:
            assert got == want
    # The preload library with no SOFTVERBS_VIEW does nothing either.
    lib = str(build_dir / "view" / "libsoftverbs-view.so")
    # (after a sanitizer runtime the env fixture may have preloaded)
    e = dict(env, LD_PRELOAD=" ".join(x for x in (env.get("LD_PRELOAD"), lib) if x))
    e.pop("SOFTVERBS_VIEW", None)
    if not os.path.exists(IB):
        assert run([probe, "stat", IB], e, check=True).stdout.strip() == "errno 2"
    assert run([probe, "cat", "/etc/hostname"], e, check=True).stdout == \
        run([probe, "cat", "/etc/hostname"], env, check=True).stdout
    # --no-view
    p = run([str(build_dir / "tools" / "softverbs-run"), "--no-view", "env"], e, check=True)
    assert "SOFTVERBS_VIEW=" not in p.stdout


def test_existing_ld_preload_is_kept(vrun, view_env, build_dir):
    libm = subprocess.run(["/usr/bin/python3", "-c",
                           "import ctypes.util; print(ctypes.util.find_library('m'))"],
                          capture_output=True, text=True, timeout=30).stdout.strip()
    before = " ".join(x for x in (view_env.get("LD_PRELOAD"), libm) if x)
    e = dict(view_env, LD_PRELOAD=before)
    out = vrun("sh", "-c", "echo $LD_PRELOAD", env=e).strip()
    assert out.startswith(before + ":"), out
    assert out.endswith("/libsoftverbs-view.so"), out
    assert vrun("sh", "-c", "cat /sys/class/infiniband/loop0/ports/1/lid", env=e).strip() == "0x1"


def test_view_directory_is_private_and_removed(vrun, view_env, softverbs_run, tmp_path):
    e = dict(view_env, XDG_RUNTIME_DIR=str(tmp_path))
    d = vrun("sh", "-c", "echo $SOFTVERBS_VIEW; ls -ld $SOFTVERBS_VIEW", env=e).split("\n")
    view = d[0]
    assert view.startswith(str(tmp_path) + "/softverbs-view.")
    assert d[1].startswith("drwx------"), d[1]
    deadline = time.time() + 10
    while os.path.exists(view) and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(view), "the view directory outlived its program"
    # A program killed by SIGKILL leaves nothing behind either.
    p = subprocess.Popen([softverbs_run, "sh", "-c", "echo $SOFTVERBS_VIEW; exec sleep 60"],
                         env=e, stdout=subprocess.PIPE, text=True)
    def late(*_):
        p.kill()
        raise TimeoutError("softverbs-run printed nothing in 30 s")
    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(30)  # readline has no timeout of its own
    try:
        view = p.stdout.readline().strip()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert os.path.isdir(view)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    p.stdout.close()
    deadline = time.time() + 10
    while os.path.exists(view) and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(view)


def test_threads_and_signal_handlers(probe, vrun):
    fw = cat(probe, vrun, f"{IB}/loop0/fw_ver")
    assert vrun(probe, "threads", f"{IB}/loop0/fw_ver", fw + "\n").strip() == "bad 0"
    assert vrun(probe, "signal", f"{IB}/loop0/node_guid").strip() == "handler ok"


def test_netdev_of_each_port(vrun, view_env, probe):
    """Each device lists its configured netdev (default lo), an InfiniBand
    one as its IPoIB interface; the link is the real interface."""
    pathlib.Path(view_env["SOFTVERBS_CONFIG"]).write_text(CONFIG + "loop0.netdev = lo\n")
    for dev in ("loop0", "loop1"):
        assert vrun(probe, "scandir", f"{IB}/{dev}/device/net").split() == ["lo"]
        assert vrun(probe, "cat", f"{IB}/{dev}/device/net/lo/ifindex").strip() == "1"


def test_as_a_user_without_root(vrun, build_dir, view_env, probe, tmp_path):
    """The product needs no privilege: as nobody, the view works and the
    device node passes UCX's checks."""
    if os.getuid() != 0:
        out = vrun(probe, "access", "/dev/infiniband/uverbs0", "rw").strip()
        assert out == "ok"
        return
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) missing")
    # Every directory up to the build must be searchable by nobody.
    p = build_dir
    while p != p.parent:
        if not os.stat(p).st_mode & 0o001:
            pytest.skip(f"{p} is not searchable by other users")
        p = p.parent
    # pytest's own directories are root's alone: a home of nobody's in /tmp.
    import tempfile
    home = pathlib.Path(tempfile.mkdtemp(prefix="sv-view-nobody-"))
    os.chmod(home, 0o700)
    shutil.chown(home, 65534, 65534)
    conf = home / "softverbs.conf"
    conf.write_text(CONFIG)
    shutil.chown(conf, 65534, 65534)
    e = dict(view_env, HOME=str(home), SOFTVERBS_CONFIG=str(conf), TMPDIR=str(home))
    e.pop("XDG_RUNTIME_DIR", None)
    fabric = e["SOFTVERBS_FABRIC"]
    try:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
               str(build_dir / "tools" / "softverbs-run")]
        p = run(cmd + [probe, "uverbs", "/dev/infiniband/uverbs1"], e, check=True)
        assert "write -1 errno 19" in p.stdout
        p = run(cmd + [probe, "cat", f"{IB}/loop0/ports/2/lid"], e, check=True)
        assert p.stdout.strip() == "0x2"
        p = run(cmd + [probe, "access", "/dev/infiniband/uverbs0", "rw"], e, check=True)
        assert p.stdout.strip() == "ok"
        # The keeper removes each view once its program is gone (soon after).
        deadline = time.time() + 10
        while [x for x in os.listdir(home) if x.startswith("softverbs-view.")]:
            assert time.time() < deadline, os.listdir(home)
            time.sleep(0.05)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        for f in os.listdir("/dev/shm"):
            if f.startswith(f"softverbs-65534-{fabric}"):
                os.unlink(os.path.join("/dev/shm", f))


def test_early_in_startup(vrun, view_env, build_dir):
    """A library's constructor that reads the view before main() (preloaded
    ahead of the view library, whose own constructor may not have run)."""
    early = str(build_dir / "tests" / "progs" / "libsv_viewearly.so")
    before = " ".join(x for x in (view_env.get("LD_PRELOAD"), early) if x)
    p = vrun("true", env=dict(view_env, LD_PRELOAD=before), check=False)
    assert p.returncode == 0, p.stderr
    guid = vrun("cat", f"{IB}/loop0/node_guid").strip()
    assert f"early guid {guid}\n" in p.stderr, p.stderr
    assert "early uverbs0 chr\n" in p.stderr, p.stderr


def test_no_view_left_when_killed_while_rendering(softverbs_run, view_env, tmp_path):
    """softverbs-run killed (SIGKILL) at any moment of its start, before,
    while or after it writes the view: nothing is left in TMPDIR once the
    keeper has run.  The keeper was started after the tree was written, so
    a kill while it was rendered left a partial tree for good (hundreds in
    /tmp after the RoCE v2 suite's hosts were killed between tests)."""
    env = dict(view_env, TMPDIR=str(tmp_path))
    env.pop("XDG_RUNTIME_DIR", None)
    for delay in (0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.4):
        p = subprocess.Popen([softverbs_run, "sleep", "5"], env=env)
        time.sleep(delay)
        p.kill()  # softverbs-run itself, or sleep once exec'd
        p.wait()
    deadline = time.time() + 10
    while [x for x in os.listdir(tmp_path) if x.startswith("softverbs-view.")]:
        assert time.time() < deadline, os.listdir(tmp_path)
        time.sleep(0.05)
