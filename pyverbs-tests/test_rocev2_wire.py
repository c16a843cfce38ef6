# SPDX-License-Identifier: MIT
"""The RoCE v2 wire codec (providers/loop/transport/rocev2/) seen from
outside: tests/progs/rocev2_pcap_sample writes one packet of every opcode it
knows, over IPv4 and IPv6, to UDP port 4791 and to a test port, and this
test reads the pcap back with code of its own, sharing nothing with
wire.cpp: the IP and UDP headers against what Linux sends from an
unconnected UDP socket (identification 0, DF, TTL 64, checksums right), the
BTH and extension headers against the IBTA's layouts, and each ICRC
recomputed from IBTA Annex A17.3.3 with zlib.crc32.  Then tshark, Wireshark's
own InfiniBand dissector, must decode every packet with the right opcode,
QP, PSN and extension header fields, and find nothing malformed."""
import shutil
import struct
import subprocess
import zlib

import pytest

import svtest

TEST_PORT = 18515  # A second port, decoded as RoCE v2 by tshark's -d

# The opcodes and their extension headers, from IBTA vol 1 table 38 and
# ch. 9 (RC/UC/UD), A14 (XRC: requests add the XRCETH), A17.9.2 (CNP) and
# the kernel's include/rdma/ib_pack.h (ATOMIC WRITE 0x1d).  RD is not
# supported.  Header names in wire order after the BTH.
ORDER = ["DETH", "XRCETH", "RETH", "AtomicETH", "AETH", "AtomicAckETH", "ImmDt", "IETH"]
SIZE = {"DETH": 8, "XRCETH": 4, "RETH": 16, "AtomicETH": 28, "AETH": 4,
        "AtomicAckETH": 8, "ImmDt": 4, "IETH": 4}
_RC = {
    0x00: [], 0x01: [], 0x02: [], 0x03: ["ImmDt"], 0x04: [], 0x05: ["ImmDt"],
    0x06: ["RETH"], 0x07: [], 0x08: [], 0x09: ["ImmDt"], 0x0a: ["RETH"],
    0x0b: ["RETH", "ImmDt"], 0x0c: ["RETH"], 0x0d: ["AETH"], 0x0e: [],
    0x0f: ["AETH"], 0x10: ["AETH"], 0x11: ["AETH"], 0x12: ["AETH", "AtomicAckETH"],
    0x13: ["AtomicETH"], 0x14: ["AtomicETH"], 0x16: ["IETH"], 0x17: ["IETH"],
}
OPCODES = {}
for _op, _h in _RC.items():
    OPCODES[_op] = _h
    if _op <= 0x0b:
        OPCODES[0x20 | _op] = _h
    OPCODES[0xa0 | _op] = _h if 0x0d <= _op <= 0x12 else ["XRCETH"] + _h
OPCODES[0x1d] = ["RETH"]
OPCODES[0x64] = ["DETH"]
OPCODES[0x65] = ["DETH", "ImmDt"]
OPCODES[0x81] = []
# Opcodes Wireshark 4.0 does not name (it shows "Unknown OpCode" and no
# extension headers for them); a later Wireshark may.
WIRESHARK_UNNAMED = {0x1d, 0x81} | {op for op in OPCODES if op >= 0xa0}


def hdr_len(op):
    return 12 + sum(SIZE[h] for h in OPCODES[op])


def ones_sum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return s


def read_pcap(path):
    """[(ts_sec, ts_usec, bytes)]; the file's linktype checked to be RAW."""
    data = open(path, "rb").read()
    magic = data[:4]
    if magic == b"\xd4\xc3\xb2\xa1":
        e = "<"
    elif magic == b"\xa1\xb2\xc3\xd4":
        e = ">"
    else:
        raise AssertionError(f"not a classic microsecond pcap: magic {magic.hex()}")
    vmaj, vmin, zone, sigfigs, snaplen, linktype = struct.unpack(e + "HHiIII", data[4:24])
    assert (vmaj, vmin) == (2, 4)
    assert linktype == 101, "LINKTYPE_RAW"
    out = []
    off = 24
    while off < len(data):
        sec, usec, incl, orig = struct.unpack(e + "IIII", data[off:off + 16])
        assert incl == orig and incl <= snaplen
        out.append((sec, usec, data[off + 16:off + 16 + incl]))
        off += 16 + incl
    assert off == len(data), "a record runs past the end of the file"
    return out


def split_ip(pkt):
    """(ip_header, udp_header, udp_payload) after checking the IP and UDP
    headers against what Linux sends from an unconnected UDP socket with
    IP_PMTUDISC_DO, and their checksums."""
    ver = pkt[0] >> 4
    if ver == 4:
        iph = pkt[:20]
        assert iph[0] == 0x45, "version 4, IHL 5"
        assert iph[1] == 0, "TOS 0"
        assert struct.unpack("!H", iph[2:4])[0] == len(pkt), "total length"
        assert struct.unpack("!H", iph[4:6])[0] == 0, "identification 0"
        assert struct.unpack("!H", iph[6:8])[0] == 0x4000, "DF, offset 0"
        assert iph[8] == 64, "TTL 64"
        assert iph[9] == 17, "protocol UDP"
        assert ones_sum(iph) == 0xffff, "IPv4 header checksum"
        pseudo = iph[12:20] + struct.pack("!BBH", 0, 17, len(pkt) - 20)
    else:
        assert ver == 6
        iph = pkt[:40]
        first, plen, nxt, hop = struct.unpack("!IHBB", iph[:8])
        assert first == 6 << 28, "traffic class 0, flow label 0"
        assert plen == len(pkt) - 40
        assert nxt == 17 and hop == 64
        pseudo = iph[8:40] + struct.pack("!IxxxB", len(pkt) - 40, 17)
    rest = pkt[len(iph):]
    udp, payload = rest[:8], rest[8:]
    assert struct.unpack("!H", udp[4:6])[0] == len(rest), "UDP length"
    assert udp[6:8] != b"\0\0", "UDP checksum present"
    assert ones_sum(pseudo + rest) == 0xffff, "UDP checksum"
    return iph, udp, payload


def icrc_of(iph, udp, payload):
    """IBTA A17.3.3: CRC-32 over 8 bytes of ones (the masked LRH), the IP
    header with its variant fields as ones, the UDP header with its
    checksum as ones, the BTH with its byte 4 as ones, the rest up to the
    ICRC; least significant byte first on the wire."""
    ip = bytearray(iph)
    if ip[0] >> 4 == 4:
        ip[1] = 0xff          # TOS
        ip[8] = 0xff          # TTL
        ip[10:12] = b"\xff\xff"  # header checksum
    else:
        ip[0] |= 0x0f         # traffic class (high nibble)
        ip[1:4] = b"\xff\xff\xff"  # traffic class (low nibble), flow label
        ip[7] = 0xff          # hop limit
    u = bytearray(udp)
    u[6:8] = b"\xff\xff"
    body = bytearray(payload[:-4])
    body[4] = 0xff
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(u) + bytes(body))


@pytest.fixture(scope="module")
def sample(build_dir, tmp_path_factory):
    """(pcap path, manifest rows, packets)."""
    prog = svtest.built_prog(build_dir, "rocev2_pcap_sample")
    path = tmp_path_factory.mktemp("rocev2") / "sample.pcap"
    p = subprocess.run([prog, str(path), str(TEST_PORT)], capture_output=True, text=True,
                       timeout=svtest.TIMEOUT)
    assert p.returncode == 0, p.stderr
    rows = []
    for line in p.stdout.splitlines():
        idx, op, v6, sport, dport, dqpn, psn, plen, pad = line.split()
        rows.append({"index": int(idx), "op": int(op, 16), "v6": v6 == "1",
                     "sport": int(sport), "dport": int(dport), "dqpn": int(dqpn, 16),
                     "psn": int(psn, 16), "plen": int(plen), "pad": int(pad)})
    return path, rows, read_pcap(path)


def test_every_opcode_both_families_both_ports(sample):
    _, rows, pkts = sample
    assert len(pkts) == len(rows) == 4 * len(OPCODES)
    seen = {(r["op"], r["v6"], r["dport"]) for r in rows}
    assert seen == {(op, v6, port) for op in OPCODES for v6 in (False, True)
                    for port in (4791, TEST_PORT)}


def test_headers_and_icrc_recomputed_apart(sample):
    _, rows, pkts = sample
    for row, (_, _, pkt) in zip(rows, pkts):
        what = f"packet {row['index']} opcode {row['op']:#04x}"
        iph, udp, payload = split_ip(pkt)
        assert (iph[0] >> 4 == 6) == row["v6"], what
        sport, dport = struct.unpack("!HH", udp[:4])
        assert (sport, dport) == (row["sport"], row["dport"]), what
        op = payload[0]
        assert op == row["op"], what
        assert payload[1] & 0x0f == 0, "tver 0"
        assert (payload[1] >> 4) & 3 == row["pad"], what
        assert (row["plen"] + row["pad"]) % 4 == 0, what
        assert struct.unpack("!H", payload[2:4])[0] == 0xffff, "default P_Key"
        assert int.from_bytes(payload[5:8], "big") == row["dqpn"], what
        assert int.from_bytes(payload[9:12], "big") == row["psn"], what
        assert len(payload) == hdr_len(op) + row["plen"] + row["pad"] + 4, what
        pad = payload[hdr_len(op) + row["plen"]:len(payload) - 4]
        assert pad == bytes(row["pad"]), what
        want = icrc_of(iph, udp, payload)
        got = int.from_bytes(payload[-4:], "little")
        assert got == want, f"{what}: ICRC {got:#010x}, recomputed {want:#010x}"


def test_icrc_check_can_fail(sample):
    """The comparison above is not vacuous: a flipped covered byte changes
    the recomputed ICRC, a flipped variant field (TTL, FECN) does not."""
    _, _, pkts = sample
    for _, _, pkt in (pkts[0], pkts[-1]):
        iph, udp, payload = split_ip(pkt)
        good = int.from_bytes(payload[-4:], "little")
        for i in (0, 2, 5, 11, len(payload) - 5):
            bad = bytearray(payload)
            bad[i] ^= 1
            assert icrc_of(iph, udp, bytes(bad)) != good
        ip = bytearray(iph)
        ip[8 if len(iph) == 20 else 7] = 1  # TTL / hop limit
        masked = bytearray(payload)
        masked[4] ^= 0xc0  # FECN, BECN
        assert icrc_of(bytes(ip), udp, bytes(masked)) == good


def _tshark_fields(path, fields):
    """One dict per packet.  The heuristic dissectors that Wireshark tries on
    InfiniBand payloads (RPC-over-RDMA, SMB Direct, iSER...) are turned off:
    they would read our test payload bytes as their protocols and call the
    packet malformed."""
    heur = subprocess.run(["tshark", "-G", "heuristic-decodes"], capture_output=True,
                          text=True, timeout=60).stdout
    off = []
    for line in heur.splitlines():
        cols = line.split("\t")
        if len(cols) >= 2 and cols[0] == "infiniband.payload" and cols[1] != "ethertype":
            off += ["--disable-protocol", cols[1]]
    argv = ["tshark", "-r", str(path), "-n", *off,
            "-d", f"udp.port=={TEST_PORT},infiniband",
            "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
            "-T", "fields", "-E", "separator=\t", "-E", "occurrence=f"]
    for f in fields:
        argv += ["-e", f]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [dict(zip(fields, line.split("\t"))) for line in p.stdout.splitlines()]


def _int(s):
    return int(s, 0) if s.startswith("0x") else int(s)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_tshark_decodes_every_packet(sample):
    path, rows, pkts = sample
    fields = ["frame.number", "_ws.col.Protocol", "_ws.col.Info", "_ws.malformed",
              "_ws.expert.severity", "ip.checksum.status", "udp.checksum.status",
              "udp.dstport", "infiniband.bth.opcode", "infiniband.bth.destqp",
              "infiniband.bth.psn", "infiniband.bth.padcnt", "infiniband.bth.tver",
              "infiniband.bth.p_key", "infiniband.reth.r_key", "infiniband.reth.va",
              "infiniband.aeth.msn", "infiniband.deth.srcqp", "infiniband.deth.q_key",
              "infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt",
              "infiniband.atomicacketh.origremdt",
              "infiniband.immdt", "infiniband.ieth", "infiniband.invariant.crc"]
    out = _tshark_fields(path, fields)
    assert len(out) == len(rows)
    for row, d, (_, _, pkt) in zip(rows, out, pkts):
        op = row["op"]
        what = f"frame {d['frame.number']} opcode {op:#04x}: {d}"
        assert d["_ws.col.Protocol"] == "RRoCE", what
        assert d["_ws.malformed"] == "", what
        # Expert items of warning (0x600000) or error (0x800000) severity.
        assert not d["_ws.expert.severity"] or _int(d["_ws.expert.severity"]) < 0x600000, what
        # Checked (-o ...check_checksum:TRUE) and good: status 1
        # (PROTO_CHECKSUM_E_GOOD; 0 is bad, 2 unverified).
        if not row["v6"]:
            assert d["ip.checksum.status"] == "1", what
        assert d["udp.checksum.status"] == "1", what
        assert _int(d["udp.dstport"]) == row["dport"], what
        assert _int(d["infiniband.bth.opcode"]) == op, what
        assert _int(d["infiniband.bth.destqp"]) == row["dqpn"], what
        assert _int(d["infiniband.bth.psn"]) == row["psn"], what
        assert _int(d["infiniband.bth.padcnt"]) == row["pad"], what
        assert _int(d["infiniband.bth.tver"]) == 0, what
        assert _int(d["infiniband.bth.p_key"]) == 0xffff, what
        if op in WIRESHARK_UNNAMED:
            # The rest is "vendor specific" data to Wireshark 4.0.
            continue
        assert "Unknown" not in d["_ws.col.Info"], what
        # Wireshark found the ICRC where the packet ends: it framed the
        # headers as we did (it shows the 4 bytes as a big-endian number,
        # and does not check them).
        assert _int(d["infiniband.invariant.crc"]) == int.from_bytes(pkt[-4:], "big"), what
        # The extension headers' fields, as rocev2_pcap_sample sets them
        # from the opcode.
        hs = OPCODES[op]
        if "RETH" in hs:
            assert _int(d["infiniband.reth.r_key"]) == 0x1000 + op, what
            assert _int(d["infiniband.reth.va"]) == 0x00007f0012345000 + op, what
        if "AETH" in hs:
            assert _int(d["infiniband.aeth.msn"]) == 0x100 + op, what
        if "DETH" in hs:
            assert _int(d["infiniband.deth.srcqp"]) == 0x200 + op, what
            assert _int(d["infiniband.deth.q_key"]) == 0x11111111, what
        if "AtomicETH" in hs:
            # Wireshark shows the AtomicETH's VA and R_Key as RETH fields.
            assert _int(d["infiniband.reth.r_key"]) == 0x2000 + op, what
            assert _int(d["infiniband.reth.va"]) == 0x00007f0012346000, what
            assert _int(d["infiniband.atomiceth.swapdt"]) == 0x1111111122222222, what
            assert _int(d["infiniband.atomiceth.cmpdt"]) == 0x3333333344444444, what
        if "AtomicAckETH" in hs:
            assert _int(d["infiniband.atomicacketh.origremdt"]) == 0x5555555566666666, what
        if "ImmDt" in hs:
            assert d["infiniband.immdt"].replace(":", "") == f"deadbe{op:02x}", what
        if "IETH" in hs:
            assert _int("0x" + d["infiniband.ieth"].replace(":", "")) == 0x3000 + op, what
        for name, field in (("RETH", "infiniband.reth.r_key"), ("AETH", "infiniband.aeth.msn"),
                            ("DETH", "infiniband.deth.srcqp"), ("IETH", "infiniband.ieth")):
            if name not in hs and not (name == "RETH" and "AtomicETH" in hs):
                assert d[field] == "", f"{what}: {field} where the opcode has no {name}"
