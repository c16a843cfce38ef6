# SPDX-License-Identifier: MIT
"""rsockets (librdmacm-compat/rsocket.cpp, docs/rdmacm.md): Debian's rstream
and riostream between two processes through softverbs-run, on an InfiniBand port and a
RoCE port; Debian's librspreload.so under a plain TCP echo
(tests/progs/sv_rs_echo), with strace showing that no TCP socket carries
the bytes; the error paths through ctypes; a peer killed mid-connection.

Every case runs on a fabric of its own, every process has a timeout and is
killed whatever the outcome.
"""
import json
import os
import re
import signal
import subprocess
import textwrap
import time

import pytest

import svtest
from test_rdmacm import ROCE_CONF, check_pair, cm_listening, kill_group, need, pair, start

TIMEOUT = 90
_port = iter(range(20000 + (os.getpid() % 400) * 20, 30000))
PRELOAD = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so"


@pytest.fixture(params=["ib", "roce"])
def link(request, env):
    if request.param == "roce":
        with open(env["SOFTVERBS_CONFIG"], "w") as f:
            f.write(ROCE_CONF)
    return request.param


@pytest.fixture
def run_env(env):
    e = dict(env)
    del e["LD_LIBRARY_PATH"]
    return e


def echo_prog(build_dir):
    p = build_dir / "tests" / "progs" / "sv_rs_echo"
    assert p.exists(), f"{p} not built"
    return str(p)


# ------------------------------------------------------------ rstream ---

def rstream(run_env, softverbs_run, opts, addr="127.0.0.1"):
    need("rstream")
    port = next(_port)
    res = pair([softverbs_run, "rstream", "-b", addr, "-p", str(port)] + opts,
               [softverbs_run, "rstream", "-s", addr, "-p", str(port)] + opts,
               run_env, lambda: cm_listening(port), timeout=TIMEOUT)
    sout, cout = check_pair(res, f"rstream {opts}")
    for out in (sout, cout):
        assert not re.search(r"rsend|rrecv|rpoll|raccept|rconnect|mismatch|error", out, re.I), out
    return sout, cout


def table(out):
    """{test name: bytes moved} from rstream's table."""
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 8 and f[0] != "name":
            rows[f[0]] = f[4]
    return rows


@pytest.mark.parametrize("mode", ["default", "v", "a", "n", "b", "r"])
def test_rstream(link, run_env, softverbs_run, mode):
    """rstream's whole size ladder (latency, then bandwidth on a second
    connection); -T v compares every byte, a waits in rpoll, n is
    nonblocking with O_NONBLOCK, b blocking with MSG_WAITALL, r resolves
    with rdma_getaddrinfo."""
    opts = [] if mode == "default" else ["-T", mode]
    sout, cout = rstream(run_env, softverbs_run, opts)
    for out in (sout, cout):
        rows = table(out)
        for name in ("64_lat", "4k_lat", "64k_lat", "64_bw", "4k_bw", "64k_bw", "1m_bw"):
            assert name in rows, out


@pytest.mark.parametrize("mode", ["v", "av", "nv"])
def test_rstream_verify_custom(link, run_env, softverbs_run, mode):
    """One transfer size, every byte verified; here rstream's exit status
    reflects a mismatch (the ladder ignores it)."""
    opts = ["-S", "1000000", "-C", "100"]
    for m in mode:
        opts += ["-T", m]
    sout, cout = rstream(run_env, softverbs_run, opts)
    for out in (sout, cout):
        assert "custom" in table(out), out


@pytest.mark.parametrize("mode", ["v", "av", "nv", "bv"])
def test_riostream(link, run_env, softverbs_run, mode):
    """riostream: riomap on each side, riowrite (RDMA WRITE into the peer's
    mapping) both ways, each side spinning on the last byte of its buffer;
    -T v compares every byte (a mismatch fails its exit status)."""
    need("riostream")
    port = next(_port)
    opts = ["-S", "1000000", "-C", "50"]
    for m in mode:
        opts += ["-T", m]
    res = pair([softverbs_run, "riostream", "-b", "127.0.0.1", "-p", str(port)] + opts,
               [softverbs_run, "riostream", "-s", "127.0.0.1", "-p", str(port)] + opts,
               run_env, lambda: cm_listening(port), timeout=TIMEOUT)
    sout, cout = check_pair(res, f"riostream {opts}")
    for out in (sout, cout):
        assert not re.search(r"riomap|riowrite|rrecv|rsend|mismatch|error", out, re.I), out
        assert "custom" in table(out), out


def test_rstream_ipv6(run_env, softverbs_run):
    sout, cout = rstream(run_env, softverbs_run, ["-S", "65536", "-C", "500", "-T", "v"], addr="::1")
    assert "custom" in table(cout), cout


def test_rstream_sockets_baseline(run_env, softverbs_run):
    """-T s is rstream over plain TCP (no rsockets): the comparison point."""
    need("rstream")
    port = next(_port)
    import test_perftest
    res = pair([softverbs_run, "rstream", "-b", "127.0.0.1", "-p", str(port), "-T", "s", "-S", "4096", "-C", "100"],
               [softverbs_run, "rstream", "-s", "127.0.0.1", "-p", str(port), "-T", "s", "-S", "4096", "-C", "100"],
               run_env, lambda: test_perftest.listening(port), timeout=TIMEOUT)
    check_pair(res, "rstream -T s")


def test_rcopy(link, run_env, softverbs_run, tmp_path):
    """rcopy: a 5 MB file of random bytes to an rcopy server, compared."""
    need("rcopy")
    port = next(_port)
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(os.urandom(5_000_000))
    srv = start([softverbs_run, "rcopy", "-p", str(port)], run_env)
    try:
        wait_ready(srv, lambda: cm_listening(port))
        p = svtest.run([softverbs_run, "rcopy", str(src), f"127.0.0.1:{dst}", "-p", str(port)],
                       run_env, timeout=TIMEOUT)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "5000000 bytes" in p.stdout, p.stdout
        # the server has finished once it waits for the next connection
        deadline = time.monotonic() + 30
        while (not dst.exists() or dst.stat().st_size < 5_000_000) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dst.read_bytes() == src.read_bytes()
    finally:
        kill_group(srv)
        out = srv.stdout.read() if srv.stdout else ""
    assert "5000000 bytes" in out and "done" in out, out


# ------------------------------------------------------- librspreload ---

def preloaded(softverbs_run, argv):
    """softverbs-run ARGV with librspreload added to the LD_PRELOAD that
    softverbs-run makes (the view's, a sanitizer's): only ARGV gets it, not
    softverbs-run's own bash (whose getpeername at startup the preload does
    not survive under ASan)."""
    return [softverbs_run, "sh", "-c",
            f'LD_PRELOAD="${{LD_PRELOAD:+$LD_PRELOAD }}{PRELOAD}" exec "$@"', "sh"] + argv


STRACE = ["strace", "-f", "-qq", "-e", "trace=socket,connect,bind,accept,accept4,sendto,sendmsg,write,writev"]


def check_strace(path, what):
    """No AF_INET/AF_INET6 stream socket was made or connected, and no
    syscall moved a payload-sized chunk (every write/send under 4 KiB:
    eventfd counters, CM messages, our output); the CM's AF_UNIX socket was
    used."""
    text = open(path).read()
    assert not re.search(r"socket\(AF_INET6?, SOCK_STREAM", text), f"{what}: a TCP socket:\n{text[-3000:]}"
    assert not re.search(r"connect\(\d+, \{sa_family=AF_INET6?,", text), f"{what}: a TCP connect:\n{text[-3000:]}"
    assert "softverbs-cm/" in text, f"{what}: no CM socket in the trace:\n{text[-3000:]}"
    big = [l for l in text.splitlines()
           if re.search(r"\b(write|writev|sendto|sendmsg)\(", l)
           and (m := re.search(r"= (\d+)$", l)) and int(m.group(1)) >= 4096]
    assert not big, f"{what}: payload through a syscall:\n" + "\n".join(big[:10])


@pytest.mark.parametrize("srv_mode,cli_mode,size,addr", [("block", "poll", 3_000_000, "127.0.0.1"),
                                                         ("poll", "select", 1_000_000, "127.0.0.1"),
                                                         ("block", "poll", 1, "127.0.0.1"),
                                                         ("poll", "poll", 500_000, "::1")])
def test_preload_echo(link, run_env, softverbs_run, build_dir, tmp_path, srv_mode, cli_mode, size, addr):
    """A TCP echo under librspreload: both sides traced, the stream checked
    byte by byte by the client, its checksum matched by the server."""
    need("strace")
    if not os.path.exists(PRELOAD):
        pytest.skip("librspreload.so not installed")
    prog = echo_prog(build_dir)
    port = next(_port)
    st, ct = tmp_path / "server.strace", tmp_path / "client.strace"
    res = pair(preloaded(softverbs_run, ["strace", "-o", str(st)] + STRACE[1:] +
                         [prog, "server", addr, str(port), srv_mode]),
               preloaded(softverbs_run, ["strace", "-o", str(ct)] + STRACE[1:] +
                         [prog, "client", addr, str(port), str(size), cli_mode]),
               run_env, lambda: cm_listening(port), timeout=TIMEOUT)
    sout, cout = check_pair(res, "sv_rs_echo")
    ms = re.search(r"server bytes=(\d+) sum=(\w+)", sout)
    mc = re.search(r"client bytes=(\d+) sum=(\w+)", cout)
    assert ms and mc, (sout, cout)
    assert int(ms.group(1)) == size and ms.groups() == mc.groups(), (sout, cout)
    check_strace(st, "server")
    check_strace(ct, "client")


def test_preload_really_rsockets(run_env, softverbs_run, build_dir):
    """The same echo without librspreload does use TCP: the strace check
    above can fail."""
    need("strace")
    prog = echo_prog(build_dir)
    port = next(_port)
    import test_perftest
    srv = start([softverbs_run, prog, "server", "127.0.0.1", str(port), "block"], run_env)
    try:
        wait_ready(srv, lambda: test_perftest.listening(port))
        p = svtest.run(["strace", "-f", "-qq", "-o", "/dev/stdout", "-e", "trace=connect",
                        prog, "client", "127.0.0.1", str(port), "100000", "poll"],
                       run_env, timeout=TIMEOUT)
        assert p.returncode == 0, p.stdout + p.stderr
        assert re.search(r"connect\(\d+, \{sa_family=AF_INET,", p.stdout), p.stdout
        srv.wait(timeout=TIMEOUT)
    finally:
        kill_group(srv)


# ------------------------------------------------------ by ctypes ---

CTYPES = textwrap.dedent(r'''
    import ctypes, errno, json, os, select, socket, struct, sys, time
    rs = ctypes.CDLL("librdmacm.so.1", use_errno=True)
    path = [l.split()[-1] for l in open("/proc/self/maps") if "librdmacm" in l][0]
    assert "libibverbs-compat" in path, path
    rs.rsend.restype = ctypes.c_ssize_t
    rs.rrecv.restype = ctypes.c_ssize_t
    rs.rsend.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
    rs.rrecv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    SOL_RDMA = 0x10000

    class PollFd(ctypes.Structure):
        _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]

    def sin(ip, port):
        if ":" in ip:
            b = struct.pack("=HHI16sI", socket.AF_INET6, socket.htons(port), 0,
                            socket.inet_pton(socket.AF_INET6, ip), 0)
        else:
            b = struct.pack("=HH4s8x", socket.AF_INET, socket.htons(port), socket.inet_aton(ip))
        return ctypes.create_string_buffer(b, len(b)), len(b)

    def err(ret):
        return 0 if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())

    def sock(fam=socket.AF_INET):
        s = rs.rsocket(fam, socket.SOCK_STREAM, 0)
        assert s >= 0, err(s)
        return s

    def rpoll(pairs, timeout):
        arr = (PollFd * len(pairs))(*[PollFd(f, e, 0) for f, e in pairs])
        n = rs.rpoll(arr, len(pairs), timeout)
        assert n >= 0, err(n)
        return [a.revents for a in arr]

    def recv_all(s, n, timeout=30):
        buf = ctypes.create_string_buffer(n)
        got = 0
        end = time.monotonic() + timeout
        while got < n and time.monotonic() < end:
            r = rs.rrecv(s, ctypes.byref(buf, got), n - got, 0)
            if r < 0 and ctypes.get_errno() == errno.EAGAIN:
                rpoll([(s, select.POLLIN)], 1000)
                continue
            if r <= 0:
                break
            got += r
        return buf.raw[:got]
''')


def rs_child(code, env, timeout=TIMEOUT, **kw):
    p = svtest.run([svtest.PYTHON, "-c", CTYPES + textwrap.dedent(code)], env, timeout=timeout, **kw)
    if p.returncode != 0:
        raise AssertionError(f"child exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    return json.loads(lines[-1])


def test_errors(link, env):
    """The documented errnos, one process: both ends of a connection made
    with a nonblocking rconnect and rpoll."""
    port, free = next(_port), next(_port)
    r = rs_child(f'''
        out = {{}}
        a, alen = sin("127.0.0.1", {port})
        l = sock()
        one = ctypes.c_int(1)
        out["reuse"] = err(rs.rsetsockopt(l, socket.SOL_SOCKET, socket.SO_REUSEADDR, ctypes.byref(one), 4))
        out["bind"] = err(rs.rbind(l, a, alen))
        l2 = sock()
        out["bind_in_use"] = err(rs.rbind(l2, a, alen))
        rs.rclose(l2)
        out["listen"] = err(rs.rlisten(l, 4))
        c = sock()
        f, flen = sin("127.0.0.1", {free})
        out["refused"] = err(rs.rconnect(c, f, flen))
        rs.rclose(c)
        # a nonblocking connect refused: EINPROGRESS, then SO_ERROR
        c = sock()
        O_NONBLOCK = os.O_NONBLOCK
        rs.rfcntl(c, 4, ctypes.c_long(O_NONBLOCK))  # F_SETFL
        out["nb_flags"] = bool(rs.rfcntl(c, 3) & O_NONBLOCK)  # F_GETFL
        out["nb_refused"] = err(rs.rconnect(c, f, flen))
        rpoll([(c, select.POLLOUT)], 10000)
        so = ctypes.c_int(-1); ln = ctypes.c_uint(4)
        rs.rgetsockopt(c, socket.SOL_SOCKET, socket.SO_ERROR, ctypes.byref(so), ctypes.byref(ln))
        out["nb_so_error"] = errno.errorcode.get(so.value, so.value)
        rs.rclose(c)
        # a nonblocking connect that succeeds, accepted in the same process
        c = sock()
        rs.rfcntl(c, 4, ctypes.c_long(O_NONBLOCK))
        out["nb_connect"] = err(rs.rconnect(c, a, alen))
        end = time.monotonic() + 20
        while time.monotonic() < end and not rpoll([(l, select.POLLIN)], 0)[0]:
            rpoll([(c, select.POLLOUT), (l, select.POLLIN)], 100)
        acc = rs.raccept(l, None, None)
        out["accept"] = err(acc)
        while time.monotonic() < end and not rpoll([(c, select.POLLOUT)], 100)[0] & select.POLLOUT:
            pass
        so = ctypes.c_int(-1)
        rs.rgetsockopt(c, socket.SOL_SOCKET, socket.SO_ERROR, ctypes.byref(so), ctypes.byref(ln))
        out["so_error"] = so.value
        sa = ctypes.create_string_buffer(128); sl = ctypes.c_uint(128)
        rs.rgetpeername(acc, sa, ctypes.byref(sl))
        cl = ctypes.create_string_buffer(128); cll = ctypes.c_uint(128)
        rs.rgetsockname(c, cl, ctypes.byref(cll))
        out["names_match"] = sa.raw[:sl.value] == cl.raw[:cll.value] and sl.value == 16
        pa = ctypes.create_string_buffer(128); pl = ctypes.c_uint(128)
        rs.rgetpeername(c, pa, ctypes.byref(pl))
        out["peer_port"] = socket.ntohs(struct.unpack_from("=H", pa.raw, 2)[0])
        out["listen_connected"] = err(rs.rlisten(c, 4))
        out["connect_connected"] = err(rs.rconnect(c, a, alen))
        buf = ctypes.create_string_buffer(100)
        out["recv_empty_nb"] = err(rs.rrecv(acc, buf, 100, socket.MSG_DONTWAIT))
        # c is nonblocking: send what fits, drain the other end as we go
        data = bytes(range(256)) * 4000
        rest, rcv = data, b""
        b = ctypes.create_string_buffer(70000)
        while time.monotonic() < end + 30 and (rest or len(rcv) < len(data)):
            if rest:
                n = rs.rsend(c, rest, len(rest), 0)
                assert n > 0 or ctypes.get_errno() == errno.EAGAIN, err(n)
                if n > 0:
                    rest = rest[n:]
            n = rs.rrecv(acc, b, 70000, socket.MSG_DONTWAIT)
            assert n > 0 or ctypes.get_errno() == errno.EAGAIN, err(n)
            if n > 0:
                rcv += b.raw[:n]
        out["data"] = rcv == data
        out["shutdown"] = err(rs.rshutdown(c, socket.SHUT_WR))
        out["send_after_shutdown"] = err(rs.rsend(c, b"x", 1, 0))
        out["eof_after_shutdown"] = rs.rrecv(acc, buf, 100, 0)
        out["send_back"] = rs.rsend(acc, b"back", 4, 0)
        out["recv_back"] = recv_all(c, 4).decode()
        out["close"] = err(rs.rclose(c))
        out["eof_after_close"] = rs.rrecv(acc, buf, 100, 0)
        r, n = 0, 0
        while r >= 0 and n < 500:
            r = rs.rsend(acc, b"y", 1, 0)
            n += 1
            time.sleep(0.01)
        out["send_after_peer_close"] = err(r) in ("EPIPE", "ECONNRESET")
        out["close_acc"] = err(rs.rclose(acc))
        out["badf_recv"] = err(rs.rrecv(9999, buf, 1, 0))
        out["badf_send"] = err(rs.rsend(9999, b"x", 1, 0))
        out["badf_close"] = err(rs.rclose(acc))
        out["badf_bind"] = err(rs.rbind(9999, a, alen))
        out["badf_fcntl"] = err(rs.rfcntl(9999, 3))
        out["dgram"] = err(rs.rsocket(socket.AF_INET, socket.SOCK_DGRAM, 0))
        out["close_listener"] = err(rs.rclose(l))
        print(json.dumps(out))
    ''', env)
    assert r == {
        "reuse": 0, "bind": 0, "bind_in_use": "EADDRINUSE", "listen": 0,
        "refused": "ECONNREFUSED", "nb_flags": True, "nb_refused": "EINPROGRESS",
        "nb_so_error": "ECONNREFUSED", "nb_connect": "EINPROGRESS", "accept": 0,
        "so_error": 0, "names_match": True, "peer_port": port,
        "listen_connected": "EINVAL", "connect_connected": "EISCONN",
        "recv_empty_nb": "EAGAIN", "data": True,
        "shutdown": 0, "send_after_shutdown": "EPIPE", "eof_after_shutdown": 0,
        "send_back": 4, "recv_back": "back", "close": 0, "eof_after_close": 0,
        "send_after_peer_close": True, "close_acc": 0,
        "badf_recv": "EBADF", "badf_send": "EBADF", "badf_close": "EBADF",
        "badf_bind": "EBADF", "badf_fcntl": "EBADF", "dgram": "ENOTSUP",  # EOPNOTSUPP, the same number on Linux
        "close_listener": 0,
    }, r


def test_threads(link, env):
    """One rsocket used by two threads at once (a blocking rsend of 20 MB
    and a blocking rrecv of its echo), the echo made by a third thread on
    the accepted socket, all in one process: every byte comes back and no
    thread is left blocked."""
    port = next(_port)
    code = ('''
import threading
a, alen = sin("127.0.0.1", PORT)
l = sock()
assert rs.rbind(l, a, alen) == 0
assert rs.rlisten(l, 1) == 0
c = sock()
res = {}
def conn():
    res["c"] = rs.rconnect(c, a, alen)
t = threading.Thread(target=conn); t.start()
acc = rs.raccept(l, None, None)
t.join()
assert res["c"] == 0 and acc >= 0
N = 20_000_000
data = os.urandom(1 << 20)
def sender():
    sent = 0
    while sent < N:
        n = min(len(data), N - sent)
        r = rs.rsend(c, data[:n], n, 0)
        assert r > 0, err(r)
        sent += r
    rs.rshutdown(c, socket.SHUT_WR)
def echo():
    b = ctypes.create_string_buffer(1 << 20)
    while True:
        n = rs.rrecv(acc, b, 1 << 20, 0)
        assert n >= 0, err(n)
        if n == 0:
            break
        off = 0
        while off < n:
            r = rs.rsend(acc, b.raw[off:n], n - off, 0)
            assert r > 0, err(r)
            off += r
    rs.rclose(acc)
got = [0]
def receiver():
    b = ctypes.create_string_buffer(1 << 20)
    while True:
        n = rs.rrecv(c, b, 1 << 20, 0)
        assert n >= 0, err(n)
        if n == 0:
            break
        got[0] += n
ts = [threading.Thread(target=f) for f in (sender, echo, receiver)]
t0 = time.monotonic()
for t in ts: t.start()
for t in ts: t.join(120)
alive = [t.is_alive() for t in ts]
print(json.dumps({"got": got[0], "alive": alive}), flush=True)
os._exit(0)  # a thread left blocked must not hold the exit
''').replace("PORT", str(port))
    r = rs_child(code, env, timeout=TIMEOUT)
    assert r == {"got": 20_000_000, "alive": [False, False, False]}, r


# --------------------------------------------------- a killed peer ---

PEER = r'''
    a, alen = sin("127.0.0.1", PORT)
    c = sock()
    assert rs.rconnect(c, a, alen) == 0, err(-1)
    msg = b"ping" * 1000
    assert rs.rsend(c, msg, len(msg), 0) == len(msg)
    assert recv_all(c, len(msg)) == msg
    print("ready", flush=True)
    sys.stdin.readline()   # the test kills the server, then says go
    t0 = time.monotonic()
    out = {}
    buf = ctypes.create_string_buffer(100)
    out["recv"] = rs.rrecv(c, buf, 100, 0)
    r, n = 0, 0
    while r >= 0 and n < 10000:
        r = rs.rsend(c, msg, len(msg), 0)
        n += 1
    out["send"] = err(r)
    out["secs"] = time.monotonic() - t0
    out["close"] = err(rs.rclose(c))
    print(json.dumps(out), flush=True)
'''


def test_killed_server(link, run_env, env, softverbs_run, build_dir):
    """The echo server (under librspreload) killed with SIGKILL after an
    exchange: the client reads end of file and its sends fail with EPIPE
    or ECONNRESET, promptly, without hanging."""
    if not os.path.exists(PRELOAD):
        pytest.skip("librspreload.so not installed")
    prog = echo_prog(build_dir)
    port = next(_port)
    srv = start(preloaded(softverbs_run, [prog, "server", "127.0.0.1", str(port), "block"]), run_env)
    cli = None
    try:
        wait_ready(srv, lambda: cm_listening(port))
        cli = subprocess.Popen([svtest.PYTHON, "-c", CTYPES + textwrap.dedent(PEER).replace("PORT", str(port))],
                               env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = read_line(cli, 30)
        assert line == "ready", line + cli.stderr.read()
        os.killpg(srv.pid, signal.SIGKILL)
        srv.wait(timeout=10)
        cli.stdin.write("go\n")
        cli.stdin.flush()
        out, errout = cli.communicate(timeout=60)
        assert cli.returncode == 0, out + errout
        r = json.loads(out.strip().splitlines()[-1])
        assert r["recv"] == 0, r
        assert r["send"] in ("EPIPE", "ECONNRESET"), r
        assert r["close"] == 0 and r["secs"] < 30, r
    finally:
        kill_group(srv)
        if cli:
            kill_group(cli)


def test_killed_client(link, run_env, softverbs_run, build_dir):
    """The client killed mid-stream: the echo server, blocked in read() or
    write(), gets end of file or EPIPE and exits instead of hanging."""
    if not os.path.exists(PRELOAD):
        pytest.skip("librspreload.so not installed")
    prog = echo_prog(build_dir)
    port = next(_port)
    srv = start(preloaded(softverbs_run, [prog, "server", "127.0.0.1", str(port), "block"]), run_env)
    cli = None
    try:
        wait_ready(srv, lambda: cm_listening(port))
        # a client that will never finish: far more bytes than it has time for
        cli = start(preloaded(softverbs_run, [prog, "client", "127.0.0.1", str(port), "100000000000", "poll"]),
                    run_env)
        time.sleep(1.5)
        assert cli.poll() is None, cli.stdout.read()
        os.killpg(cli.pid, signal.SIGKILL)
        out = srv.communicate(timeout=30)[0]
        # It was echoing: end of file on its read, or EPIPE/ECONNRESET on
        # its write, as with TCP; either way it is out promptly.
        m = re.search(r"server bytes=(\d+)", out)
        if srv.returncode == 0:
            assert m and int(m.group(1)) > 0, out
        else:
            assert srv.returncode == 2 and re.search(r"write: (Broken pipe|Connection reset)", out), out
    finally:
        kill_group(srv)
        if cli:
            kill_group(cli)


def wait_ready(srv, ready):
    deadline = time.monotonic() + 15
    while not ready():
        if srv.poll() is not None or time.monotonic() > deadline:
            kill_group(srv)
            raise AssertionError("server never listened:\n" + (srv.stdout.read() if srv.stdout else ""))
        time.sleep(0.02)


def read_line(p, timeout):
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        return "(nothing)"
    return p.stdout.readline().strip()


def echo_sums(sout, cout, size):
    ms = re.search(r"server bytes=(\d+) sum=(\w+)", sout)
    mc = re.search(r"client bytes=(\d+) sum=(\w+)", cout)
    assert ms and mc, (sout, cout)
    assert int(ms.group(1)) == size and ms.groups() == mc.groups(), (sout, cout)


def test_preload_dual_stack_listener(link, run_env, softverbs_run, build_dir):
    """A listener on :: with IPV6_V6ONLY off (iperf3's default) and an
    IPv4 client, both under librspreload: IPV6_V6ONLY is the CM's AFONLY,
    as in rdma-core's rsockets.  It was refused (ENOTSUP), and such a
    server did not start."""
    if not os.path.exists(PRELOAD):
        pytest.skip("librspreload.so not installed")
    prog = echo_prog(build_dir)
    port = next(_port)
    res = pair(preloaded(softverbs_run, [prog, "server", "::", str(port), "dual"]),
               preloaded(softverbs_run, [prog, "client", "127.0.0.1", str(port), "200000", "poll"]),
               run_env, lambda: cm_listening(port), timeout=TIMEOUT)
    sout, cout = check_pair(res, "sv_rs_echo")
    echo_sums(sout, cout, 200000)


def test_preload_client_of_a_plain_tcp_server(run_env, softverbs_run, build_dir):
    """A preloaded client of a server that is not under the preload: no
    rsocket listens, and librspreload moves the socket onto a real one,
    asking getsockname for the length with a null address first.  That
    got EFAULT (the kernel and rdma-core answer the length), so a
    preloaded program reached no plain TCP server at all."""
    if not os.path.exists(PRELOAD):
        pytest.skip("librspreload.so not installed")
    from test_traffic_pingpong import listening
    prog = echo_prog(build_dir)
    port = next(_port)
    res = pair([prog, "server", "127.0.0.1", str(port), "block"],
               preloaded(softverbs_run, [prog, "client", "127.0.0.1", str(port), "200000", "poll"]),
               run_env, lambda: listening(port), timeout=TIMEOUT)
    sout, cout = check_pair(res, "sv_rs_echo")
    echo_sums(sout, cout, 200000)
