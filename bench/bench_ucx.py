#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""UCX over loop0 beside UCX over shared memory, in one run.

    /usr/bin/python3 bench/bench_ucx.py [--reps N] [--quick] [--build DIR] [--no-docs]

ucx_perftest (ucx-utils 1.13) between two processes, the same test, size
and iteration count three ways, interleaved (one run of each in turn, so
machine load hits them alike), each point the median of --reps runs:
  loop0      through softverbs-run, UCX_TLS=rc_verbs,ud_verbs,self and
             UCX_NET_DEVICES=loop0:1 (cross-memory attach, the default);
  loop0 svc  the same with SOFTVERBS_CMA=0 (the service copy path);
  UCX shm    UCX_TLS=sm,self: UCX's own shared-memory transports (posix,
             sysv, cma), no verbs.
UCP tag_lat, ucp_put_lat (median latency, half a round trip), tag_bw,
ucp_put_bw, ucp_get and ucp_am_bw (bandwidth) at 8 B, 64 KiB and 1 MiB, and
ucp_get at 8 B with ud_verbs alone.  Writes the table into
docs/PERFORMANCE.md between its bench_ucx markers.  Not a test.

UCX needs /dev/infiniband/uverbs0: softverbs-run's view presents it; where
it has none, SOFTVERBS_BENCH_WRAP names a command prefix that does (as
SOFTVERBS_TEST_UCX_WRAP does for the tests).
"""
import argparse
import datetime
import os
import pathlib
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "PERFORMANCE.md"
BEGIN, END = "<!-- bench_ucx.py: begin -->", "<!-- bench_ucx.py: end -->"
WRAP = shlex.split(os.environ.get("SOFTVERBS_BENCH_WRAP", ""))
TIMEOUT = 120
_fabric = iter(range(1000000))

LAT = ["tag_lat", "ucp_put_lat"]
BW = ["tag_bw", "ucp_put_bw", "ucp_get", "ucp_am_bw"]
SIZES = [8, 65536, 1048576]
CONFIGS = ["loop0", "loop0 svc", "UCX shm"]


def iters(test, size, scale):
    n = 20000 if size <= 8 else (5000 if size <= 65536 else 500)
    return max(100, int(n * scale))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    x = line.split()
                    if x[3] == "0A" and int(x[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except FileNotFoundError:
            pass
    return False


def kill(p):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


def run(build, config, test, size, n, tls=None):
    """One ucx_perftest pair; the client's Final row as a dict."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SOFTVERBS_", "UCX_")) and k != "LD_LIBRARY_PATH"}
    port = free_port()
    args = ["ucx_perftest", "-p", str(port), "-t", test, "-s", str(size), "-n", str(n),
            "-w", str(min(1000, n // 10))]
    if config == "UCX shm":
        env["UCX_TLS"] = "sm,self"
        prefix = []
    else:
        env["UCX_TLS"] = tls or "rc_verbs,ud_verbs,self"
        env["UCX_NET_DEVICES"] = "loop0:1"
        env["SOFTVERBS_FABRIC"] = f"bu{os.getpid()}-{next(_fabric)}"
        if config == "loop0 svc":
            env["SOFTVERBS_CMA"] = "0"
        prefix = WRAP + [str(build / "tools" / "softverbs-run")]
    procs = []
    try:
        s = subprocess.Popen(prefix + args, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        procs.append(s)
        end = time.monotonic() + 20
        while not listening(port):
            if s.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"server did not listen: {s.communicate()[0][-300:]}")
            time.sleep(0.02)
        c = subprocess.Popen(prefix + args + ["localhost"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        procs.append(c)
        out = c.communicate(timeout=TIMEOUT)[0]
        s.communicate(timeout=TIMEOUT)
        if c.returncode or s.returncode:
            raise RuntimeError(f"exit {c.returncode}/{s.returncode}: {out[-300:]}")
        for line in out.splitlines():
            if line.startswith("Final:"):
                f = [float(x) for x in line.split()[1:]]
                # iters, lat 50%ile, lat avg, lat overall, bw avg, bw overall, rate avg, overall
                return {"lat": f[1], "lat_avg": f[3], "bw": f[5], "mpps": f[7] / 1e6}
        raise RuntimeError(f"no Final row: {out[-300:]}")
    finally:
        for p in procs:
            kill(p)
        if "SOFTVERBS_FABRIC" in env:
            for p in pathlib.Path("/dev/shm").glob(
                    f"softverbs-{os.getuid()}-{env['SOFTVERBS_FABRIC']}*"):
                p.unlink(missing_ok=True)


def fmt_size(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else (f"{s >> 10} KiB" if s >= 1024 else f"{s} B")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one rep, fewer iterations")
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--no-docs", action="store_true", help="print only")
    a = ap.parse_args()
    build = pathlib.Path(a.build).resolve()
    reps = 1 if a.quick else a.reps
    scale = 0.2 if a.quick else 1.0
    points = [(t, s) for t in LAT + BW for s in SIZES]
    res, failures = {}, []
    for test, size in points:
        n = iters(test, size, scale)
        runs = {c: [] for c in CONFIGS}
        for _ in range(reps):
            for c in CONFIGS:  # Interleaved: one of each in turn
                try:
                    runs[c].append(run(build, c, test, size, n))
                except (RuntimeError, subprocess.SubprocessError) as x:
                    failures.append(f"{c} {test} {fmt_size(size)}: {str(x).splitlines()[0][:160]}")
        for c in CONFIGS:
            if runs[c]:
                res[(c, test, size)] = {k: statistics.median(r[k] for r in runs[c])
                                        for k in runs[c][0]}
        print(f"{test:>12} {fmt_size(size):>7}: " + "  ".join(
            f"{c} {res[(c, test, size)]['lat' if test in LAT else 'bw']:.2f}"
            for c in CONFIGS if (c, test, size) in res), flush=True)
    # ud_verbs alone: get is emulated with active messages (see the text).
    ud = []
    for _ in range(reps):
        try:
            ud.append(run(build, "loop0", "ucp_get", 8, iters("ucp_get", 8, scale) // 10,
                          tls="ud_verbs,self"))
        except (RuntimeError, subprocess.SubprocessError) as x:
            failures.append(f"ud_verbs ucp_get 8 B: {str(x).splitlines()[0][:160]}")

    nan = {"lat": float("nan"), "lat_avg": float("nan"), "bw": float("nan"),
           "mpps": float("nan")}
    get = lambda *k: res.get(k, nan)
    ratio = lambda x, y: f"{x / y:.2f}" if x == x and y == y and x and y else "-"
    lines = ["| test | size | loop0 | loop0, SOFTVERBS_CMA=0 | UCX shm (sm) | loop0/shm | "
             "svc/shm |", "|---|---|---|---|---|---|---|"]
    for test, size in points:
        k = "lat" if test in LAT else "bw"
        unit = "us (median)" if k == "lat" else "MB/s"
        v = [get(c, test, size)[k] for c in CONFIGS]
        fmt = (lambda x: f"{x:.2f}") if k == "lat" else (lambda x: f"{x:.0f}")
        lines.append(f"| {test}, {unit} | {fmt_size(size)} | {fmt(v[0])} | {fmt(v[1])} | "
                     f"{fmt(v[2])} | {ratio(v[0], v[2])} | {ratio(v[1], v[2])} |")
    if ud:
        lat = statistics.median(r["lat_avg"] for r in ud)
        lines.append("")
        lines.append(f"`ucp_get` at 8 B over `ud_verbs` alone: {lat:.0f} us per get (average; "
                     "see \"UCX ud_verbs get\" below).")
    if failures:
        lines += ["", "Runs that failed (left out of the medians):", ""]
        lines += [f"- `{f}`" for f in failures]
    m = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
         "load": open("/proc/loadavg").read().split()[0], "kernel": platform.release(),
         "nproc": os.cpu_count(),
         "commit": subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                  capture_output=True, text=True).stdout.strip() or "?"}
    head = (f"Made by `/usr/bin/python3 bench/bench_ucx.py` on {m['date']}, {m['nproc']} CPUs, "
            f"kernel {m['kernel']}, tree {m['commit']}, load average {m['load']} at the end; "
            f"each figure the median of {reps} interleaved run(s)"
            f"{' (--quick)' if a.quick else ''}.  Ratios are loop0 / shm: for latency below 1 "
            "means loop0 is faster, for bandwidth above 1 does.")
    table = head + "\n\n" + "\n".join(lines)
    print()
    print(table)
    if a.no_docs:
        return 0
    text = DOC.read_text()
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN) + len(BEGIN)] + "\n" + table + "\n" + text[text.index(END):]
    else:
        text += f"\n## UCX over loop0 beside UCX shared memory\n\n{BEGIN}\n{table}\n{END}\n"
    DOC.write_text(text)
    print(f"\nwrote the table into {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
