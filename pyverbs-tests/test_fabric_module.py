# SPDX-License-Identifier: MIT
"""softverbs_fabric, our pybind11 introspection module, against processes
that really open devices."""
import os

import pytest

import svtest
from svtest import pyverbs

import softverbs_fabric  # Built by meson into <build>/tools; PYTHONPATH points there


def test_module_sees_devices_and_leases(env, fabric):
    env["SOFTVERBS_DEVICES"] = "loop0,loop1"
    with pytest.raises(KeyError):
        softverbs_fabric.fabric(fabric)
    seen = pyverbs("""
res = {}
for dev in d.get_device_list():
    with d.Context(name=dev.name.decode()) as ctx:
        res[dev.name.decode()] = {"guid": dev.guid, "lid": ctx.query_port(1).lid}
out(res)
""", env)
    f = softverbs_fabric.fabric(fabric)
    assert f["status"] == "ok" and f["abi_version"] == softverbs_fabric.ABI_VERSION
    assert {d["name"]: {"guid": d["node_guid"], "lid": d["ports"][0]["lid"]}
            for d in f["devices"]} == seen
    # That process closed its devices and exited: it gave its lease back, and
    # the slot keeps its pid (a closed lease, not live).
    assert softverbs_fabric.lease_count(fabric) == 0
    assert len(f["leases"]) == 1 and not f["leases"][0]["live"]

    with svtest.Holder(env) as a, svtest.Holder(env, "loop1") as b:
        assert softverbs_fabric.lease_count(fabric) == 2
        live = {l["pid"] for l in softverbs_fabric.fabric(fabric)["leases"] if l["live"]}
        assert live == {a.pid, b.pid}
        assert {a.pid, b.pid} <= set(softverbs_fabric.fabric(fabric)["mappers"])
        # The first holder's slot is the dead process's, reused.
        slots = {l["pid"]: l["slot"] for l in softverbs_fabric.fabric(fabric)["leases"]}
        assert slots[a.pid] == f["leases"][0]["slot"]
    assert softverbs_fabric.lease_count(fabric) == 0
    names = [x["name"] for x in softverbs_fabric.list_fabrics()]
    assert fabric in names
