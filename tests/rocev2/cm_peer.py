#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A CM peer forged from a plain UDP socket (no softverbs), for the rdma_cm
tests across hosts: it sends IB CM MADs in RoCE v2 packets to QP1 of the
host at DST, as another host's CM would, and reports what comes back.

    cm_peer.py flood DST SRC PORT N   N REQs with distinct comm IDs: prints
                                      how many REPs and REJs (by reason) came
    cm_peer.py rej-rep DST SRC PORT   a REQ, then a REJ of the REP it gets:
                                      prints how many REPs came after it
    cm_peer.py drep-late DST SRC PORT a server: answers a REQ from DST with a
                                      REP, then leaves the first DREQ that
                                      comes unanswered: prints how many came

Packets are built here from the spec (IBTA vol 1 tables 106, 108, 110;
the ICRC by the codec test's independent implementation), sharing no code
with the library.  Needs port 4791 free on SRC's host (no softverbs there).
"""
import socket
import struct
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent.parent /
                       "pyverbs-tests"))
from test_rocev2_wire import icrc_of  # noqa: E402

REQ, REJ, REP = 0x10, 0x12, 0x13


def mad_hdr(attr, tid):
    # Base version 1, class CM (7) version 2, method Send (3).
    return struct.pack("!BBBBHHQHHI", 1, 7, 2, 3, 0, 0, tid, attr, 0, 0)


def mapped(ip):
    return b"\0" * 10 + b"\xff\xff" + socket.inet_aton(ip)


def req(comm, sid, src, dst, sport):
    d = bytearray(232)
    struct.pack_into("!I", d, 0, comm)
    struct.pack_into("!Q", d, 8, sid)
    struct.pack_into("!I", d, 32, 0x123 << 8 | 1)     # local QPN, responder resources
    d[39] = 1                                          # initiator depth
    d[43] = 20 << 3                                    # remote CM timeout; RC
    struct.pack_into("!I", d, 44, 0x1000 << 8 | 20 << 3 | 7)  # PSN, CM timeout, retries
    struct.pack_into("!H", d, 48, 0xffff)              # P_Key
    d[50] = 3 << 4 | 7                                 # path MTU 1024, RNR retries
    d[51] = 15 << 4                                    # max CM retries
    struct.pack_into("!HH", d, 52, 0xffff, 0xffff)
    d[56:72] = mapped(src)
    d[72:88] = mapped(dst)
    d[93] = 64
    d[95] = 14 << 3
    # rdma_cm's header: version 0, IPv4, source port, addresses.
    d[141] = 0x40
    struct.pack_into("!H", d, 142, sport)
    d[156:160] = socket.inet_aton(src)
    d[172:176] = socket.inet_aton(dst)
    return bytes(d)


def packet(mad, src, dst, sport):
    bth = struct.pack("!BBHII", 0x64, 0, 0xffff, 1, 0)  # UD SEND ONLY to QP1
    deth = struct.pack("!II", 0x80010000, 1)             # GSI Q_Key, from QP1
    payload = bth + deth + mad + b"\0\0\0\0"
    total = 20 + 8 + len(payload)
    iph = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 17, 0,
                      socket.inet_aton(src), socket.inet_aton(dst))
    udp = struct.pack("!HHHH", sport, 4791, 8 + len(payload), 0)
    return payload[:-4] + struct.pack("<I", icrc_of(iph, udp, payload))


def answers(s, seconds):
    """(attr, comm IDs, reason) of every CM MAD received for a while."""
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        s.settimeout(max(0.01, end - time.monotonic()))
        try:
            data = s.recv(4096)
        except socket.timeout:
            break
        mad = data[20:276]
        if len(mad) < 256:
            continue
        attr = struct.unpack("!H", mad[16:18])[0]
        lcomm, rcomm = struct.unpack("!II", mad[24:32])
        reason = struct.unpack("!H", mad[34:36])[0] if attr == REJ else None
        out.append((attr, lcomm, rcomm, reason))
    return out


def main():
    mode, dst, src, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER: DF, identification 0
    s.bind((src, 4791))
    sid = 0x01060000 | port  # RDMA_PS_TCP
    if mode == "flood":
        n = int(sys.argv[5])

        def send_req(i):
            m = mad_hdr(REQ, 1000 + i) + req(0x1000 + i, sid, src, dst, 5000 + i)
            s.sendto(packet(m, src, dst, 4791), (dst, 4791))

        # The first REQ alone, until the listener answers it: rping 44
        # keeps one child id in a variable each connection request
        # overwrites, and a second request between its rdma_create_qp and
        # its rdma_accept makes it accept an id with no QP (EINVAL, and it
        # exits; fixed in rdma-core 57).  After its REP the rest flood in.
        send_req(0)
        got, end = [], time.monotonic() + 30
        while not got and time.monotonic() < end:
            got = answers(s, 0.5)
        for i in range(1, n):
            send_req(i)
            time.sleep(0.002)
        got += answers(s, 3)
        reps = len({a[1] for a in got if a[0] == REP})
        rejs = {}
        for a in got:
            if a[0] == REJ:
                rejs[a[3]] = rejs.get(a[3], 0) + 1
        print(f"cm_peer: sent {n} reps {reps} rejs {sorted(rejs.items())}", flush=True)
        return 0
    if mode == "drep-late":
        # A server: the REQ, our REP, the RTU; then DREQs, the first not
        # answered (lost, as far as the peer knows), a DREP to the next.
        got, end = [], time.monotonic() + 20
        while not got and time.monotonic() < end:
            got = [a for a in answers(s, 0.2) if a[0] == REQ][:1]
        if not got:
            print("cm_peer: no REQ", flush=True)
            return 1
        their = got[0][1]
        d = bytearray(232)
        struct.pack_into("!II", d, 0, 0x5555, their)
        struct.pack_into("!I", d, 12, 0x77 << 8)       # local QPN (nobody's)
        d[24] = d[25] = 1                              # responder resources, depth
        d[27] = 7 << 5                                 # RNR retry count
        s.sendto(packet(mad_hdr(REP, 5) + bytes(d), src, dst, 4791), (dst, 4791))
        dreqs, end = 0, time.monotonic() + 12
        while time.monotonic() < end:
            for a in answers(s, 0.2):
                if a[0] != 0x15:
                    continue
                dreqs += 1
                if dreqs == 2:
                    r = bytearray(232)
                    struct.pack_into("!II", r, 0, 0x5555, their)
                    s.sendto(packet(mad_hdr(0x16, 6) + bytes(r), src, dst, 4791),
                             (dst, 4791))
                    end = time.monotonic() + 1
        print(f"cm_peer: DREQs {dreqs}", flush=True)
        return 0
    # rej-rep: a REQ, its REP, then our REJ of that REP.
    m = mad_hdr(REQ, 77) + req(0xabc, sid, src, dst, 6000)
    s.sendto(packet(m, src, dst, 4791), (dst, 4791))
    got = [a for a in answers(s, 10) if a[0] == REP][:1]
    if not got:
        print("cm_peer: no REP", flush=True)
        return 1
    their = got[0][1]
    d = bytearray(232)
    struct.pack_into("!II", d, 0, 0xabc, their)
    d[8] = 1 << 6                      # message rejected: the REP
    struct.pack_into("!H", d, 10, 28)  # consumer reject
    s.sendto(packet(mad_hdr(REJ, 77) + bytes(d), src, dst, 4791), (dst, 4791))
    later = [a for a in answers(s, 4) if a[0] == REP]
    print(f"cm_peer: REPs after our REJ {len(later)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
