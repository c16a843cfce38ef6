#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""RoCE v2 between two hosts beside TCP on the same wire, in one run.

    /usr/bin/python3 bench/bench_rocev2.py [--reps N] [--mtu M] [--build DIR] [--no-docs]

Two hosts as the rocev2 tests make them (tests/rocev2/hosts.py: network
namespaces joined by a veth pair with the given MTU, each process with its
own /dev/shm).  Interleaved, --reps times each, over IPv6 (link-local
addresses, GID index 1: RoCE v2 packets go out with UDP GSO and come in
with UDP GRO) and over IPv4 (GID index 0: one datagram per packet, see
docs/rocev2.md): iperf3's TCP throughput from b to a (3 s) on that
address family, and Debian's ib_write_bw at 64 KiB through softverbs-run
(client on b, server on a) for as long (-D 3), whose BW average is
the figure.  Writes the
medians and their ratios into docs/PERFORMANCE.md between its markers.
Needs root (namespaces).  Not a test.
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "rocev2"))
import hosts  # noqa: E402

DOC = ROOT / "docs" / "PERFORMANCE.md"
BEGIN, END = "<!-- bench_rocev2.py: begin -->", "<!-- bench_rocev2.py: end -->"


def iperf3(pair, v6, seconds):
    srv = subprocess.Popen(pair.a.raw_argv(["iperf3", "-s", "-1", "-J"]),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dst = f"{pair.a.ipv6_link_local()}%{pair.b.dev}" if v6 else pair.a.addr
    try:
        time.sleep(0.5)
        cli = subprocess.run(pair.b.raw_argv(["iperf3", "-c", dst, "-t", str(seconds), "-J"]),
                             capture_output=True, text=True, timeout=60)
        d = json.loads(cli.stdout)
        return d["end"]["sum_received"]["bits_per_second"] / 8 / 1e6  # MB/s
    finally:
        srv.wait(timeout=30)


def write_bw(pair, seconds, v6):
    port = str(23000 + os.getpid() % 1000)
    # -D: a run of that many seconds, as iperf3's -t (perftest's default of
    # 5000 iterations is over in a fraction of a second here, ramp-up included).
    argv = ["ib_write_bw", "-d", "loop0", "-x", "1" if v6 else "0", "-s", "65536", "-D",
            str(seconds), "-p", port]
    rs, so, rc, co = hosts.pair_run(pair.a, pair.b, argv, argv + [pair.a.addr], timeout=300)
    if rs or rc:
        raise RuntimeError(f"ib_write_bw failed:\n{so}\n{co}")
    m = re.search(r"^\s*65536\s+\d+\s+([\d.]+)\s+([\d.]+)", co, re.M)
    return float(m.group(2))  # BW average, MB/s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--seconds", type=int, default=3, help="of each run, TCP and RDMA")
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args()
    fams = (("IPv6", True), ("IPv4", False))
    tcp = {f: [] for f, _ in fams}
    rdma = {f: [] for f, _ in fams}
    with tempfile.TemporaryDirectory() as tmp:
        pair = hosts.HostPair(a.build, tmp, mtu=a.mtu)
        try:
            for _ in range(a.reps):
                for fam, v6 in fams:
                    tcp[fam].append(iperf3(pair, v6, a.seconds))
                    rdma[fam].append(write_bw(pair, a.seconds, v6))
                    print(f"{fam}: iperf3 TCP {tcp[fam][-1]:.0f} MB/s, "
                          f"ib_write_bw 64 KiB {rdma[fam][-1]:.0f} MB/s", flush=True)
        finally:
            pair.close()

    def runs(xs):
        return ", ".join(f"{x:.0f}" for x in xs)

    table = (f"\nRun {datetime.date.today()} on {platform.node()} ({os.cpu_count()} CPUs), "
             f"veth MTU {a.mtu}, median of {a.reps} interleaved runs:\n\n"
             "| figure | MB/s | runs |\n|---|---|---|\n")
    for fam, v6 in fams:
        t, r = statistics.median(tcp[fam]), statistics.median(rdma[fam])
        how = "UDP GSO and GRO" if v6 else "one datagram per packet"
        table += (f"| `ib_write_bw -s 65536 -x {1 if v6 else 0}` over RoCE v2, {fam} ({how}) | "
                  f"{r:.0f} | {runs(rdma[fam])} |\n"
                  f"| iperf3 TCP over {fam}, one stream | {t:.0f} | {runs(tcp[fam])} |\n"
                  f"| ratio over {fam}{' (target: at least 0.5)' if v6 else ''} | "
                  f"{r / t:.2f} | |\n")
    print(table)
    if a.no_docs:
        return
    text = DOC.read_text()
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN) + len(BEGIN)] + "\n" + table + "\n" + text[text.index(END):]
    else:
        text += f"\n## RoCE v2 between two hosts beside TCP\n\n{BEGIN}\n{table}\n{END}\n"
    DOC.write_text(text)


if __name__ == "__main__":
    main()
