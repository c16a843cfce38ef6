// SPDX-License-Identifier: MIT
// softverbs_fabric: fabric introspection for the Python tests.  A thin
// binding of tools/fabric_inspect.h, so Python sees exactly what the
// softverbs command sees, without loading libibverbs.
#include "../fabric_inspect.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;
using namespace svtool;

namespace
{

py::dict to_dict(const fabric_info &f)
{
	py::list devices;
	for (auto &d : f.devices) {
		py::list ports;
		for (auto &p : d.ports) {
			py::dict pd;
			pd["port_num"] = p.port_num;
			pd["lid"] = p.lid;
			pd["state"] = p.state;
			pd["link_layer"] = link_layer_name(p.link_layer);
			pd["active_mtu"] = mtu_bytes(p.active_mtu);
			pd["port_guid"] = p.port_guid;
			ports.append(pd);
		}
		py::dict dd;
		dd["name"] = d.name;
		dd["index"] = d.index;
		dd["node_guid"] = d.node_guid;
		dd["ports"] = ports;
		devices.append(dd);
	}
	py::list leases;
	for (auto &l : f.leases) {
		py::dict ld;
		ld["slot"] = l.slot;
		ld["pid"] = l.pid;
		ld["generation"] = l.generation;
		ld["live"] = l.live;
		leases.append(ld);
	}
	py::dict out;
	out["name"] = f.name;
	out["path"] = f.path;
	out["status"] = status_name(f.status);
	out["error"] = f.error;
	out["abi_version"] = f.abi_version;
	out["devices"] = devices;
	out["leases"] = leases;
	out["live_leases"] = f.live_leases();
	out["object_segments"] = f.object_segments;
	out["mappers"] = f.mappers;
	return out;
}

} // namespace

PYBIND11_MODULE(softverbs_fabric, m)
{
	m.doc() = "Read-only introspection of softverbs fabrics in /dev/shm";
	m.attr("ABI_VERSION") = SV_ABI_VERSION;
	m.def("segment_prefix", &segment_prefix,
	      "'softverbs-<uid>-': the prefix of this user's segments in /dev/shm");
	m.def(
	    "list_fabrics",
	    []() {
		    py::list l;
		    for (auto &f : list_fabrics())
			    l.append(to_dict(f));
		    return l;
	    },
	    "Every fabric of this user, as dicts (see fabric())");
	m.def(
	    "fabric",
	    [](const std::string &name) {
		    fabric_info f;
		    if (!inspect_fabric(name, f))
			    throw py::key_error("no fabric '" + name + "' in /dev/shm");
		    return to_dict(f);
	    },
	    py::arg("name"),
	    "One fabric: name, path, status, abi_version, devices (name, index, node_guid, "
	    "ports: port_num, lid, state, link_layer, active_mtu, port_guid), leases (slot, "
	    "pid, generation, live), live_leases, object_segments, mappers");
	m.def(
	    "lease_count",
	    [](const std::string &name) {
		    fabric_info f;
		    if (!inspect_fabric(name, f))
			    throw py::key_error("no fabric '" + name + "' in /dev/shm");
		    if (f.status != seg_status::ok)
			    throw std::runtime_error(f.error);
		    return f.live_leases();
	    },
	    py::arg("name"), "Leases of live processes in the fabric's registry");
}
