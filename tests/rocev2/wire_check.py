#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""wire_check: byte-exact RC traffic checker for softverbs' RoCE v2 transport.

perftest measures speed but checks nothing.  This program runs one RC QP on
each of two hosts (server and client, normally in different network
namespaces) and verifies every byte that crosses the wire:

  * RDMA WRITE of a (seed, i)-derived pattern into the server MR at an offset,
    then RDMA READ of that range plus guard bytes on both sides into another
    local buffer, compared against a local shadow copy of the server MR (so
    both wrong data and over-/under-runs on either side are caught);
  * ATOMIC FETCH_AND_ADD (add = i+1) on an 8-byte counter in the server MR,
    checking the returned old value, then a COMPARE_AND_SWAP that must succeed
    and one that must fail, checking the returned values; the server checks
    the final counter value at the end;
  * SEND and SEND_WITH_IMM (imm = i) of a payload behind a header (magic,
    iteration, sequence, length, CRC32, flags); the receiver checks status,
    opcode, wc_flags, byte_len, imm_data, sequence (nothing lost, duplicated
    or reordered), CRC32 and the payload itself;
  * the server SENDs back to the client periodically (both directions),
    checked likewise by the client.

Sizes and offsets are deterministic pseudo-random values from --seed: 0, 1 and
a few bytes, around the path MTU boundaries (mtu-1, mtu, mtu+1, 2*mtu...),
1023/1024/1025, multi-packet messages up to 70000 bytes.  The client's
initial send PSN defaults to just below 2^24 so the 24-bit PSN wraps early.

Connection data (QPN, PSN, GID, MR address/rkey) is exchanged over a TCP
socket as JSON lines.  At the end the server reports over TCP what it
verified; both print
    wire_check: OK role=... iters=... bytes=... sends=...
and exit 0, or print what failed and exit 1.  Everything is bounded by
--timeout (default 120 s): on expiry the program prints what it was waiting
for and exits 2.

Retry-exhaustion mode: `server --vanish` exits (os._exit, nothing destroyed)
right after sending its QP info; `client --expect-retry-exc` waits for the
server's TCP connection to close, connects with timeout 10 / retry_cnt 3, and
exits 0 iff its first SEND completes with IBV_WC_RETRY_EXC_ERR (12).

Usage:
    wire_check.py server --port P --gid-index G [--iters N] [--seed S] [--vanish]
    wire_check.py client SERVER_IP --port P --gid-index G [--iters N]
                  [--seed S] [--timeout T] [--expect-retry-exc]

Only Debian's python3 and python3-pyverbs are needed.
"""

import argparse
import json
import os
import random
import select
import socket
import struct
import sys
import threading
import time
import zlib

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import RecvWR, SendWR, SGE

MAX_SIZE = 70000            # largest message / RDMA transfer
OFF_MAX = 4096              # largest offset into the server's data region
GUARD = 16                  # guard bytes read back around each write
DATA_SIZE = OFF_MAX + MAX_SIZE + 2 * GUARD
COUNTER_OFF = (DATA_SIZE + 63) & ~63
SERVER_MR_SIZE = COUNTER_OFF + 64
HDR = struct.Struct('<IIIIII')  # magic, iter, seq, length, crc32, flags
MAGIC = 0x57434B31              # 'WCK1'
FLAG_IMM = 1
SLOT = HDR.size + MAX_SIZE
RECV_DEPTH = 32             # receive WRs kept posted on each side
BACK_SLOTS = 8              # server->client sends in flight at most
BACK_EVERY = 3              # server sends back after every 3rd message
RECV_BIT = 1 << 62          # wr_id marker of receive WRs
BACK_BIT = 1 << 61          # wr_id marker of server back-sends
MASK64 = (1 << 64) - 1
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
          e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)
INVERT = bytes(255 - b for b in range(256))
SENTINEL = b'\xc3' * GUARD


class Timeout(Exception):
    """The global deadline passed."""


class Failure(Exception):
    """A check failed or the peer reported a failure."""


class Clock:
    """Global deadline; `waiting` says what the program is waiting for."""

    def __init__(self, seconds):
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.waiting = 'start-up'

    def check(self):
        if time.monotonic() > self.end:
            raise Timeout(self.waiting)

    def left(self):
        return max(0.0, self.end - time.monotonic())

    def watchdog(self, role):
        """Backstop: if a verbs call itself blocks, exit 2 anyway."""
        def run():
            time.sleep(self.seconds + 10)
            print(f'wire_check: TIMEOUT role={role} (watchdog) waiting for: '
                  f'{self.waiting}', flush=True)
            os._exit(2)
        threading.Thread(target=run, daemon=True).start()


# ---------------------------------------------------------------- patterns --

def pattern(seed, i, kind, size):
    """Deterministic bytes for (seed, iteration, kind)."""
    if size == 0:
        return b''
    return random.Random(f'{seed}:{i}:{kind}').randbytes(size)


def plan(seed, iters, mtu):
    """Per-iteration (write size, offset, send size, imm-send size)."""
    rng = random.Random(f'{seed}:plan')
    special = [0, 1, 2, 3, 5, 8, 63, 64, mtu - 1, mtu, mtu + 1,
               2 * mtu - 1, 2 * mtu, 2 * mtu + 1, 1023, 1024, 1025,
               4095, 4096, 4097, 65536, MAX_SIZE]
    seen = set()
    special = [s for s in special if not (s in seen or seen.add(s))]

    def rand_size():
        r = rng.random()
        if r < 0.40:
            return rng.randrange(0, 65)
        if r < 0.75:
            return rng.randrange(0, 3 * mtu + 2)
        if r < 0.92:
            return rng.randrange(0, 16385)
        return rng.randrange(0, MAX_SIZE + 1)

    out = []
    for i in range(iters):
        wsize = special[i] if i < len(special) else rand_size()
        ssize = special[-1 - i] if i < len(special) else rand_size()
        isize = rand_size()
        r = rng.random()
        off = 0 if r < 0.2 else (rng.randrange(0, OFF_MAX // 8) * 8 if r < 0.5
                                 else rng.randrange(0, OFF_MAX))
        out.append((wsize, off, ssize, isize))
    return out


def back_plan(seed, n):
    """Sizes of the server's back-sends."""
    rng = random.Random(f'{seed}:back')
    return [rng.choice([0, 1, 7, 1023, 1024, 1025, rng.randrange(0, 4000),
                        rng.randrange(0, MAX_SIZE + 1)]) for _ in range(n)]


def n_back(iters):
    return (2 * iters) // BACK_EVERY


def atomic_script(seed, iters):
    """Yields (i, add, cas_swap, bad_swap) and tracks the counter value."""
    rng = random.Random(f'{seed}:atomic')
    init = rng.getrandbits(64)
    steps = [(i, i + 1, rng.getrandbits(64), rng.getrandbits(64))
             for i in range(iters)]
    return init, steps


def final_counter(seed, iters):
    """Counter value after all iterations: each iteration's successful
    COMPARE_AND_SWAP installs its swap value (the failing one changes
    nothing), so it is the last swap value."""
    init, steps = atomic_script(seed, iters)
    return steps[-1][2] if steps else init


def u64(b):
    return int.from_bytes(b, sys.byteorder)


def make_msg(seed, seq, it, kind, size, imm):
    payload = pattern(seed, seq, kind, size)
    hdr = HDR.pack(MAGIC, it, seq, size, zlib.crc32(payload),
                   FLAG_IMM if imm else 0)
    return hdr + payload


# --------------------------------------------------------------- TCP link --

class Link:
    """JSON lines over a TCP socket, bounded by the global clock."""

    def __init__(self, sock, clock):
        self.sock, self.clock, self.buf = sock, clock, b''
        self.eof = False

    def send(self, obj):
        self.sock.settimeout(max(0.1, self.clock.left()))
        self.sock.sendall((json.dumps(obj) + '\n').encode())

    def _fill(self, wait):
        r, _, _ = select.select([self.sock], [], [], wait)
        if r:
            data = self.sock.recv(65536)
            if not data:
                self.eof = True
            self.buf += data

    def poll(self):
        """Returns a message if one is available now, else None."""
        if b'\n' not in self.buf and not self.eof:
            self._fill(0)
        return self._pop()

    def _pop(self):
        if b'\n' in self.buf:
            line, self.buf = self.buf.split(b'\n', 1)
            return json.loads(line)
        return None

    def recv(self, what):
        self.clock.waiting = what
        while True:
            msg = self._pop()
            if msg is not None:
                return msg
            if self.eof:
                raise Failure(f'peer closed the TCP connection while waiting '
                              f'for {what}')
            self.clock.check()
            self._fill(min(0.2, self.clock.left()))

    def wait_eof(self, what):
        self.clock.waiting = what
        while not self.eof:
            self.clock.check()
            self._fill(min(0.2, self.clock.left()))


# ------------------------------------------------------------- RDMA side --

class Endpoint:
    """Device resources of one side: context, PD, CQ, one RC QP, MRs."""

    def __init__(self, args, clock, mr_sizes, recv_depth, send_depth):
        self.args, self.clock = args, clock
        self.ctx = Context(name=args.dev)
        self.port = self.ctx.query_port(args.ib_port)
        self.mtu_enum = self.port.active_mtu
        self.mtu = 128 << self.mtu_enum
        self.gid = self.ctx.query_gid(args.ib_port, args.gid_index)
        dev = self.ctx.query_device()
        self.rd_atom = max(1, min(4, dev.max_qp_rd_atom))
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, recv_depth + send_depth + 8, None, None, 0)
        cap = QPCap(max_send_wr=send_depth, max_recv_wr=recv_depth,
                    max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq,
                                         rcq=self.cq, cap=cap))
        self.mrs = {name: MR(self.pd, size, ACCESS)
                    for name, size in mr_sizes.items()}
        for mr in self.mrs.values():
            mr.write(b'\0' * mr.length, mr.length, 0)
        self.to_init()
        self.psn = (args.psn if args.psn is not None
                    else random.SystemRandom().getrandbits(24))

    def info(self):
        return {'qpn': self.qp.qp_num, 'psn': self.psn, 'gid': str(self.gid),
                'mtu': self.mtu}

    def to_init(self):
        """RESET -> INIT (receive WRs may be posted from INIT on)."""
        a = QPAttr()
        a.qp_state = e.IBV_QPS_INIT
        a.pkey_index = 0
        a.port_num = self.args.ib_port
        a.qp_access_flags = ACCESS
        self.qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX |
                       e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)

    def connect(self, peer, timeout, retry_cnt, rnr_retry=7, min_rnr_timer=1):
        """INIT -> RTR -> RTS towards the peer's QP."""
        port = self.args.ib_port
        a = QPAttr()
        a.qp_state = e.IBV_QPS_RTR
        a.path_mtu = self.mtu_enum
        a.dest_qp_num = peer['qpn']
        a.rq_psn = peer['psn']
        a.max_dest_rd_atomic = self.rd_atom
        a.min_rnr_timer = min_rnr_timer
        gr = GlobalRoute(dgid=GID(peer['gid']), sgid_index=self.args.gid_index,
                         hop_limit=64)
        a.ah_attr = AHAttr(port_num=port, is_global=1, gr=gr)
        self.qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU |
                       e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN |
                       e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
        a = QPAttr()
        a.qp_state = e.IBV_QPS_RTS
        a.timeout = timeout
        a.retry_cnt = retry_cnt
        a.rnr_retry = rnr_retry
        a.sq_psn = self.psn
        a.max_rd_atomic = self.rd_atom
        self.qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT |
                       e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY |
                       e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)

    def post_recv(self, slot):
        mr = self.mrs['recv']
        sge = SGE(mr.buf + slot * SLOT, SLOT, mr.lkey)
        self.qp.post_recv(RecvWR(wr_id=RECV_BIT | slot, num_sge=1, sg=[sge]))

    def post(self, wr_id, opcode, mr, off, length, remote=None, atomic=None,
             imm=None):
        """Posts one signaled send WR; length 0 posts num_sge = 0."""
        sge = SGE(mr.buf + off, length, mr.lkey)
        wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge],
                    send_flags=e.IBV_SEND_SIGNALED)
        if length == 0:
            wr.num_sge = 0
        if remote is not None:
            wr.set_wr_rdma(remote[1], remote[0])
        if atomic is not None:
            wr.set_wr_atomic(rkey=atomic[1], addr=atomic[0],
                             compare_add=atomic[2], swap=atomic[3])
        if imm is not None:
            wr.imm_data = socket.htonl(imm)
        self.qp.post_send(wr)

    def close(self):
        for obj in [self.qp] + list(self.mrs.values()) + [self.cq, self.pd,
                                                          self.ctx]:
            try:
                obj.close()
            except Exception as ex:  # keep tearing down the rest
                print(f'wire_check: warning: close failed: {ex}',
                      file=sys.stderr)


class Receiver:
    """Checks an incoming message stream (seq, CRC, payload, imm, byte_len)."""

    def __init__(self, ep, seed, kind_of, limit, errors):
        self.ep, self.seed, self.kind_of, self.errors = ep, seed, kind_of, errors
        self.limit = limit
        self.next_seq = 0
        self.bytes = 0

    def handle(self, wc):
        slot = wc.wr_id & ~RECV_BIT
        mr = self.ep.mrs['recv']
        where = f'recv seq {self.next_seq}'
        if self.next_seq >= self.limit:
            self.errors.append(f'{where}: more messages than the {self.limit} '
                               f'expected (byte_len {wc.byte_len})')
            self.next_seq += 1
            self.ep.post_recv(slot)
            return
        if wc.opcode != e.IBV_WC_RECV:
            self.errors.append(f'{where}: wc.opcode {wc.opcode} != RECV')
        n = wc.byte_len
        if n < HDR.size or n > SLOT:
            self.errors.append(f'{where}: bad byte_len {n}')
            self.next_seq += 1
            self.ep.post_recv(slot)
            return
        raw = mr.read(n, slot * SLOT)
        magic, it, seq, size, crc, flags = HDR.unpack_from(raw)
        payload = raw[HDR.size:]
        exp_kind, exp_it, exp_size, exp_imm = self.kind_of(self.next_seq)
        problems = []
        if magic != MAGIC:
            problems.append(f'magic {magic:#x}')
        if seq != self.next_seq:
            problems.append(f'sequence {seq} (lost, duplicated or reordered)')
        if it != exp_it:
            problems.append(f'iteration {it} != {exp_it}')
        if size != exp_size or n != HDR.size + exp_size:
            problems.append(f'byte_len {n} / header length {size}, expected '
                            f'{HDR.size + exp_size}')
        if zlib.crc32(payload) != crc:
            problems.append('CRC32 mismatch')
        if payload != pattern(self.seed, self.next_seq, exp_kind, exp_size):
            problems.append('payload differs from the expected pattern')
        has_imm = bool(wc.wc_flags & e.IBV_WC_WITH_IMM)
        if exp_imm is None:
            if has_imm or flags & FLAG_IMM:
                problems.append('unexpected immediate data')
        else:
            if not has_imm:
                problems.append('IBV_WC_WITH_IMM missing')
            elif socket.ntohl(wc.imm_data) != exp_imm:
                problems.append(f'imm_data {socket.ntohl(wc.imm_data)} != '
                                f'{exp_imm}')
        if problems:
            self.errors.append(f'{where}: ' + '; '.join(problems))
        else:
            self.bytes += exp_size
        self.next_seq += 1
        self.ep.post_recv(slot)


def wc_fail(wc, what, ep=None, rest=()):
    """Describes a failed completion.  With ep, drains the CQ briefly so the
    report names the root cause, not just the first flushed WR."""
    msg = (f'{what}: completion status {wc.status} (not IBV_WC_SUCCESS) '
           f'opcode {wc.opcode} wr_id {wc.wr_id:#x} vendor_err {wc.vendor_err}')
    if ep is None:
        return msg
    msg += f' (while waiting for {ep.clock.waiting})'
    others = {}
    for w in rest:  # the rest of the batch that held the failed completion
        if w.status != e.IBV_WC_SUCCESS:
            others.setdefault(w.status, []).append(w.wr_id)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        n, wcs = ep.cq.poll(16)
        for w in wcs[:n]:
            if w.status != e.IBV_WC_SUCCESS:
                others.setdefault(w.status, []).append(w.wr_id)
    if others:
        msg += '; other failed completions: ' + ', '.join(
            f'status {st} x{len(ids)} (wr_ids {", ".join(hex(x) for x in ids[:4])})'
            for st, ids in others.items())
    try:
        msg += f'; QP state now {ep.qp.query(e.IBV_QP_STATE)[0].qp_state}'
    except Exception as ex:  # diagnostics only
        msg += f'; QP query failed: {ex}'
    return msg


# ------------------------------------------------------------------ server --

def run_server(args, clock):
    lsock = socket.socket(socket.AF_INET6 if ':' in args.bind else
                          socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((args.bind, args.port))
    lsock.listen(1)
    clock.waiting = f'a TCP connection on port {args.port}'
    lsock.settimeout(max(0.1, clock.left()))
    try:
        sock, _ = lsock.accept()
    except socket.timeout:
        raise Timeout(clock.waiting)
    lsock.close()
    link = Link(sock, clock)
    hello = link.recv('the client hello')
    iters, seed = hello['iters'], hello['seed']

    ep = Endpoint(args, clock, {'data': SERVER_MR_SIZE, 'recv': RECV_DEPTH * SLOT,
                                'send': BACK_SLOTS * SLOT},
                  RECV_DEPTH, BACK_SLOTS + 4)
    data = ep.mrs['data']
    init, _ = atomic_script(seed, iters)
    data.write(init.to_bytes(8, sys.byteorder), 8, COUNTER_OFF)
    if not args.no_recv:
        for s in range(RECV_DEPTH):
            ep.post_recv(s)
    # RNR modes: a timer of 1.92 ms (code 14) between the requester's tries.
    ep.connect(hello, 14, 7, min_rnr_timer=14 if args.no_recv else 1)
    reply = ep.info()
    reply.update(addr=data.buf, rkey=data.rkey, counter=data.buf + COUNTER_OFF)
    link.send(reply)
    if args.vanish:
        print('wire_check: server vanishing after the exchange', flush=True)
        os._exit(0)
    if args.no_recv:
        try:
            return server_rnr(args, clock, link, ep, hello)
        finally:
            ep.close()
            sock.close()

    try:
        return server_traffic(args, clock, link, ep, hello)
    finally:
        ep.close()
        sock.close()


def server_traffic(args, clock, link, ep, hello):
    iters, seed = hello['iters'], hello['seed']
    steps = plan(seed, iters, min(ep.mtu, hello['mtu']))
    errors = []

    def kind_of(seq):
        i, k = divmod(seq, 2)
        wsize, off, ssize, isize = steps[i]
        return ('c2s', i, ssize, None) if k == 0 else ('c2s', i, isize, i)

    rx = Receiver(ep, seed, kind_of, 2 * iters, errors)
    total_in = 2 * iters
    nback = n_back(iters)
    bsizes = back_plan(seed, nback)
    back_due = back_posted = back_done = 0
    free_slots = list(range(BACK_SLOTS))
    fatal = None
    polls = 0
    early_done = None  # The client's "done", if it came while we were still busy
    send_mr = ep.mrs['send']
    while fatal is None and (rx.next_seq < total_in or back_done < nback):
        clock.waiting = (f'client messages (verified {rx.next_seq}/{total_in})'
                         f' and back-send completions ({back_done}/{nback})')
        n, wcs = ep.cq.poll(8)
        for k, wc in enumerate(wcs[:n]):
            if wc.status != e.IBV_WC_SUCCESS:
                fatal = wc_fail(wc, 'server', ep, wcs[k + 1:n])
                break
            if wc.wr_id & RECV_BIT:
                rx.handle(wc)
                if rx.next_seq % BACK_EVERY == 0:
                    back_due += 1
            elif wc.wr_id & BACK_BIT:
                if wc.opcode != e.IBV_WC_SEND:
                    errors.append(f'back-send: wc.opcode {wc.opcode} != SEND')
                free_slots.append(wc.wr_id & 0xffff)
                back_done += 1
            else:
                fatal = f'server: unexpected completion wr_id {wc.wr_id:#x}'
        while fatal is None and back_posted < back_due and free_slots:
            j = back_posted
            slot = free_slots.pop()
            imm = j if j % 2 else None
            msg = make_msg(seed, j, j, 's2c', bsizes[j], imm is not None)
            send_mr.write(msg, len(msg), slot * SLOT)
            ep.post(BACK_BIT | slot, e.IBV_WR_SEND_WITH_IMM if imm is not None
                    else e.IBV_WR_SEND, send_mr, slot * SLOT, len(msg), imm=imm)
            back_posted += 1
        polls += 1
        if polls % 256 == 0:
            msg = link.poll() if early_done is None else None
            if msg is not None and 'done' in msg and 'abort' not in msg:
                # The client saw everything before our last send completed
                # (its ACK was late or lost and sent again): not an abort.
                early_done = msg
            elif msg is not None:
                fatal = f'client aborted: {msg.get("abort", msg)}'
            elif link.eof and early_done is None:
                fatal = 'client closed the TCP connection'
            clock.check()
    if fatal is not None:
        errors.append(fatal)
        try:
            link.send({'abort': fatal, 'errors': errors[:20]})
        except OSError:
            pass
        raise Failure('; '.join(errors[:5]))

    done = early_done if early_done is not None else link.recv('the client "done" message')
    if 'abort' in done:
        raise Failure(f'client aborted: {done["abort"]}')
    counter = u64(ep.mrs['data'].read(8, COUNTER_OFF))
    expect = final_counter(seed, iters)
    if counter != expect:
        errors.append(f'final counter {counter:#x} != expected {expect:#x}')
    report = {'verified': rx.next_seq, 'bytes': rx.bytes, 'back_sent': back_done,
              'counter': counter, 'errors': errors[:20],
              'n_errors': len(errors)}
    link.send(report)
    link.recv('the client "bye"')
    if errors:
        raise Failure(f'{len(errors)} errors, first: ' + '; '.join(errors[:5]))
    print(f'wire_check: OK role=server iters={iters} bytes={rx.bytes} '
          f'sends={rx.next_seq} back_sends={back_done} counter={counter:#x}',
          flush=True)
    return 0


# ------------------------------------------------------------------ client --

def run_client(args, clock):
    clock.waiting = f'TCP connect to {args.server}:{args.port}'
    sock = None
    while sock is None:
        try:
            sock = socket.create_connection((args.server, args.port),
                                            timeout=min(2.0, clock.left() + 0.1))
        except OSError:
            clock.check()
            time.sleep(0.1)
    link = Link(sock, clock)
    ep = Endpoint(args, clock, {'src': MAX_SIZE + GUARD,
                                'dst': MAX_SIZE + 3 * GUARD,
                                'atomic': 64, 'recv': RECV_DEPTH * SLOT,
                                'send': SLOT}, RECV_DEPTH, 16)
    try:
        for s in range(RECV_DEPTH):
            ep.post_recv(s)
        hello = ep.info()
        hello.update(iters=args.iters, seed=args.seed)
        link.send(hello)
        peer = link.recv('the server QP info')
        if args.expect_retry_exc:
            return client_retry_exc(args, clock, link, ep, peer)
        if args.expect_rnr:
            return client_rnr(args, clock, link, ep, peer)
        ep.connect(peer, 14, 7)
        return client_traffic(args, clock, link, ep, peer)
    except (Failure, Timeout) as ex:
        try:
            link.send({'abort': f'{type(ex).__name__}: {ex}'})
        except OSError:
            pass
        raise
    finally:
        ep.close()
        sock.close()


def server_rnr(args, clock, link, ep, hello):
    """No receive WQE until the client says so; then the one message that
    arrives must be the client's, whole."""
    msg = link.recv('the client\'s word to post a receive, or its done')
    if msg.get('post'):
        ep.post_recv(0)
        clock.waiting = 'the SEND that waited for a receive WQE'
        while True:
            n, wcs = ep.cq.poll(1)
            if n:
                break
            clock.check()
        wc = wcs[0]
        want = make_msg(hello['seed'], 0, 0, 'c2s', 64, False)
        got = ep.mrs['recv'].read(len(want), 0)
        if wc.status != e.IBV_WC_SUCCESS or wc.byte_len != len(want) or got != want:
            raise Failure(f'after RNR: status {wc.status} byte_len {wc.byte_len}, '
                          f'payload {"intact" if got == want else "differs"}')
        link.send({'ok': True})
        msg = link.recv('the client done')
    print('wire_check: OK role=server mode=rnr', flush=True)
    return 0


def client_rnr(args, clock, link, ep, peer):
    """--expect-rnr wait: the SEND waits (RNR NAKs, rnr_retry 7) while the
    server has no receive WQE, and completes whole once it posts one.
    --expect-rnr exc: with rnr_retry 2 it fails with IBV_WC_RNR_RETRY_EXC_ERR."""
    wait = args.expect_rnr == 'wait'
    ep.connect(peer, 14, 7, rnr_retry=7 if wait else 2)
    msg = make_msg(args.seed, 0, 0, 'c2s', 64, False)
    ep.mrs['send'].write(msg, len(msg), 0)
    ep.post(1, e.IBV_WR_SEND, ep.mrs['send'], 0, len(msg))

    def completion(until):
        while time.monotonic() < until:
            n, wcs = ep.cq.poll(1)
            if n and not wcs[0].wr_id & RECV_BIT:
                return wcs[0]
            clock.check()
        return None
    if wait:
        wc = completion(time.monotonic() + 0.3)
        if wc is not None:
            raise Failure(f'the SEND completed (status {wc.status}) with no receive '
                          f'WQE at the responder')
        link.send({'post': True})
        clock.waiting = 'the SEND to complete once a receive WQE is there'
        wc = completion(time.monotonic() + clock.left())
        if wc is None or wc.status != e.IBV_WC_SUCCESS:
            raise Failure(f'after RNR waits: {wc and wc.status}')
        if not link.recv('the server\'s check').get('ok'):
            raise Failure('the server did not find the message')
    else:
        clock.waiting = 'the SEND to fail with IBV_WC_RNR_RETRY_EXC_ERR'
        wc = completion(time.monotonic() + clock.left())
        if wc is None or wc.status != e.IBV_WC_RNR_RETRY_EXC_ERR:
            raise Failure(f'expected IBV_WC_RNR_RETRY_EXC_ERR (13), got '
                          f'{wc and wc.status}')
    link.send({'done': True})
    print(f'wire_check: OK role=client mode=rnr-{args.expect_rnr} status={wc.status}',
          flush=True)
    return 0


def client_retry_exc(args, clock, link, ep, peer):
    link.wait_eof('the vanishing server to close its TCP connection')
    ep.connect(peer, 10, 3)
    msg = make_msg(args.seed, 0, 0, 'c2s', 64, False)
    ep.mrs['send'].write(msg, len(msg), 0)
    t0 = time.monotonic()
    if args.retry_op == 'write':
        # Several WRITEs in flight at once (the wire's pipelined path): the
        # first fails with RETRY_EXC_ERR, the others are flushed after it.
        for i in range(1, 5):
            ep.post(i, e.IBV_WR_RDMA_WRITE, ep.mrs['send'], 0, len(msg),
                    remote=(peer['addr'], peer['rkey']))
        want = 4
    else:
        ep.post(1, e.IBV_WR_SEND, ep.mrs['send'], 0, len(msg))
        want = 1
    clock.waiting = f'the first {args.retry_op.upper()} to fail with IBV_WC_RETRY_EXC_ERR'
    got = []
    while len(got) < want:
        n, wcs = ep.cq.poll(1)
        if n:
            if wcs[0].wr_id & RECV_BIT:
                continue
            got.append(wcs[0])
            continue
        clock.check()
    wc = got[0]
    dt = (time.monotonic() - t0) * 1000
    if wc.status != e.IBV_WC_RETRY_EXC_ERR or wc.wr_id != 1:
        raise Failure(f'expected IBV_WC_RETRY_EXC_ERR (12) on wr_id 1, got '
                      f'status {wc.status} wr_id {wc.wr_id} after {dt:.0f} ms')
    for i, w in enumerate(got[1:], 2):
        if w.status != e.IBV_WC_WR_FLUSH_ERR or w.wr_id != i:
            raise Failure(f'expected IBV_WC_WR_FLUSH_ERR (5) on wr_id {i}, got '
                          f'status {w.status} wr_id {w.wr_id}')
    print(f'wire_check: OK role=client mode=expect-retry-exc status={wc.status}'
          f' after {dt:.0f} ms', flush=True)
    return 0


def client_traffic(args, clock, link, ep, peer):
    seed, iters = args.seed, args.iters
    steps = plan(seed, iters, min(ep.mtu, peer['mtu']))
    nback = n_back(iters)
    bsizes = back_plan(seed, nback)
    errors = []

    def back_kind(j):
        return ('s2c', j, bsizes[j], j if j % 2 else None)

    rx = Receiver(ep, seed, back_kind, nback, errors)
    raddr, rkey, caddr = peer['addr'], peer['rkey'], peer['counter']
    src, dst, amr, smr = (ep.mrs['src'], ep.mrs['dst'], ep.mrs['atomic'],
                          ep.mrs['send'])
    shadow = bytearray(DATA_SIZE)
    wr_id = [0]
    polls = [0]

    def poll_once():
        n, wcs = ep.cq.poll(8)
        done = []
        bad = [wc for wc in wcs[:n] if wc.status != e.IBV_WC_SUCCESS]
        if bad:  # report the root cause first, not a flushed WR
            first = next((wc for wc in bad
                          if wc.status != e.IBV_WC_WR_FLUSH_ERR), bad[0])
            what = ('client receive' if first.wr_id & RECV_BIT
                    else clock.waiting)
            raise Failure(wc_fail(first, what, ep,
                                  [wc for wc in bad if wc is not first]))
        for wc in wcs[:n]:
            if wc.wr_id & RECV_BIT:
                rx.handle(wc)
            else:
                done.append(wc)
        polls[0] += 1
        if polls[0] % 256 == 0:
            msg = link.poll()
            if msg is not None:
                raise Failure(f'server aborted: {msg.get("abort", msg)} '
                              f'{msg.get("errors", "")}')
            clock.check()
        return done

    def op(what, opcode, wc_opcode, mr, off, length, **kw):
        wr_id[0] += 1
        ep.post(wr_id[0], opcode, mr, off, length, **kw)
        clock.waiting = f'completion of {what}'
        while True:
            for wc in poll_once():
                if wc.status != e.IBV_WC_SUCCESS:
                    raise Failure(wc_fail(wc, what, ep))
                if wc.wr_id != wr_id[0]:
                    raise Failure(f'{what}: completion for unexpected wr_id '
                                  f'{wc.wr_id} (expected {wr_id[0]})')
                if wc.opcode != wc_opcode:
                    raise Failure(f'{what}: wc.opcode {wc.opcode} != '
                                  f'{wc_opcode}')
                return wc

    init, asteps = atomic_script(seed, iters)
    value = init
    nbytes = 0
    for i, (wsize, off, ssize, isize) in enumerate(steps):
        tag = f'iter {i} (size {wsize} offset {off})'
        # RDMA WRITE then READ back with guards.
        pat = pattern(seed, i, 'w', wsize)
        if wsize:
            src.write(pat, wsize, 0)
        op(f'RDMA WRITE {tag}', e.IBV_WR_RDMA_WRITE, e.IBV_WC_RDMA_WRITE, src, 0,
           wsize, remote=(raddr + off, rkey))
        shadow[off:off + wsize] = pat
        lo, hi = max(0, off - GUARD), min(DATA_SIZE, off + wsize + GUARD)
        expect = bytes(shadow[lo:hi])
        pre = expect.translate(INVERT) + SENTINEL
        dst.write(pre, len(pre), 0)
        op(f'RDMA READ {tag}', e.IBV_WR_RDMA_READ, e.IBV_WC_RDMA_READ, dst, 0,
           hi - lo, remote=(raddr + lo, rkey))
        got = dst.read(hi - lo + GUARD, 0)
        if got[:hi - lo] != expect:
            bad = next(k for k in range(hi - lo) if got[k] != expect[k])
            raise Failure(f'RDMA READ-back {tag}: first wrong byte at '
                          f'server offset {lo + bad} (got {got[bad]:#x}, '
                          f'expected {expect[bad]:#x}); written range '
                          f'[{off}, {off + wsize})')
        if got[hi - lo:] != SENTINEL:
            raise Failure(f'RDMA READ {tag}: wrote past the local buffer')
        if wsize == 0:
            op(f'zero-length RDMA READ {tag}', e.IBV_WR_RDMA_READ,
               e.IBV_WC_RDMA_READ, dst, 0, 0, remote=(raddr + off, rkey))
        nbytes += 2 * wsize
        # Atomics.
        _, add, swap, bad_swap = asteps[i]
        amr.write(b'\xee' * 24, 24, 0)
        op(f'FETCH_AND_ADD iter {i}', e.IBV_WR_ATOMIC_FETCH_AND_ADD,
           e.IBV_WC_FETCH_ADD, amr, 0, 8, atomic=(caddr, rkey, add, 0))
        old = u64(amr.read(8, 0))
        if old != value:
            raise Failure(f'FETCH_AND_ADD iter {i}: returned {old:#x}, '
                          f'expected {value:#x}')
        value = (value + add) & MASK64
        op(f'COMPARE_AND_SWAP(ok) iter {i}', e.IBV_WR_ATOMIC_CMP_AND_SWP,
           e.IBV_WC_COMP_SWAP, amr, 8, 8, atomic=(caddr, rkey, value, swap))
        old = u64(amr.read(8, 8))
        if old != value:
            raise Failure(f'COMPARE_AND_SWAP(ok) iter {i}: returned {old:#x}, '
                          f'expected {value:#x}')
        value = swap
        wrong = value ^ (1 << (i % 64))
        op(f'COMPARE_AND_SWAP(fail) iter {i}', e.IBV_WR_ATOMIC_CMP_AND_SWP,
           e.IBV_WC_COMP_SWAP, amr, 16, 8, atomic=(caddr, rkey, wrong, bad_swap))
        old = u64(amr.read(8, 16))
        if old != value:
            raise Failure(f'COMPARE_AND_SWAP(fail) iter {i}: returned '
                          f'{old:#x}, expected {value:#x}')
        # SEND and SEND_WITH_IMM.
        for k, (size, imm) in enumerate(((ssize, None), (isize, i))):
            seq = 2 * i + k
            msg = make_msg(seed, seq, i, 'c2s', size, imm is not None)
            smr.write(msg, len(msg), 0)
            kind = 'SEND_WITH_IMM' if imm is not None else 'SEND'
            op(f'{kind} seq {seq} iter {i} (payload {size} bytes)',
               e.IBV_WR_SEND_WITH_IMM if imm is not None
               else e.IBV_WR_SEND, e.IBV_WC_SEND, smr, 0, len(msg), imm=imm)
            nbytes += size
        if errors:
            raise Failure('; '.join(errors[:5]))

    while rx.next_seq < nback:
        clock.waiting = f'server back-sends (verified {rx.next_seq}/{nback})'
        if poll_once():
            raise Failure('unexpected send completion after the last iteration')
    if errors:
        raise Failure('; '.join(errors[:5]))
    link.send({'done': True, 'back_verified': rx.next_seq})
    report = link.recv('the server report')
    if 'abort' in report:
        raise Failure(f'server aborted: {report["abort"]} {report.get("errors")}')
    problems = list(report.get('errors', []))
    if report.get('verified') != 2 * iters:
        problems.append(f'server verified {report.get("verified")} messages, '
                        f'expected {2 * iters}')
    if report.get('counter') != value:
        problems.append(f'server counter {report.get("counter")} != {value}')
    link.send({'bye': True})
    if problems:
        raise Failure(f'server reported: ' + '; '.join(problems[:5]))
    nbytes += rx.bytes
    print(f'wire_check: OK role=client iters={iters} bytes={nbytes} '
          f'sends={2 * iters} back_sends={rx.next_seq} server_bytes='
          f'{report.get("bytes")}', flush=True)
    return 0


# -------------------------------------------------------------------- main --

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('role', choices=['server', 'client'])
    p.add_argument('server', nargs='?', help='server IP (client only)')
    p.add_argument('--port', type=int, required=True, help='TCP port')
    p.add_argument('--gid-index', type=int, required=True)
    p.add_argument('--iters', type=int, default=200)
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--timeout', type=float, default=120.0,
                   help='global timeout in seconds (exit 2 when exceeded)')
    p.add_argument('--dev', default='loop0', help='device name')
    p.add_argument('--ib-port', type=int, default=1)
    p.add_argument('--psn', type=lambda s: int(s, 0), default=None,
                   help='initial send PSN (client default 0xffff80: wraps)')
    p.add_argument('--bind', default='0.0.0.0', help='server TCP address')
    p.add_argument('--vanish', action='store_true',
                   help='server: os._exit right after the QP exchange')
    p.add_argument('--retry-op', choices=['send', 'write'], default='send',
                   help='with --expect-retry-exc: one SEND, or four RDMA WRITEs')
    p.add_argument('--expect-retry-exc', action='store_true',
                   help='client: first SEND must end in IBV_WC_RETRY_EXC_ERR')
    p.add_argument('--no-recv', action='store_true',
                   help='server: post no receive WQE until the client asks '
                        '(with client --expect-rnr)')
    p.add_argument('--expect-rnr', choices=['wait', 'exc'],
                   help='client: with server --no-recv, the SEND waits out RNR '
                        'NAKs (wait) or ends in IBV_WC_RNR_RETRY_EXC_ERR (exc)')
    args = p.parse_args(argv)
    if args.role == 'client' and not args.server:
        p.error('client needs SERVER_IP')
    if args.role == 'client' and args.psn is None:
        args.psn = 0xffff80
    if args.iters < 1:
        p.error('--iters must be at least 1')
    clock = Clock(args.timeout)
    clock.watchdog(args.role)
    try:
        rc = run_server(args, clock) if args.role == 'server' else \
            run_client(args, clock)
    except Timeout as ex:
        print(f'wire_check: TIMEOUT role={args.role} after {args.timeout:g} s '
              f'waiting for: {ex}', flush=True)
        return 2
    except Failure as ex:
        print(f'wire_check: FAIL role={args.role}: {ex}', flush=True)
        return 1
    except Exception as ex:  # pyverbs errors, socket errors, ...
        print(f'wire_check: FAIL role={args.role}: {type(ex).__name__}: {ex}',
              flush=True)
        return 1
    return rc


if __name__ == '__main__':
    sys.exit(main())
