# SPDX-License-Identifier: MIT
"""Helpers shared by the pyverbs-tests modules."""
import glob
import itertools
import json
import os
import pathlib
import re
import signal
import subprocess

PYTHON = "/usr/bin/python3"  # The interpreter that sees Debian's pyverbs
TIMEOUT = 30  # Seconds for any one child process

_counter = itertools.count()


def repo_root():
    return pathlib.Path(__file__).resolve().parent.parent


def build_dir():
    return pathlib.Path(os.environ.get("SOFTVERBS_BUILD_DIR", repo_root() / "build")).resolve()


def segment_prefix():
    return f"softverbs-{os.getuid()}-"


def new_fabric_name():
    # At most 32 characters, unique per test even across parallel runs.
    return f"pt{os.getpid()}-{next(_counter)}"


def remove_fabric(name):
    """Removes /dev/shm/softverbs-<uid>-<name> and -<name>-* segments."""
    base = f"/dev/shm/{segment_prefix()}{name}"
    for path in [base] + glob.glob(glob.escape(base) + "-*"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def clean_environ():
    """os.environ without our variables or a library path of the caller."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("SOFTVERBS_") and k != "LD_LIBRARY_PATH"}


# Sanitizer builds.  Our library built with ASan runs inside programs that
# are not (python3, Debian's tools): they need the ASan runtime preloaded.
# SOFTVERBS_SANITIZE_PRELOAD names it (tests/meson.build sets it for an ASan
# build); then each child logs its reports to files, and the `env` fixture
# fails the test on a memory error, or a leak allocated inside our library.
SANITIZE_PRELOAD = os.environ.get("SOFTVERBS_SANITIZE_PRELOAD", "")
_OURS = re.compile(r"(providers/loop/|libibverbs-compat/)")
# Programs that destroy everything they create: Debian's verbs tools, and
# those of tests/progs that end with every object destroyed and the device
# closed.  A direct leak of our library's in them is ours.
_TOOL = re.compile(r"\(/usr/bin/ibv?_\w+\+0x|"
                   r"tests/progs/sv_(?:lifetimes|cqrace)(?:\+0x|\.c:)")


def sanitize_environ(e, log_dir):
    """Adds the sanitizer settings of a child to environment e."""
    if not SANITIZE_PRELOAD:
        return e
    supp = repo_root() / "tests" / "sanitize" / "lsan.supp"
    e["LD_PRELOAD"] = " ".join(x for x in (SANITIZE_PRELOAD, e.get("LD_PRELOAD")) if x)
    # Python's own allocator hides pointers from LeakSanitizer (its arenas
    # are not scanned): with malloc, a live object's memory is found.
    e["PYTHONMALLOC"] = "malloc"
    e["ASAN_OPTIONS"] = f"detect_leaks=1:log_path={log_dir}/asan:detect_stack_use_after_return=0"
    # Leaks do not change a child's exit status; sanitizer_failures() judges them.
    e["LSAN_OPTIONS"] = f"exitcode=0:suppressions={supp}:print_suppressions=0"
    e["UBSAN_OPTIONS"] = f"print_stacktrace=1:halt_on_error=1:log_path={log_dir}/ubsan"
    return e


def sanitizer_failures(log_dir):
    """Reports in log_dir that fail a test: every memory error and undefined
    behaviour, and each direct leak with a frame of our library in its
    allocation stack in one of Debian's verbs tools (ibv_*, ib_*: they
    destroy what they create; perftest's own leaks are suppressed in
    tests/sanitize/lsan.supp) or in sv_lifetimes and sv_cqrace (which do
    too).  The python snippets and the other tests/progs of this suite leave
    objects they created for the exit to clean, as short programs do: those
    are their leaks, not the library's; an indirect leak is held by some
    direct one.  A list of strings."""
    bad = []
    for path in sorted(glob.glob(f"{log_dir}/*san.*")):
        with open(path, errors="replace") as f:
            text = f.read()
        for block in re.split(r"\n(?=Direct leak|Indirect leak|SUMMARY)", text):
            if block.startswith("Direct leak"):
                if _OURS.search(block) and _TOOL.search(block):
                    bad.append(f"{path}:\n{block.strip()}")
            elif block.startswith(("Indirect leak", "SUMMARY")):
                continue
            elif re.search(r"ERROR: AddressSanitizer|runtime error:", block):
                bad.append(f"{path}:\n{block.strip()}")
    return bad


def built_prog(build_dir, name):
    """The path of tests/progs/NAME in build_dir, as a string; the test
    fails (not skips) where it was not built."""
    import pytest
    p = pathlib.Path(build_dir) / "tests" / "progs" / name
    if not p.exists():
        pytest.fail(f"{p} was not built (libibverbs-dev missing?)")
    return str(p)


def run(argv, env, timeout=TIMEOUT, check=False, **kw):
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{argv} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                             f"stderr:\n{p.stderr}")
    return p


PRELUDE = """
import errno, json, sys
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.pyverbs_error import PyverbsRDMAError
def out(x):
    print(json.dumps(x))
"""


def pyverbs(code, env, timeout=TIMEOUT):
    """Runs code (after PRELUDE) in a child python; returns what it out()s."""
    p = run([PYTHON, "-c", PRELUDE + code], env, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"child python exited {p.returncode}\nstdout:\n{p.stdout}\n"
                             f"stderr:\n{p.stderr}")
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    assert lines, f"child printed nothing; stderr:\n{p.stderr}"
    return json.loads(lines[-1])


class Holder:
    """A child python that opens a device, reports, and keeps it open until
    stopped: a live process with a lease on the fabric."""

    CODE = """
import json, sys
import pyverbs.device as d
ctx = d.Context(name=sys.argv[1])
print(json.dumps({"ready": True}), flush=True)
sys.stdin.read()
"""

    def __init__(self, env, device="loop0"):
        self.proc = subprocess.Popen([PYTHON, "-c", self.CODE, device], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid

    def wait_ready(self):
        # readline() has no timeout of its own: an alarm bounds it.
        old = signal.signal(signal.SIGALRM, self._late)
        signal.alarm(TIMEOUT)
        try:
            line = self.proc.stdout.readline()
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        if not line:
            self.stop()
            raise AssertionError(f"holder failed: {self.proc.stderr.read()}")
        assert json.loads(line)["ready"]
        return self

    def _late(self, *_):
        self.proc.kill()
        raise TimeoutError("holder did not open its device in time")

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()
        return self.proc.returncode

    def __enter__(self):
        return self.wait_ready()

    def __exit__(self, *exc):
        self.stop()


def format_guid(g):
    """As ibv_devinfo prints a GUID: xxxx:xxxx:xxxx:xxxx."""
    h = f"{g:016x}"
    return ":".join(h[i:i + 4] for i in range(0, 16, 4))
