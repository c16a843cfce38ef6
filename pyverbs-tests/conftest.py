# SPDX-License-Identifier: MIT
"""Fixtures for the pyverbs suite.

pyverbs loads libibverbs.so.1 when it is imported, so every scenario that
touches verbs runs in a child /usr/bin/python3 (or an unmodified tool) with
LD_LIBRARY_PATH pointing at our build; the pytest process itself never
imports pyverbs.  Each test gets a fabric of its own and its segments are
removed afterwards, whatever the outcome.
"""
import glob
import os
import pathlib

import pytest

import svtest


@pytest.fixture(scope="session")
def build_dir():
    d = svtest.build_dir()
    lib = d / "libibverbs-compat" / "libibverbs.so.1"
    if not lib.exists():
        pytest.fail(f"{lib} does not exist: build first (ninja -C {d}) "
                    "or set SOFTVERBS_BUILD_DIR")
    return d


@pytest.fixture
def fabric(tmp_path):
    """A private fabric name; its /dev/shm segments go when the test ends."""
    name = svtest.new_fabric_name()
    yield name
    svtest.remove_fabric(name)
    left = glob.glob(f"/dev/shm/{svtest.segment_prefix()}{glob.escape(name)}*")
    assert not left, f"segments left behind: {left}"


@pytest.fixture
def env(build_dir, fabric, tmp_path):
    """Environment for a child that uses our library on the test's fabric.

    HOME and SOFTVERBS_CONFIG point at the test's own directory so that a
    config file of the machine or the user cannot change the outcome.  In a
    sanitizer build the children's reports land in the test's directory and
    are judged when it ends (svtest.sanitizer_failures).
    """
    conf = tmp_path / "softverbs.conf"
    conf.write_text("")
    e = svtest.clean_environ()
    e.update({
        "LD_LIBRARY_PATH": str(build_dir / "libibverbs-compat"),
        "SOFTVERBS_FABRIC": fabric,
        "SOFTVERBS_CONFIG": str(conf),
        "HOME": str(tmp_path),
    })
    san = tmp_path / "sanitizer"
    san.mkdir()
    yield svtest.sanitize_environ(e, san)
    bad = svtest.sanitizer_failures(san)
    if bad:
        pytest.fail("sanitizer reports:\n" + "\n\n".join(bad), pytrace=False)


@pytest.fixture
def tool_env(env):
    """Like env, but for softverbs-run to set LD_LIBRARY_PATH itself."""
    e = dict(env)
    del e["LD_LIBRARY_PATH"]
    return e


@pytest.fixture
def softverbs(build_dir):
    return str(build_dir / "tools" / "softverbs")


@pytest.fixture
def softverbs_run(build_dir):
    return str(build_dir / "tools" / "softverbs-run")
