#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A requester forged from a plain UDP socket, holding host b's RoCE port,
that sends duplicate requests at a connected RC QP and prints what came back.

    forge_peer.py DST_IP SRC_IP --qpn N --va VA --rkey K

The victim QP expects PSN 0 first and names QP 0x1000 as its peer.  Each
step sends one request and collects the answers for a moment; the last line
is a JSON list of [step, answers], an answer being "OPCODE psn=P" with the
AETH's kind and code for acknowledgements and the payload for READ
responses.  Steps:

    read       READ of 8 bytes at va, PSN 0 (executed)
    send       SEND ONLY of 8 bytes, PSN 1, ACK requested
    dup_read   READ at PSN 0 again, the same key and range
    dup_badkey READ at PSN 0 with another R_Key
    dup_send   READ at PSN 1 (the SEND's PSN), a good key
    dup_subset READ at PSN 0 of bytes 4..7 only
    dup_beyond READ at PSN 0 of 16 bytes (more than was read)
    dup_atomic FETCH_ADD at PSN 1 (no atomic ran there)
    send2      SEND ONLY, PSN 2, ACK requested: the QP must still answer

With --ud, QP N is a UD QP (Q_Key 0x11111111) and the steps are datagrams,
no answer expected: 1400 bytes (more than the port's MTU of 1024), then 16.
"""
import argparse
import json
import os
import pathlib
import socket
import struct
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from fuzz_wire import ip_udp, icrc_of  # noqa: E402

NAMES = {0x04: "SEND_ONLY", 0x0c: "READ_REQ", 0x10: "READ_RESP_ONLY", 0x11: "ACK",
         0x12: "ATOMIC_ACK"}


def bth(op, qpn, psn, ackreq=False, pad=0):
    return struct.pack("!BBHII", op, pad << 4, 0xffff, qpn & 0xffffff,
                       (int(ackreq) << 31) | (psn & 0xffffff))


def reth(va, rkey, length):
    return struct.pack("!QII", va, rkey, length)


def atomic_eth(va, rkey, add):
    return struct.pack("!QIQQ", va, rkey, add, 0)


def decode(d):
    op = d[0]
    psn = int.from_bytes(d[9:12], "big")
    s = f"{NAMES.get(op, hex(op))} psn={psn}"
    if op in (0x10, 0x11, 0x12):
        syn = d[12]
        s += " " + ["ACK", "RNR", "RSV", "NAK"][(syn >> 5) & 3] + f":{syn & 0x1f}"
    if op == 0x10:
        pad = (d[1] >> 4) & 3
        s += " data=" + d[16:len(d) - 4 - pad].hex()
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dst")
    ap.add_argument("src")
    ap.add_argument("--qpn", type=lambda s: int(s, 0), required=True)
    ap.add_argument("--va", type=lambda s: int(s, 0), default=0)
    ap.add_argument("--rkey", type=lambda s: int(s, 0), default=0)
    ap.add_argument("--ud", action="store_true")
    ap.add_argument("--port", type=int, default=4791)
    a = ap.parse_args()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((a.src, a.port))  # Where the victim's answers go
    s.settimeout(0.05)

    def send(body):
        pad = (4 - len(body) % 4) % 4
        body = body[:1] + bytes([body[1] | pad << 4]) + body[2:] + b"\0" * pad
        iph, udp = ip_udp(a.src, a.dst, a.port, a.port, body + b"\0" * 4)
        s.sendto(body + struct.pack("<I", icrc_of(iph, udp, body + b"\0" * 4)),
                 (a.dst, a.port))

    def answers(wait):
        out, end = [], time.monotonic() + wait
        while time.monotonic() < end:
            try:
                d = s.recv(70000)
            except socket.timeout:
                continue
            out.append(decode(d))
        return out

    q, va, rk = a.qpn, a.va, a.rkey
    if a.ud:
        deth = struct.pack("!II", 0x11111111, 0x123)
        for n, fill in ((1400, b"L"), (16, b"S")):
            send(bth(0x64, q, 7) + deth + fill * n)
            time.sleep(0.2)
        print(json.dumps(["sent"]), flush=True)
        os._exit(0)
    steps = [
        ("read", bth(0x0c, q, 0) + reth(va, rk, 8)),
        ("send", bth(0x04, q, 1, ackreq=True) + b"12345678"),
        ("dup_read", bth(0x0c, q, 0) + reth(va, rk, 8)),
        ("dup_badkey", bth(0x0c, q, 0) + reth(va, rk ^ 0x5a5a00, 8)),
        ("dup_send", bth(0x0c, q, 1) + reth(va, rk, 8)),
        ("dup_subset", bth(0x0c, q, 0) + reth(va + 4, rk, 4)),
        ("dup_beyond", bth(0x0c, q, 0) + reth(va, rk, 16)),
        ("dup_atomic", bth(0x14, q, 1) + atomic_eth(va, rk, 1)),
        ("send2", bth(0x04, q, 2, ackreq=True) + b"abcdefgh"),
    ]
    got = []
    for name, body in steps:
        send(body)
        got.append([name, answers(1.0)])  # Generous: a loaded machine
    print(json.dumps(got), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
