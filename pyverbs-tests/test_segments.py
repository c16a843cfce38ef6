# SPDX-License-Identifier: MIT
"""Segments in /dev/shm: who may create, open and keep them.

- Every queue segment (CQ, RQ, SRQ, service ring) is created with O_EXCL
  under a name with a 64-bit random nonce, mode 0600; every opener checks
  owner, mode and size with fstat before it maps one.
- Another user (a second uid, via setpriv) who creates the names it can
  guess beforehand, mode 0666, and tries to write into every segment of the
  victim's, can neither take the victim's rings nor deny them: the victim's
  traffic runs with every byte checked, and the attacker's files are never
  touched.  Both with fs.protected_regular at 0 (the victim would open the
  attacker's file) and at 2 (the victim's O_CREAT open would fail EACCES).
- A process that closes its device and exits leaves nothing behind but the
  registry: no queue segment, no exited lease.

The two-uid tests need root (to become the second uid) and setpriv; the
protected_regular variants need a writable /proc/sys/fs/protected_regular.
Each is skipped with the reason where that is missing.
"""
import glob
import json
import os
import re
import shutil
import stat
import subprocess
import time

import pytest

import softverbs_fabric  # Built by meson into <build>/tools; PYTHONPATH points there
import svtest
from svtest import run
from test_traffic_pingpong import checked_pingpong, free_port, listening

ATTACKER = 4242  # uid and gid of the second user; no passwd entry needed
NONCE_NAME = re.compile(r"-q(\d+)\.(\d+)\.([0-9a-f]{16})$")
PROTECTED_REGULAR = "/proc/sys/fs/protected_regular"


def shm(fabric, suffix=""):
    return f"/dev/shm/{svtest.segment_prefix()}{fabric}{suffix}"


def segments(fabric):
    return sorted(glob.glob(glob.escape(shm(fabric)) + "*"))


def as_attacker(code, *args):
    """argv running python code as uid/gid ATTACKER, no supplementary groups."""
    return ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups",
            svtest.PYTHON, "-c", code] + [str(a) for a in args]


ATTACKER_ENV = {"PATH": "/usr/bin:/bin"}


def need_two_uids():
    if os.geteuid() != 0:
        pytest.skip("needs root to run a second uid with setpriv")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv missing (util-linux)")
    st = os.stat("/dev/shm")
    if not st.st_mode & stat.S_IWOTH or not st.st_mode & stat.S_ISVTX:
        pytest.skip("/dev/shm is not world-writable and sticky: a second user cannot "
                    "create files there")


@pytest.fixture(params=[0, 2], ids=["protected_regular=0", "protected_regular=2"])
def protected_regular(request):
    """Sets fs.protected_regular for the test and restores it after."""
    need_two_uids()
    try:
        with open(PROTECTED_REGULAR) as f:
            old = f.read().strip()
    except OSError as e:
        pytest.skip(f"{PROTECTED_REGULAR} unreadable: {e}")
    try:
        with open(PROTECTED_REGULAR, "w") as f:
            f.write(str(request.param))
    except OSError as e:
        pytest.skip(f"cannot set fs.protected_regular={request.param} ({e}): "
                    "/proc/sys is read-only here")
    try:
        yield request.param
    finally:
        with open(PROTECTED_REGULAR, "w") as f:
            f.write(old)


@pytest.fixture
def attacker_files():
    """Paths the attacker created; removed (as root) whatever happens."""
    made = []
    yield made
    for p in made:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


# What the attacker plants: every name of the old scheme it can guess
# (softverbs-<uid>-<fabric>-q<slot>.<gen>, the first slots and generations),
# mode 0666, with a marker so that any change is seen.
PLANT = """
import json, os, sys
prefix, slots, gens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.umask(0)
made = []
for s in range(slots):
    for g in range(1, gens + 1):
        p = f"{prefix}-q{s}.{g}"
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        os.write(fd, b"ATTACKER" * 8)
        os.close(fd)
        made.append(p)
print(json.dumps(made), flush=True)
"""

# Then, while the victim runs, it tries to open every file under the
# victim's prefix for writing and scribble over it.  It prints what it
# managed to open that it did not create itself.
SCRIBBLE = """
import json, os, sys, time
prefix, mine, seconds = sys.argv[1], set(json.loads(sys.argv[2])), float(sys.argv[3])
opened = set()
tried = set()
end = time.monotonic() + seconds
while time.monotonic() < end:
    for name in os.listdir("/dev/shm"):
        p = "/dev/shm/" + name
        if not p.startswith(prefix) or p in mine:
            continue
        tried.add(p)
        try:
            fd = os.open(p, os.O_RDWR)
        except OSError:
            continue
        try:
            os.pwrite(fd, b"\\xff" * 4096, 0)
        except OSError:
            pass
        os.close(fd)
        opened.add(p)
    time.sleep(0.005)
print(json.dumps({"opened": sorted(opened), "tried": len(tried)}), flush=True)
"""


def plant(fabric, attacker_files, slots=16, gens=8):
    proc = subprocess.run(as_attacker(PLANT, shm(fabric), slots, gens), capture_output=True,
                          text=True, timeout=svtest.TIMEOUT, env=ATTACKER_ENV)
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    attacker_files.extend(made)
    assert len(made) == slots * gens
    for m in made:
        st = os.stat(m)
        assert st.st_uid == ATTACKER and stat.S_IMODE(st.st_mode) == 0o666
    return made


def untouched(made):
    """The attacker's files as it left them: its owner, mode, size, bytes."""
    for m in made:
        st = os.stat(m)
        assert st.st_uid == ATTACKER, m
        assert stat.S_IMODE(st.st_mode) == 0o666, m
        with open(m, "rb") as f:
            assert f.read() == b"ATTACKER" * 8, f"{m} was written to"


# ---- names, modes, ownership ----

def test_queue_segments_are_private_and_unguessable(env, fabric):
    env = dict(env, SOFTVERBS_DEVICES="loop0")
    with svtest.Holder(env):
        segs = segments(fabric)
        queues = [s for s in segs if s != shm(fabric)]
        # The holder's service segment, named with a nonce.
        assert queues, segs
        for s in [shm(fabric)] + queues:
            st = os.stat(s)
            assert st.st_uid == os.geteuid(), s
            assert stat.S_IMODE(st.st_mode) == 0o600, (s, oct(st.st_mode))
        for q in queues:
            assert NONCE_NAME.search(q), q
    # Two processes: two different nonces.
    with svtest.Holder(env) as a, svtest.Holder(env) as b:
        nonces = {NONCE_NAME.search(q).group(3) for q in segments(fabric)
                  if q != shm(fabric)}
        assert len(nonces) >= 2, segments(fabric)


def test_registry_with_group_or_other_bits_is_refused(softverbs_run, tool_env, fabric):
    run([softverbs_run, "ibv_devices"], tool_env, check=True)
    os.chmod(shm(fabric), 0o644)
    p = run([softverbs_run, "ibv_devices"], tool_env)
    assert "loop0" not in p.stdout, p.stdout
    assert "mode is 0644" in p.stderr and shm(fabric)[len("/dev/shm"):] in p.stderr, p.stderr
    os.chmod(shm(fabric), 0o600)
    p = run([softverbs_run, "ibv_devices"], tool_env, check=True)
    assert "loop0" in p.stdout


# ---- a second user ----

def test_registry_of_another_user_is_refused(softverbs, softverbs_run, tool_env, fabric,
                                             attacker_files):
    need_two_uids()
    reg = shm(fabric)
    proc = subprocess.run(
        as_attacker("import os, sys; os.umask(0); fd = os.open(sys.argv[1], os.O_RDWR | "
                    "os.O_CREAT | os.O_EXCL, 0o666); os.write(fd, b'ATTACKER' * 8)", reg),
        capture_output=True, text=True, timeout=svtest.TIMEOUT, env=ATTACKER_ENV)
    assert proc.returncode == 0, proc.stderr
    attacker_files.append(reg)
    p = run([softverbs_run, "ibv_devices"], tool_env)
    assert "loop0" not in p.stdout, p.stdout
    assert f"belongs to uid {ATTACKER}" in p.stderr, p.stderr
    untouched([reg])
    # The tools say so and leave it alone.
    listing = run([softverbs, "list"], tool_env, check=True).stdout
    row = [l for l in listing.splitlines() if l.split()[:1] == [fabric]]
    assert row and "refused" in row[0], listing
    p = run([softverbs, "clean", fabric], tool_env)
    assert p.returncode == 1 and "belongs to another user" in p.stderr, p.stderr
    untouched([reg])


def test_second_user_can_neither_take_nor_deny_the_rings(build_dir, env, fabric,
                                                         protected_regular, attacker_files,
                                                         softverbs):
    made = plant(fabric, attacker_files)
    scribbler = subprocess.Popen(as_attacker(SCRIBBLE, shm(fabric), json.dumps(made), 8),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=ATTACKER_ENV)
    try:
        # Every byte and sequence number checked, both directions, on the
        # rings the attacker would have liked to own.
        checked_pingpong(build_dir, env, ["-s", 4096, "-n", 2000])
        checked_pingpong(build_dir, env, ["-s", 100, "-n", 2000])
        out, err = scribbler.communicate(timeout=60)
    finally:
        if scribbler.poll() is None:
            scribbler.kill()
            scribbler.communicate()
    assert scribbler.returncode == 0, err
    seen = json.loads(out)
    # It did see the victim's segments (the registry at least, and rings
    # while the traffic ran), and could open none of them.
    assert seen["tried"] > 1, seen
    assert seen["opened"] == [], f"the attacker opened the victim's segments: {seen}"
    untouched(made)
    # Nothing of the victim's is named as the attacker guessed, and the
    # tools file the attacker's names apart.
    listing = run([softverbs, "list"], tool_env_of(env), check=True).stdout
    row = [l for l in listing.splitlines() if l.split()[:1] == [fabric]]
    assert row and f"{len(made)} segments of another user" in row[0], listing
    for s in segments(fabric):
        if s in made:
            continue
        st = os.stat(s)
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600, s


def tool_env_of(env):
    e = dict(env)
    e.pop("LD_LIBRARY_PATH", None)
    return e


# ---- nothing left behind ----

def pingpong_pair_via_softverbs_run(softverbs_run, tool_env, args=()):
    port = free_port()
    common = ["-p", str(port)] + list(args)
    srv = subprocess.Popen([softverbs_run, "ibv_rc_pingpong"] + common, env=tool_env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cli = None
    try:
        end = time.monotonic() + 20
        while not listening(port):
            assert srv.poll() is None, srv.communicate()
            assert time.monotonic() < end, "ibv_rc_pingpong never listened"
            time.sleep(0.02)
        cli = subprocess.Popen([softverbs_run, "ibv_rc_pingpong"] + common + ["127.0.0.1"],
                               env=tool_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        cout, cerr = cli.communicate(timeout=60)
        sout, serr = srv.communicate(timeout=30)
    finally:
        for p in (srv, cli):
            if p and p.poll() is None:
                p.kill()
                p.communicate()
    assert srv.returncode == 0 and cli.returncode == 0, (cout, cerr, sout, serr)
    assert "bytes in" in cout and "bytes in" in sout, (cout, sout)


def test_processes_that_exit_leave_only_the_registry(softverbs, softverbs_run, tool_env,
                                                     fabric):
    run([softverbs_run, "ibv_devinfo"], tool_env, check=True)
    assert segments(fabric) == [shm(fabric)], segments(fabric)
    pingpong_pair_via_softverbs_run(softverbs_run, tool_env, ["-n", "100"])
    assert segments(fabric) == [shm(fabric)], segments(fabric)
    listing = run([softverbs, "list"], tool_env, check=True).stdout
    row = [l for l in listing.splitlines() if l.split()[:1] == [fabric]]
    assert row and "0 live" in row[0] and "exited" not in row[0], listing
    show = run([softverbs, "show", fabric], tool_env, check=True).stdout
    assert "0 live, 0 exited" in show, show
    assert "object:" not in show, show


def test_closing_the_last_context_gives_everything_back(env, fabric):
    """Within one process: open, close, open again; after the close the
    service segment and the lease are gone, after the reopen back."""
    got = svtest.pyverbs(f"""
import glob
from pyverbs.pd import PD
pattern = {shm(fabric)!r} + "-q*"
before = len(glob.glob(pattern))
ctx = d.Context(name="loop0")
opened = len(glob.glob(pattern))
ctx.close()
closed = len(glob.glob(pattern))
ctx = d.Context(name="loop0")
reopened = len(glob.glob(pattern))
pd = PD(ctx)
pd.close()
ctx.close()
out({{"before": before, "opened": opened, "closed": closed, "reopened": reopened,
     "end": len(glob.glob(pattern))}})
""", env)
    assert got == {"before": 0, "opened": 1, "closed": 0, "reopened": 1, "end": 0}, got
    f = softverbs_fabric.fabric(fabric)
    assert not [l for l in f["leases"] if l["live"]], f["leases"]


def test_forked_child_does_not_remove_its_parents_segments(env, fabric):
    got = svtest.pyverbs(f"""
import glob, os
pattern = {shm(fabric)!r} + "-q*"
ctx = d.Context(name="loop0")
mine = sorted(glob.glob(pattern))
pid = os.fork()
if pid == 0:
    os._exit(0)   # No exit handlers
os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:
    import sys
    sys.exit(0)   # Exit handlers run: the child's must not touch the parent's
os.waitpid(pid, 0)
after = sorted(glob.glob(pattern))
ctx.close()
out({{"mine": mine, "after": after, "end": glob.glob(pattern)}})
""", env)
    assert got["mine"] and got["after"] == got["mine"], got
    assert got["end"] == [], got


# ---- peers' fd-backed MRs: the mapping cache under threads ----

def test_mapping_cache_eviction_under_threads(build_dir, env):
    """600 fd-backed MRs (more than the 256 cached mappings) written and read
    back by 4 threads of another process, every byte compared: an eviction
    used to unmap every mapping while other threads copied through them
    (SIGSEGV in the user process)."""
    prog = build_dir / "tests" / "progs" / "sv_fdmaps"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    p = run([str(prog), "-m", "600", "-t", "4", "-s", "4"], env, timeout=180)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    m = re.search(r"OK sv_fdmaps mrs=600 threads=4 ops=(\d+)", p.stdout)
    assert m and int(m.group(1)) > 0, p.stdout


def test_peer_shrinks_its_fd_mr_file(build_dir, env):
    """The owner truncates the memfd behind its MR to 0 while the requester
    holds a mapping of it: the requester's WRITE, READ and FETCH_ADD
    complete REM_ACCESS_ERR (they succeeded before the truncate), and the
    requester lives (it used to die of SIGBUS in its memcpy)."""
    prog = build_dir / "tests" / "progs" / "sv_fdmaps"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    p = run([str(prog), "-m", "1", "-t", "3", "-x"], env, timeout=120)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert p.stdout.strip() == "OK sv_fdmaps mrs=1 threads=3 ops=6", p.stdout


def test_own_fd_mr_file_shrunk(build_dir, env):
    """A process shrinks the file of its own fd-backed MR: its own QPs'
    WRITEs, READs, atomics and SENDs into it, and WRITEs out of it, end in
    error completions (REM_ACCESS_ERR, LOC_PROT_ERR) instead of SIGBUS in
    the library (tests/progs/sv_fdself.c)."""
    prog = build_dir / "tests" / "progs" / "sv_fdself"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    p = run([str(prog)], env, timeout=90)
    assert p.returncode == 0 and p.stdout.strip() == "OK sv_fdself", \
        f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"


@pytest.mark.parametrize("sealed", [False, True], ids=["unsealed", "sealed"])
def test_fd_mr_copy_path(build_dir, env, softverbs, fabric, sealed):
    """Into a peer's memfd MR that this process maps, a copy is made by the
    kernel between our own addresses (the owner may shrink the file: EFAULT,
    not SIGBUS), except where the memfd is sealed against shrinking: then
    plain memcpy, no system call.  Every byte is compared by sv_fdmaps, and
    `softverbs show` says which path the requester took."""
    prog = build_dir / "tests" / "progs" / "sv_fdmaps"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir} (needs libibverbs-dev)")
    p = run([str(prog), "-m", "8", "-t", "2", "-s", "1"] + (["-S"] if sealed else []), env,
            timeout=120)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    m = re.search(r"OK sv_fdmaps mrs=8 threads=2 ops=(\d+)", p.stdout)
    assert m and int(m.group(1)) > 0, p.stdout
    show = subprocess.run([softverbs, "show", fabric], env=env, capture_output=True, text=True,
                          timeout=30).stdout
    slots = [l for l in show.splitlines() if l.strip().startswith("slot ")]
    paths = " ".join(slots)
    if sealed:
        assert "mapped-direct" in paths, show
    else:
        assert "mapped-file" in paths and "mapped-direct" not in paths, show
    assert "cross-memory-attach " not in paths + " ", show


def abstract_dgram_sockets(pid):
    """The abstract names (without the leading NUL) of pid's AF_UNIX
    datagram sockets."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    names = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            cols = line.split()
            # Num RefCount Protocol Flags Type St Inode [Path]
            if len(cols) >= 8 and cols[6] in inodes and cols[4] == "0002" and \
                    cols[7].startswith("@"):
                names.append(cols[7][1:])
    return names


FORGE = r"""
import socket, struct, sys
for name in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for typ in map(int, sys.argv[1].split(",")):
        s.sendto(struct.pack("IIII", typ, 0, 1, 0), b"\0" + name.encode())
    s.close()
"""


def test_another_user_cannot_raise_async_events(build_dir, env, fabric):
    """A context's async events come as datagrams to an abstract socket,
    which takes no permission check and whose name /proc/net/unix shows to
    everyone: another user sent DEVICE_FATAL and PORT_ERR into root's
    contexts (a helper's probe).  Now each datagram's sender credentials
    are checked: the other user's are dropped, our own user's (a
    PORT_ACTIVE, the positive control) arrive."""
    need_two_uids()
    prog = svtest.built_prog(build_dir, "sv_async")
    victim = subprocess.Popen([prog, "listen", "3000"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert victim.stdout.readline().strip() == "READY"
        names = abstract_dgram_sockets(victim.pid)
        assert names, "the victim has no abstract datagram socket"
        forged = subprocess.run(as_attacker(FORGE, "8,10", *names), capture_output=True,
                                text=True, timeout=svtest.TIMEOUT, env=ATTACKER_ENV)
        assert forged.returncode == 0, forged.stderr
        own = subprocess.run([svtest.PYTHON, "-c", FORGE, "9", *names], capture_output=True,
                             text=True, timeout=svtest.TIMEOUT)
        assert own.returncode == 0, own.stderr
        out, err = victim.communicate(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.communicate()
    assert victim.returncode == 0, err
    events = [l for l in out.splitlines() if l.startswith("EVENT")]
    # IBV_EVENT_PORT_ACTIVE (9) on port 1 from our own user, nothing else.
    assert events == ["EVENT 9 1"], out
