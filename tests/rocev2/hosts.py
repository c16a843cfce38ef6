# SPDX-License-Identifier: MIT
"""Two hosts on one machine, for the RoCE v2 transport's tests.

Each host is a network namespace with one end of a veth pair (its own
IPv4 address and IPv6 link-local address) and a /dev/shm of its own,
shared by the processes run on it (a network namespace does not give one:
a tmpfs per host, bind-mounted over /dev/shm in a mount namespace of each
process's own, `unshare -m`, does), so the two hosts share no fabric
and every byte between them crosses the veth pair as RoCE v2 over UDP.
Programs run unmodified through softverbs-run, with a configuration that
gives loop0 an Ethernet port on the host's veth and turns RoCE v2 on.

Needs root (CI runs as root): creating namespaces and links does.
"""
import os
import pathlib
import signal
import subprocess
import time

# Run in the host's namespace with the host's /dev/shm ($0), then exec argv.
_SHELL = 'mount --bind "$0" /dev/shm && exec "$@"'


class Host:
    def __init__(self, pair, name, ns, dev, addr, conf, shm):
        self.shm = shm
        self.pair = pair
        self.name = name
        self.ns = ns
        self.dev = dev
        self.addr = addr
        self.conf = conf

    def argv(self, argv, env=None, view=True):
        """The command line that runs argv on this host through softverbs-run
        (on the fabric env's SOFTVERBS_FABRIC names, else the host's)."""
        env = dict(env or {})
        fabric = env.pop("SOFTVERBS_FABRIC", f"rocev2-{self.name}")
        run = [str(self.pair.build / "tools" / "softverbs-run"), "--config", str(self.conf),
               "--fabric", fabric]
        if not view:
            run.append("--no-view")
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        return (["ip", "netns", "exec", self.ns, "unshare", "-m", "sh", "-c", _SHELL,
                 str(self.shm), "env"] + extra + run + ["--"] + list(argv))

    def raw_argv(self, argv):
        """argv in this host's namespace, without softverbs."""
        return ["ip", "netns", "exec", self.ns] + list(argv)

    def popen(self, argv, env=None, **kw):
        return subprocess.Popen(self.argv(argv, env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env=self.pair.environ(), **kw)

    def ipv6_link_local(self):
        out = subprocess.run(self.raw_argv(["ip", "-6", "addr", "show", "dev", self.dev]),
                             capture_output=True, text=True).stdout
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("inet6 fe80:"):
                return line.split()[1].split("/")[0]
        return None


class HostPair:
    """Hosts a and b joined by a veth pair; removed by close()."""

    def __init__(self, build, tmp, mtu=1500):
        self.build = pathlib.Path(build)
        tag = f"{os.getpid() % 100000}"
        self.tag = tag
        octet = 20 + os.getpid() % 200
        self.procs = []
        self.hosts = []
        self._created = []
        self._mounts = []
        try:
            for name, host_octet in (("a", 1), ("b", 2)):
                ns = f"svr{tag}{name}"
                self._sh(["ip", "netns", "add", ns])
                self._created.append(ns)
            self._sh(["ip", "link", "add", f"svr{tag}a", "type", "veth", "peer", "name",
                      f"svr{tag}b"])
            for name, host_octet in (("a", 1), ("b", 2)):
                ns, dev = f"svr{tag}{name}", f"svr{tag}{name}"
                addr = f"10.{octet}.77.{host_octet}"
                self._sh(["ip", "link", "set", dev, "netns", ns])
                self._sh(["ip", "-n", ns, "link", "set", dev, "mtu", str(mtu)])
                self._sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
                self._sh(["ip", "-n", ns, "link", "set", dev, "up"])
                self._sh(["ip", "-n", ns, "link", "set", "lo", "up"])
                shm = pathlib.Path(tmp) / f"host-{name}-shm"
                shm.mkdir()
                self._sh(["mount", "-t", "tmpfs", "-o", "size=512m,mode=1777",
                          f"softverbs-host-{name}", str(shm)])
                self._mounts.append(shm)
                conf = pathlib.Path(tmp) / f"host-{name}.conf"
                conf.write_text("devices = loop0\n"
                                "loop0.link_layer = ethernet\n"
                                f"loop0.netdev = {dev}\n"
                                "loop0.rocev2 = on\n")
                self.hosts.append(Host(self, name, ns, dev, addr, conf, shm))
            self._wait_link_local()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _sh(argv):
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")

    def _wait_link_local(self):
        # IPv6 link-local addresses come up after duplicate address detection.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if all(h.ipv6_link_local() and self._dad_done(h) for h in self.hosts):
                return
            time.sleep(0.1)

    @staticmethod
    def _dad_done(h):
        out = subprocess.run(h.raw_argv(["ip", "-6", "addr", "show", "dev", h.dev]),
                             capture_output=True, text=True).stdout
        return "tentative" not in out

    @property
    def a(self):
        return self.hosts[0]

    @property
    def b(self):
        return self.hosts[1]

    def environ(self):
        return {k: v for k, v in os.environ.items()
                if not k.startswith("SOFTVERBS_") and k != "LD_LIBRARY_PATH"}

    def _pids(self):
        out = []
        for ns in self._created:
            out += subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
        return out

    @staticmethod
    def _is_keeper(pid):
        """softverbs-run's view keeper (its bash, or the cat it waits in):
        it removes the view's directory once its program is gone, and
        killed first it leaves the directory in /tmp for good."""
        try:
            cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"keeper" in cmd:
                return True
            ppid = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            return b"keeper" in pathlib.Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            return False

    def kill_all(self):
        """Every process left on the hosts: the programs first; the view
        keepers then end on their own (their programs gone), and are killed
        only if they have not within 5 s."""
        keepers = set()
        for pid in self._pids():
            if self._is_keeper(pid):
                keepers.add(pid)
                continue
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        end = time.monotonic() + 5
        while keepers and time.monotonic() < end:
            keepers &= set(self._pids())
            time.sleep(0.05)
        for pid in keepers:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass

    def close(self):
        self.kill_all()
        for ns in self._created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._created = []
        for m in self._mounts:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
        self._mounts = []


def pair_run(server_host, client_host, server_argv, client_argv, env=None, timeout=60,
             settle=0.5, server_env=None, client_env=None):
    """Runs a server on one host and then its client on the other, each
    with a timeout; returns (server returncode, server output, client
    returncode, client output).  A TCP exchange needs the server
    listening: the client is retried while it cannot connect."""
    senv = dict(env or {}, **(server_env or {}))
    cenv = dict(env or {}, **(client_env or {}))
    srv = server_host.popen(server_argv, senv)
    try:
        time.sleep(settle)
        deadline = time.monotonic() + timeout
        while True:
            left = max(1, deadline - time.monotonic())
            cli = subprocess.run(client_host.argv(client_argv, cenv), capture_output=True,
                                 text=True, timeout=left, env=server_host.pair.environ())
            cout = cli.stdout + cli.stderr
            refused = ("Connection refused" in cout or "Couldn't connect" in cout or
                       "Unable to Connect" in cout)
            if cli.returncode == 0 or not refused or time.monotonic() > deadline - 5:
                break
            time.sleep(0.3)
        try:
            sout, _ = srv.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)
            sout, _ = srv.communicate()
            return -9, sout, cli.returncode, cout
        return srv.returncode, sout, cli.returncode, cout
    finally:
        if srv.poll() is None:
            os.killpg(srv.pid, signal.SIGKILL)
            srv.wait()
