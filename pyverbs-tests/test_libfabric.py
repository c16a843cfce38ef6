# SPDX-License-Identifier: MIT
"""libfabric (Debian's libfabric-bin 1.17) over loop0: fi_pingpong with
its data integrity checks (-c), on an InfiniBand and on a RoCE port, with
both RDM provider stacks libfabric offers on a verbs device:

- `verbs;ofi_rxm`: RDM over RC MSG endpoints, which connect through
  rdma_cm (our librdmacm).  rxm sizes its MSG CQ as (rx + tx) x universe
  size, 262144 entries by default, so it needs max_cqe at least that
  (loop0 advertises 4194304, about mlx5's 4194303; it once had 65535 and rxm's CQ failed
  with EINVAL).  libfabric's verbs provider takes MSG endpoints only on a
  non-loopback interface (vrb_getifaddrs skips IFF_LOOPBACK), so the RoCE
  case puts loop0 on the host's first such interface, as a RoCE user
  would, and is skipped on a host that has none.
- `verbs;ofi_rxd`: libfabric's reliable-datagram layer (acks and
  retransmission in software) over verbs UD QPs on domain loop0-dgram.

The test asserts the stack that ran from libfabric's own log.  It needs no
/dev/infiniband node: libfabric's verbs provider opens none.
"""
import re
import shutil
import subprocess
import time

import pytest

import ucxtest

pytestmark = pytest.mark.skipif(not shutil.which("fi_pingpong"),
                                reason="libfabric-bin not installed")


def pingpong(softverbs_run, env, stack, timeout=120):
    port = ucxtest.free_port()
    base = [softverbs_run, "fi_pingpong", "-p", stack, "-e", "rdm", "-S", "64", "-I", "500",
            "-c"]
    procs = []
    try:
        srv = ucxtest.popen(base + ["-B", str(port)], env)
        procs.append(srv)
        deadline = time.monotonic() + 20
        while not ucxtest.listening(port):
            assert srv.poll() is None and time.monotonic() < deadline, \
                f"fi_pingpong server did not listen:\n{srv.communicate()[0] if srv.poll() is not None else ''}"
            time.sleep(0.02)
        cli = ucxtest.popen(base + ["-P", str(port), "localhost"], env)
        procs.append(cli)
        try:
            cout = cli.communicate(timeout=timeout)[0]
            sout = srv.communicate(timeout=30)[0]
        except Exception:
            for p in procs:
                ucxtest.kill_group(p)
            raise AssertionError("fi_pingpong timed out (both killed)")
        return (srv.returncode, sout), (cli.returncode, cout)
    finally:
        for p in procs:
            ucxtest.kill_group(p)


def host_interface():
    """The first interface that is up, not loopback, with an IPv4 address."""
    out = subprocess.run(["ip", "-br", "-4", "addr"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0] != "lo" and f[1] in ("UP", "UNKNOWN"):
            return f[0].split("@")[0]
    return None


# The stack, and the line of libfabric's log that names the domain it ran on.
STACKS = {
    "verbs;ofi_rxd": r"ofi_rxd:verbs:.*adding fi_info for domain: loop0-dgram$",
    "verbs;ofi_rxm": r"ofi_rxm:verbs:.*adding fi_info for domain: loop0$",
}


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("link", ["infiniband", "ethernet"])
def test_fi_pingpong_rdm(link, stack, tool_env, softverbs_run, tmp_path):
    netdev = "lo"
    if stack == "verbs;ofi_rxm" and link == "ethernet":
        netdev = host_interface()
        if not netdev:
            pytest.skip("no non-loopback interface for libfabric's verbs MSG endpoints")
    conf = tmp_path / "softverbs.conf"
    conf.write_text(f"loop0.link_layer = {link}\nloop0.netdev = {netdev}\n")
    env = dict(tool_env, SOFTVERBS_CONFIG=str(conf), FI_LOG_LEVEL="info")
    (src, sout), (crc, cout) = pingpong(softverbs_run, env, stack)
    logs = f"server:\n{sout[-3000:]}\nclient:\n{cout[-3000:]}"
    assert src == 0 and crc == 0, f"exit server {src} client {crc}\n{logs}"
    # The results row: 64 bytes, 500 sent, 500 acknowledged.
    assert re.search(r"^64\s+500\s+=500\s", cout, re.M), logs
    assert re.search(STACKS[stack], cout, re.M), logs
