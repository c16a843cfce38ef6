# SPDX-License-Identifier: MIT
"""Debian's unmodified verbs tools through softverbs-run, and the softverbs
command itself."""
import glob
import os
import pathlib
import re
import struct

import pytest

import svtest
from svtest import run


def abi_version():
    """SV_ABI_VERSION as kernel-abi/softverbs-abi.h defines it."""
    header = pathlib.Path(__file__).resolve().parent.parent / "kernel-abi" / "softverbs-abi.h"
    return int(re.search(r"#define SV_ABI_VERSION (\d+)", header.read_text()).group(1))

SV_SEG_MAGIC = 0x53565242534F4654
SV_SEG_REGISTRY = 1
SV_SEG_QUEUE = 2
SV_SEG_READY = 0x52454459


def devinfo_hcas(text):
    """{hca_id: {"node_guid": ..., "lids": [...], "states": [...]}} from ibv_devinfo -v."""
    hcas = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"hca_id:\s*(\S+)", line)
        if m:
            cur = hcas.setdefault(m.group(1), {"lids": [], "states": []})
            continue
        if cur is None:
            continue
        m = re.match(r"\s*node_guid:\s*(\S+)", line)
        if m:
            cur["node_guid"] = m.group(1)
        m = re.match(r"\s*port_lid:\s*(\d+)", line)
        if m:
            cur["lids"].append(int(m.group(1)))
        m = re.match(r"\s*state:\s*(\S+)", line)
        if m:
            cur["states"].append(m.group(1))
    return hcas


def write_segment(path, abi, kind=SV_SEG_REGISTRY, size=8192):
    """A segment with a valid header of the given ABI version and kind."""
    hdr = struct.pack("<QIIQII32x", SV_SEG_MAGIC, abi, kind, size, SV_SEG_READY, os.getpid())
    assert len(hdr) == 64
    # Mode 0600 as the library makes them: a looser one is refused for that.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(hdr + b"\xa5" * (size - len(hdr)))


def shm(fabric, suffix=""):
    return f"/dev/shm/{svtest.segment_prefix()}{fabric}{suffix}"


# ---- softverbs-run with Debian's tools ----

def test_ibv_devices(softverbs_run, tool_env, softverbs, fabric):
    p = run([softverbs_run, "ibv_devices"], tool_env, check=True)
    m = re.search(r"^\s*loop0\s+([0-9a-f]{16})\s*$", p.stdout, re.M)
    assert m, p.stdout
    show = run([softverbs, "show", fabric], tool_env, check=True).stdout
    guid = m.group(1)
    assert ":".join(guid[i:i + 4] for i in range(0, 16, 4)) in show


def test_ibv_devinfo_v(softverbs_run, tool_env):
    p = run([softverbs_run, "ibv_devinfo", "-v"], tool_env, check=True)
    hcas = devinfo_hcas(p.stdout)
    assert list(hcas) == ["loop0"], p.stdout
    assert hcas["loop0"]["states"] == ["PORT_ACTIVE"]
    assert hcas["loop0"]["lids"][0] != 0
    assert "GID[  0]:\t\tfe80:0000:0000:0000:" in p.stdout


def test_ibv_devinfo_two_devices(softverbs_run, tool_env):
    p = run([softverbs_run, "--devices", "loop0,loop1", "ibv_devinfo", "-v"], tool_env,
            check=True)
    hcas = devinfo_hcas(p.stdout)
    assert sorted(hcas) == ["loop0", "loop1"], p.stdout
    assert hcas["loop0"]["node_guid"] != hcas["loop1"]["node_guid"]
    lids = hcas["loop0"]["lids"] + hcas["loop1"]["lids"]
    assert len(lids) == 2 and len(set(lids)) == 2 and 0 not in lids
    assert all(h["states"] == ["PORT_ACTIVE"] for h in hcas.values())


def test_softverbs_run_usage(softverbs_run, tool_env, build_dir):
    p = run([softverbs_run], tool_env)
    assert p.returncode == 2 and "no PROGRAM given" in p.stderr and "usage:" in p.stderr
    p = run([softverbs_run, "--help"], tool_env)
    assert p.returncode == 0 and "usage: softverbs-run" in p.stdout
    p = run([softverbs_run, "no-such-program-here"], tool_env)
    assert p.returncode == 127 and "no-such-program-here: command not found" in p.stderr
    p = run([softverbs_run, "--bogus", "true"], tool_env)
    assert p.returncode == 2 and "unknown option '--bogus'" in p.stderr
    p = run([softverbs_run, "--libdir"], tool_env, check=True)
    assert p.stdout.strip() == str(build_dir / "libibverbs-compat")


def test_softverbs_run_sets_library_path(softverbs_run, tool_env, build_dir, fabric):
    # -f names the test's own fabric (softverbs-run makes its registry),
    # which the fixture removes: a fixed name was left in /dev/shm.
    tool_env["LD_LIBRARY_PATH"] = "/somewhere/else"
    tool_env.pop("SOFTVERBS_FABRIC", None)
    p = run([softverbs_run, "-f", fabric, "sh", "-c",
             'echo "$LD_LIBRARY_PATH|$SOFTVERBS_FABRIC"'], tool_env, check=True)
    assert p.stdout.strip() == f"{build_dir / 'libibverbs-compat'}:/somewhere/else|{fabric}"


def test_softverbs_run_config_path_is_absolute(softverbs_run, tool_env, tmp_path):
    """-c with a relative path, and a program that changes directory before
    it opens the device: the path is made absolute first (it was passed on
    as given, and the program's open failed, "cannot read 'roce.conf'"; a
    helper's probe)."""
    (tmp_path / "roce.conf").write_text("loop0.link_layer = ethernet\n")
    tool_env.pop("SOFTVERBS_CONFIG", None)
    p = run([softverbs_run, "-c", "roce.conf", "sh", "-c",
             'echo "$SOFTVERBS_CONFIG"; cd /; ibv_devinfo -d loop0'], tool_env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[0] == str(tmp_path / "roce.conf"), p.stdout
    assert re.search(r"link_layer:\s*Ethernet", p.stdout), p.stdout


# ---- the softverbs command ----

def test_softverbs_does_not_wait_on_a_fifo(softverbs, tool_env, fabric):
    """A FIFO named as a fabric's registry (anyone may make one under the
    user's prefix in /dev/shm): the tool's open waited for a writer that
    never came, and list, show and clean hung (a helper's probe).  Now each
    answers at once and says it is not a regular file."""
    path = f"/dev/shm/softverbs-{os.geteuid()}-{fabric}"
    os.mkfifo(path, 0o600)
    try:
        listing = run([softverbs, "list"], tool_env, timeout=20).stdout
        row = [l for l in listing.splitlines() if l.split()[:1] == [fabric]]
        assert row and "not a regular file" in row[0], listing
        p = run([softverbs, "show", fabric], tool_env, timeout=20)
        assert p.returncode != 0 and "not a regular file" in p.stdout + p.stderr, p
    finally:
        os.unlink(path)


def test_softverbs_help_and_usage_errors(softverbs, tool_env):
    p = run([softverbs, "--help"], tool_env)
    assert p.returncode == 0 and "list" in p.stdout and "clean" in p.stdout
    for argv, msg in [([], "missing COMMAND"), (["frob"], "unknown command 'frob'"),
                      (["clean"], "clean needs a FABRIC"), (["show", "a/b"], "not a fabric name"),
                      (["clean", "--nope", "x"], "unknown option '--nope'")]:
        p = run([softverbs] + argv, tool_env)
        assert p.returncode == 2, (argv, p.stderr)
        assert msg in p.stderr, (argv, p.stderr)


def test_list_show_clean(softverbs, softverbs_run, tool_env, fabric):
    p = run([softverbs, "show", fabric], tool_env)
    assert p.returncode == 1 and f"no fabric '{fabric}'" in p.stderr
    run([softverbs_run, "-d", "loop0,loop1", "ibv_devinfo"], tool_env, check=True)

    listing = run([softverbs, "list"], tool_env, check=True).stdout
    row = [l for l in listing.splitlines() if l.split()[:1] == [fabric]]
    assert row, listing
    assert row[0].split()[1:3] == [str(abi_version()), "loop0,loop1"], row[0]

    # No argument: the fabric that programs would use.
    show = run([softverbs, "show"], tool_env, check=True).stdout
    assert show.startswith(f"fabric {fabric}\n"), show
    assert "device loop0" in show and "device loop1" in show
    assert show.count("PORT_ACTIVE") == 2 and show.count("InfiniBand") == 2
    lids = re.findall(r"LID:\s+(\d+)", show)
    assert len(lids) == 2 and len(set(lids)) == 2

    # Only the registry: the process that opened a device had a service
    # segment (the copy path without cross-memory attach), and removed it
    # when it closed the device; its lease was given back, not left to reap.
    segments = glob.glob(shm(fabric) + "*")
    assert segments == [shm(fabric)], segments
    assert "exited" not in row[0], row[0]
    p = run([softverbs, "clean", fabric], tool_env, check=True)
    assert "removed 1 segment " in p.stdout, p.stdout
    assert not glob.glob(shm(fabric) + "*")
    p = run([softverbs, "clean", fabric], tool_env)
    assert p.returncode == 1 and f"no fabric '{fabric}'" in p.stderr


def test_clean_refuses_while_a_process_holds_a_lease(softverbs, env, tool_env, fabric):
    with svtest.Holder(env) as h:
        p = run([softverbs, "list"], tool_env, check=True)
        assert f"1 live ({h.pid})" in p.stdout, p.stdout
        p = run([softverbs, "clean", fabric], tool_env)
        assert p.returncode == 1, p.stdout
        assert "in use by live processes" in p.stderr and str(h.pid) in p.stderr
        assert "--force" in p.stderr
        assert os.path.exists(shm(fabric))
    # It exited normally: its lease was given back (shown as closed, with
    # its pid), nothing holds the fabric any more.
    p = run([softverbs, "show", fabric], tool_env, check=True)
    assert "0 live, 0 exited, 1 closed" in p.stdout, p.stdout
    assert f"pid {h.pid}" in p.stdout and "closed" in p.stdout, p.stdout
    run([softverbs, "clean", fabric], tool_env, check=True)
    assert not os.path.exists(shm(fabric))


def test_clean_force(softverbs, env, tool_env, fabric):
    with svtest.Holder(env):
        p = run([softverbs, "clean", "--force", fabric], tool_env, check=True)
        assert "forced" in p.stdout
        assert not os.path.exists(shm(fabric))


def test_clean_removes_object_segments_of_that_fabric_only(softverbs, softverbs_run,
                                                           tool_env, fabric):
    run([softverbs_run, "ibv_devices"], tool_env, check=True)
    write_segment(shm(fabric, "-q3.1"), 1, SV_SEG_QUEUE)
    # A fabric whose name extends ours, with its own object: not ours.
    longer = fabric + "-b"
    try:
        tool_env2 = dict(tool_env, SOFTVERBS_FABRIC=longer)
        run([softverbs_run, "ibv_devices"], tool_env2, check=True)
        write_segment(shm(longer, "-q1.1"), 1, SV_SEG_QUEUE)
        p = run([softverbs, "clean", fabric], tool_env, check=True)
        assert "removed 2 segments" in p.stdout, p.stdout
        assert not os.path.exists(shm(fabric)) and not os.path.exists(shm(fabric, "-q3.1"))
        assert os.path.exists(shm(longer)) and os.path.exists(shm(longer, "-q1.1"))
    finally:
        svtest.remove_fabric(longer)


def test_other_abi_version_is_reported_not_misread(softverbs, softverbs_run, tool_env, fabric):
    import softverbs_fabric
    theirs = softverbs_fabric.ABI_VERSION + 5
    write_segment(shm(fabric), theirs)
    with open(shm(fabric), "rb") as f:
        before = f.read()
    both = (f"ABI version {theirs}", f"version {softverbs_fabric.ABI_VERSION}")

    listing = run([softverbs, "list"], tool_env, check=True).stdout
    row = [l for l in listing.splitlines() if l.split()[:1] == [fabric]]
    assert row and all(s in row[0] for s in both), listing
    show = run([softverbs, "show", fabric], tool_env, check=True).stdout
    assert all(s in show for s in both), show
    assert "device " not in show, "records of another layout must not be shown"

    # The library refuses it too, naming both versions.
    p = run([softverbs_run, "ibv_devices"], tool_env)
    assert f"version {theirs}" in p.stderr and \
        f"version {softverbs_fabric.ABI_VERSION}" in p.stderr, p.stderr
    assert "loop0" not in p.stdout
    with open(shm(fabric), "rb") as f:
        assert f.read() == before, "nobody may write to another version's segment"

    p = run([softverbs, "clean", fabric], tool_env, check=True)
    assert f"ABI version {theirs}" in p.stdout
    assert not os.path.exists(shm(fabric))
