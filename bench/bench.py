#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""softverbs side by side with UCX shared memory and memcpy, in one run.

    /usr/bin/python3 bench/bench.py [--reps N] [--quick] [--pin] [--build DIR]

Measures, each point the median of --reps runs:
  softverbs  Debian's perftest through our library between two processes on
             loop0: ib_{send,write,read}_lat (t_typical) and
             ib_{send,write,read}_bw (BW average, MsgRate);
  UCX        ucx_perftest between two processes with UCX_TLS=posix,cma,self
             (shared memory): tag_lat, tag_bw, ucp_put_bw;
  memcpy     bench/memcpy_bw.c on one core, built here.
Prints a table with the ratios softverbs/UCX and softverbs/memcpy, writes
docs/PERFORMANCE.md and docs/perf.png.  Not a test: nothing here passes or
fails on a number.
"""
import argparse
import datetime
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
LAT_SIZES = [8, 64, 4096, 65536, 1048576]
BW_SIZES = [64, 4096, 65536, 1048576]
TIMEOUT = 30
_port = iter(range(21000 + (os.getpid() % 400) * 50, 65000))
_fabric = iter(range(1000000))


def iters_bw(size):
    return {64: 50000, 4096: 20000, 65536: 5000}.get(size, 1000)


def iters_lat(size):
    return 5000 if size <= 4096 else (2000 if size <= 65536 else 300)


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


# --pin: the server on CPU 0 and the client on CPU 1 (taskset), for both
# softverbs and UCX.  Unpinned, the scheduler sometimes puts both processes
# (and the provider's threads) on one core of a 2-core machine, and a point
# then lands in one of two modes up to 3x apart (a small SEND's latency
# seen at 0.5 us and at 1.6 us in alternate runs of one build): medians
# of 3 runs then compare modes, not builds.
PIN = []


def pinned(cmd, cpu):
    return ["taskset", "-c", str(cpu)] + cmd if PIN else cmd


def run_pair(server, client, env, port):
    """Starts server, waits for it to listen on port, runs client; returns
    the client's and the server's stdout.  Kills both on the way out."""
    procs = []
    server, client = pinned(server, 0), pinned(client, 1)
    try:
        s = subprocess.Popen(server, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        procs.append(s)
        end = time.monotonic() + 10
        while not listening(port):
            if s.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"{server[0]} did not listen: {s.communicate()[0]}")
            time.sleep(0.02)
        c = subprocess.Popen(client, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        procs.append(c)
        cout = c.communicate(timeout=TIMEOUT)[0]
        sout = s.communicate(timeout=TIMEOUT)[0]
        if c.returncode or s.returncode:
            raise RuntimeError(f"{' '.join(client)}: exit {c.returncode}/{s.returncode}\n"
                               f"{cout}\n{sout}")
        return cout, sout
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def sv_env(build):
    e = dict(os.environ)
    e["LD_LIBRARY_PATH"] = str(build / "libibverbs-compat")
    e["SOFTVERBS_FABRIC"] = f"bench{os.getpid()}-{next(_fabric)}"
    return e


def cleanup_fabric(env):
    for p in pathlib.Path("/dev/shm").glob(f"softverbs-{os.getuid()}-{env['SOFTVERBS_FABRIC']}*"):
        p.unlink(missing_ok=True)


def perftest(build, tool, size, iters):
    env = sv_env(build)
    port = next(_port)
    args = [tool, "-d", "loop0", "-p", str(port), "-s", str(size), "-n", str(iters)]
    try:
        out, _ = run_pair(args, args + ["localhost"], env, port)
    finally:
        cleanup_fabric(env)
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0] == str(size) and f[1].isdigit():
            if tool.endswith("_lat"):
                return {"lat_us": float(f[4])}  # t_typical
            return {"bw": float(f[3]), "mpps": float(f[4])}
    raise RuntimeError(f"no result line in:\n{out}")


def ucx(test, size, iters):
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    env["UCX_TLS"] = "posix,cma,self"
    port = next(_port)
    srv = ["ucx_perftest", "-p", str(port)]
    cli = ["ucx_perftest", "localhost", "-p", str(port), "-t", test, "-s", str(size),
           "-n", str(iters)]
    out, _ = run_pair(srv, cli, env, port)
    for line in out.splitlines():
        if line.startswith("Final:"):
            f = line.split()
            # iterations, lat 50%ile, lat avg, lat overall, bw avg, bw overall, rate avg, overall
            return {"lat_us": float(f[3]), "bw": float(f[6]), "mpps": float(f[8]) / 1e6}
    raise RuntimeError(f"no Final line in:\n{out}")


def memcpy(binary, size):
    out = subprocess.run([str(binary), str(size), "0.2"], capture_output=True, text=True,
                         check=True).stdout.split()
    return {"bw": float(out[1]), "lat_us": float(out[2]) / 1000, "mpps": float(out[1]) *
            (1 << 20) / size / 1e6}


FAILURES = []


def median_of(reps, fn, *args):
    """Median of reps runs; a run that fails or hangs is retried once and
    then left out (and listed in the report)."""
    runs = []
    for _ in range(reps):
        for attempt in range(2):
            try:
                runs.append(fn(*args))
                break
            except (RuntimeError, subprocess.SubprocessError) as x:
                FAILURES.append(f"{fn.__name__}{args[1:]}: {str(x).splitlines()[0][:160]}")
    if not runs:
        return None
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "load": open("/proc/loadavg").read().split()[0],
            "commit": subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                     capture_output=True, text=True).stdout.strip() or "?"}


def fmt_size(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else (f"{s >> 10} KiB" if s >= 1024 else f"{s} B")


def ratio(a, b):
    return f"{a / b:.2f}" if a == a and b == b and a and b else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one rep, fewer iterations")
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--no-docs", action="store_true", help="print only")
    ap.add_argument("--pin", action="store_true",
                    help="server on CPU 0, client on CPU 1 (steadier on a small machine)")
    a = ap.parse_args()
    if a.pin:
        PIN.append(True)
    build = pathlib.Path(a.build).resolve()
    reps = 1 if a.quick else a.reps
    scale = 0.2 if a.quick else 1.0
    OUT.mkdir(parents=True, exist_ok=True)
    mc = OUT / "memcpy_bw"
    subprocess.run(["cc", "-O2", "-o", str(mc), str(ROOT / "bench" / "memcpy_bw.c")], check=True)

    res = {}  # (system, metric, size) -> dict
    def note(key, val):
        if val is None:
            print(f"  {key}: no successful run", flush=True)
            return
        res[key] = val
        print(f"  {key[0]:>10} {key[1]:<10} {fmt_size(key[2]):>8}: " +
              ", ".join(f"{k} {v:.3f}" for k, v in val.items()), flush=True)

    print("latency", flush=True)
    for size in LAT_SIZES:
        n = max(100, int(iters_lat(size) * scale))
        for op in ("send", "write", "read"):
            note(("softverbs", op + "_lat", size),
                 median_of(reps, perftest, build, f"ib_{op}_lat", size, n))
        note(("ucx", "tag_lat", size), median_of(reps, ucx, "tag_lat", size, n))
        note(("memcpy", "copy", size), median_of(reps, memcpy, mc, size))
    print("bandwidth", flush=True)
    for size in BW_SIZES:
        n = max(100, int(iters_bw(size) * scale))
        for op in ("send", "write", "read"):
            note(("softverbs", op + "_bw", size),
                 median_of(reps, perftest, build, f"ib_{op}_bw", size, n))
        for t in ("tag_bw", "ucp_put_bw"):
            note(("ucx", t, size), median_of(reps, ucx, t, size, n))

    m = machine()
    lines = []
    lines.append("| size | op | softverbs | UCX (shm) | memcpy | sv/UCX | sv/memcpy |")
    lines.append("|---|---|---|---|---|---|---|")
    nan = {"lat_us": float("nan"), "bw": float("nan"), "mpps": float("nan")}
    get = lambda *k: res.get(k, nan)
    for size in LAT_SIZES:
        u = get("ucx", "tag_lat", size)["lat_us"]
        c = get("memcpy", "copy", size)["lat_us"]
        for op in ("send", "write", "read"):
            v = get("softverbs", op + "_lat", size)["lat_us"]
            lines.append(f"| {fmt_size(size)} | {op} latency (us) | {v:.2f} | {u:.2f} (tag_lat) | "
                         f"{c:.3f} | {ratio(v, u)} | {ratio(v, c)} |")
    for size in BW_SIZES:
        c = get("memcpy", "copy", size)
        ut, up = get("ucx", "tag_bw", size), get("ucx", "ucp_put_bw", size)
        for op, u, uname in (("send", ut, "tag_bw"), ("write", up, "ucp_put_bw"),
                             ("read", up, "ucp_put_bw")):
            v = get("softverbs", op + "_bw", size)
            lines.append(f"| {fmt_size(size)} | {op} bandwidth (MB/s) | {v['bw']:.0f} | "
                         f"{u['bw']:.0f} ({uname}) | {c['bw']:.0f} | {ratio(v['bw'], u['bw'])} | "
                         f"{ratio(v['bw'], c['bw'])} |")
            lines.append(f"| {fmt_size(size)} | {op} msg rate (Mpps) | {v['mpps']:.3f} | "
                         f"{u['mpps']:.3f} ({uname}) | {c['mpps']:.3g} | "
                         f"{ratio(v['mpps'], u['mpps'])} | {ratio(v['mpps'], c['mpps'])} |")
    if FAILURES:
        lines.append("")
        lines.append("Runs that failed or hung (retried once, then left out of the medians):")
        lines.append("")
        lines += [f"- `{f}`" for f in FAILURES]
    table = "\n".join(lines)
    print()
    print(f"{m['date']}  nproc {m['nproc']}  {m['cpu']}  kernel {m['kernel']}  load {m['load']}")
    print(table)
    if a.no_docs:
        return 0
    plot(res, ROOT / "docs" / "perf.png")
    write_doc(ROOT / "docs" / "PERFORMANCE.md", m, table, reps, a.quick)
    print("\nwrote docs/PERFORMANCE.md and docs/perf.png")
    return 0


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (bw, lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = [("softverbs", "send_bw", "softverbs send"), ("softverbs", "write_bw", "softverbs write"),
              ("softverbs", "read_bw", "softverbs read"), ("ucx", "tag_bw", "UCX tag_bw"),
              ("ucx", "ucp_put_bw", "UCX put_bw"), ("memcpy", "copy", "memcpy (1 core)")]
    for sysname, metric, label in series:
        xs = [s for s in BW_SIZES if (sysname, metric, s) in res]
        bw.plot(xs, [res[(sysname, metric, s)]["bw"] for s in xs], marker="o", label=label)
    bw.set_xscale("log", base=2)
    bw.set_yscale("log")
    bw.set_xlabel("message size (bytes)")
    bw.set_ylabel("bandwidth (MB/s)")
    bw.set_title("Bandwidth")
    bw.legend(fontsize=8)
    bw.grid(True, which="both", alpha=0.3)
    series = [("softverbs", "send_lat", "softverbs send"), ("softverbs", "write_lat", "softverbs write"),
              ("softverbs", "read_lat", "softverbs read (round trip)"),
              ("ucx", "tag_lat", "UCX tag_lat"), ("memcpy", "copy", "memcpy (1 core)")]
    for sysname, metric, label in series:
        xs = [s for s in LAT_SIZES if (sysname, metric, s) in res]
        lat.plot(xs, [res[(sysname, metric, s)]["lat_us"] for s in xs], marker="o", label=label)
    lat.set_xscale("log", base=2)
    lat.set_yscale("log")
    lat.set_xlabel("message size (bytes)")
    lat.set_ylabel("latency (us)")
    lat.set_title("Latency")
    lat.legend(fontsize=8)
    lat.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# docs/PERFORMANCE.md from this line on is not bench.py's: the UCX table of
# bench/bench_ucx.py and the notes on slow paths.  write_doc keeps it.
KEEP = "<!-- bench.py rewrites what is above this line and keeps what follows -->"


def write_doc(path, m, table, reps, quick):
    old = path.read_text() if path.exists() else ""
    tail = old[old.index(KEEP):] if KEEP in old else KEEP + "\n"
    path.write_text(f"""# Performance

Measured by `/usr/bin/python3 bench/bench.py` (one command; see its docstring).
Each figure is the median of {reps} run(s){' (--quick: fewer iterations)' if quick else ''}.
These are measurements of one machine at one moment, not promises: on a
2-core machine both processes of a pair spin on their own core, and any other
load on the machine shows up directly.

- Date: {m['date']}
- Machine: {m['nproc']} CPUs, {m['cpu']}
- Kernel: {m['kernel']}
- Load average when the table was printed: {m['load']}
- Tree: {m['commit']} (build directory given with --build)

## What is compared

- **softverbs**: Debian's perftest (4.5-0.17) through our `libibverbs.so.1`,
  server and client as two processes on device `loop0` of a private fabric.
  Latency is perftest's `t_typical` (the median); send and write latency are
  half a round trip, read latency is a whole one (a read is a round trip).
  Bandwidth is `BW average`, message rate `MsgRate`.
- **UCX**: `ucx_perftest` (ucx-utils 1.13) between two processes with
  `UCX_TLS=posix,cma,self`, UCX's shared-memory transports: `tag_lat`
  (half round trip), `tag_bw`, `ucp_put_bw` (compared with write and read).
- **memcpy**: one core copying between two buffers (`bench/memcpy_bw.c`); its
  "latency" is the time of one copy.  Small copies stay in cache.

Ratios are softverbs / other: for bandwidth above 1 means softverbs is
faster, for latency below 1 does.  Both tools report MB/s as they define it
(perftest and ucx_perftest both count 2^20 bytes); memcpy is in MiB/s.

Reading the numbers: on this 2-core machine under other load, UCX's
shared-memory transports (which busy-poll) are noisy from run to run, and
`ucp_put_bw` reports the rate at which puts are issued into UCX's pipeline,
which for mid sizes exceeds a one-core memcpy; read its column as an upper
bound.  softverbs' small-message bandwidth is bound by one requester
call (checks, key lookups, a completion on each side) per message.

## Results

{table}

![bandwidth and latency vs size](perf.png)

""" + tail)


if __name__ == "__main__":
    sys.exit(main())
