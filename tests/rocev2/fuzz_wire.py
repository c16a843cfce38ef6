#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Sends random and mutated RoCE v2 packets to a host's UDP port.

    fuzz_wire.py DST_IP SRC_IP --qpn N [--count N] [--port 4791] [--seed S] [--flood N]

Three kinds, in turn: random bytes of random length (most fail framing or
the ICRC); well-formed headers of random opcodes with random fields, a
random payload and a correct ICRC, addressed to QP --qpn or a random one
(they reach the PSN window, the QP lookup and the responder); and such a
packet with bits flipped after its ICRC was computed (bad ICRC).  The
ICRC is the rocev2 wire test's implementation from the spec (no code of
the transport).  Prints how many of each it sent.
"""
import argparse
import os
import pathlib
import random
import socket
import struct
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent.parent / "pyverbs-tests"))
from test_rocev2_wire import icrc_of  # noqa: E402

# The extension headers' lengths after the BTH, by opcode (RC, UC, UD; the
# rest are sent too, as the responder must drop them).
EXT = {}
for base in (0x00, 0x20):
    for low, n in {0: 0, 1: 0, 2: 0, 3: 4, 4: 0, 5: 4, 6: 16, 7: 0, 8: 0, 9: 4, 10: 16,
                   11: 20}.items():
        EXT[base | low] = n
EXT.update({0x0c: 16, 0x0d: 4, 0x0e: 0, 0x0f: 4, 0x10: 4, 0x11: 4, 0x12: 12, 0x13: 28,
            0x14: 28, 0x16: 4, 0x17: 4, 0x1d: 16, 0x64: 8, 0x65: 12, 0x81: 0})


def ip_udp(src, dst, sport, dport, payload):
    """The IPv4 and UDP headers Linux sends (identification 0, DF, TTL 64),
    checksums left for the ICRC's masking."""
    total = 20 + 8 + len(payload)
    iph = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 17, 0,
                      socket.inet_aton(src), socket.inet_aton(dst))
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    return iph, udp


def packet(rng, qpn):
    op = rng.choice(list(EXT))
    ext = rng.randbytes(EXT[op])
    paylen = rng.choice([0, 0, 4, 8, 60, 256, 1024, rng.randrange(0, 1100)])
    pad = (4 - paylen % 4) % 4
    dqpn = qpn if rng.random() < 0.8 else rng.getrandbits(24)
    psn = rng.getrandbits(24)
    flags = rng.getrandbits(8) & 0xc0  # SE, M
    bth = struct.pack("!BBHII", op, flags | (pad << 4), 0xffff, dqpn,
                      (rng.getrandbits(1) << 31) | psn)
    return bth + ext + rng.randbytes(paylen + pad)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dst")
    ap.add_argument("src")
    ap.add_argument("--qpn", type=lambda s: int(s, 0), required=True)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--port", type=int, default=4791)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--flood", type=int, default=0,
                    help="first, a SEND of this many 1024-byte packets from PSN 0 "
                         "(FIRST, then MIDDLEs), with good ICRCs")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((a.src, 0))
    sport = s.getsockname()[1]
    sent = {"random": 0, "valid-icrc": 0, "bad-icrc": 0}
    errors = 0
    for k in range(a.flood):
        op = 0x00 if k == 0 else 0x01  # RC SEND FIRST, SEND MIDDLE
        body = struct.pack("!BBHII", op, 0, 0xffff, a.qpn, k & 0xffffff) + rng.randbytes(1024)
        iph, udp = ip_udp(a.src, a.dst, sport, a.port, body + b"\0" * 4)
        try:
            s.sendto(body + struct.pack("<I", icrc_of(iph, udp, body + b"\0" * 4)),
                     (a.dst, a.port))
        except OSError:
            errors += 1
    for i in range(a.count):
        kind = i % 3
        if kind == 0:
            data = rng.randbytes(rng.randrange(0, 200))
            sent["random"] += 1
        else:
            body = packet(rng, a.qpn)
            iph, udp = ip_udp(a.src, a.dst, sport, a.port, body + b"\0" * 4)
            crc = icrc_of(iph, udp, body + b"\0" * 4)
            data = bytearray(body + struct.pack("<I", crc))
            if kind == 2:
                for _ in range(rng.randrange(1, 4)):
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
                sent["bad-icrc"] += 1
            else:
                sent["valid-icrc"] += 1
            data = bytes(data)
        try:
            s.sendto(data, (a.dst, a.port))
        except OSError as e:
            errors += 1
            last = e
    print("fuzz_wire: sent", " ".join(f"{k}={v}" for k, v in sent.items()),
          f"errors={errors}" + (f" ({last})" if errors else ""), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
