// SPDX-License-Identifier: MIT
// softverbs_fabric: fabric introspection for the Python tests.  A thin
// binding of tools/fabric_inspect.h, so Python sees exactly what the
// softverbs command sees, without loading libibverbs.
#include "../fabric_inspect.h"

#include <cstddef>

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
	// Fault injection (pyverbs-tests/test_fault_injection.py): where each
	// region of each segment kind lies, from the ABI header this module was
	// built with, so a test that writes garbage into a region hits exactly it
	// whatever the layout of the day.
	m.def(
	    "layout",
	    []() {
		    py::dict d;
#define SVF_OFF(name, type, field) d[name] = offsetof(type, field)
#define SVF_SIZE(name, type) d[name] = sizeof(type)
		    SVF_OFF("reg.lock", sv_registry, lock);
		    SVF_OFF("reg.leases", sv_registry, leases);
		    SVF_OFF("reg.mcast", sv_registry, mcast);
		    SVF_OFF("reg.atomic_locks", sv_registry, atomic_locks);
		    SVF_OFF("reg.objs", sv_registry, objs);
		    SVF_OFF("reg.qps", sv_registry, qps);
		    SVF_OFF("reg.mrs", sv_registry, mrs);
		    SVF_SIZE("lease.size", sv_lease);
		    SVF_SIZE("mcast.size", sv_mcast_rec);
		    SVF_SIZE("obj.size", sv_obj_rec);
		    SVF_SIZE("qp.size", sv_qp_rec);
		    SVF_SIZE("mr.size", sv_mr_rec);
		    SVF_OFF("obj.in_use", sv_obj_rec, in_use);
		    SVF_OFF("obj.kind", sv_obj_rec, kind);
		    SVF_OFF("obj.owner_lease", sv_obj_rec, owner_lease);
		    SVF_OFF("qp.in_use", sv_qp_rec, in_use);
		    SVF_OFF("qp.owner_lease", sv_qp_rec, owner_lease);
		    SVF_OFF("qp.state", sv_qp_rec, state);
		    SVF_OFF("mr.state", sv_mr_rec, state);
		    SVF_OFF("mr.owner_lease", sv_mr_rec, owner_lease);
		    SVF_OFF("q.kind", sv_queue_hdr, kind);
		    SVF_OFF("q.entries", sv_queue_hdr, entries);
		    SVF_OFF("q.entry_size", sv_queue_hdr, entry_size);
		    SVF_OFF("q.slots_offset", sv_queue_hdr, slots_offset);
		    SVF_OFF("q.max_sge", sv_queue_hdr, max_sge);
		    SVF_OFF("q.owner_pid", sv_queue_hdr, owner_pid);
		    SVF_OFF("q.seg_size", sv_queue_hdr, seg.seg_size);
		    SVF_SIZE("q.hdr_size", sv_queue_hdr);
		    SVF_OFF("cq.prod", sv_cq_ring, prod);
		    SVF_OFF("cq.cons", sv_cq_ring, cons);
		    SVF_OFF("cq.payload_offset", sv_cq_ring, payload_offset);
		    SVF_SIZE("cq.ring_size", sv_cq_ring);
		    SVF_SIZE("cqe.size", sv_cqe);
		    SVF_SIZE("payload.size", sv_cqe_payload);
		    SVF_OFF("rq.prod", sv_rq_ring, prod);
		    SVF_OFF("rq.cons", sv_rq_ring, cons);
		    SVF_SIZE("rq.ring_size", sv_rq_ring);
		    SVF_OFF("svc.lock", sv_svc_ring, lock);
		    SVF_OFF("svc.state", sv_svc_ring, state);
		    SVF_OFF("svc.op", sv_svc_ring, op);
		    SVF_OFF("svc.status", sv_svc_ring, status);
		    SVF_OFF("svc.addr", sv_svc_ring, addr);
		    SVF_OFF("svc.len", sv_svc_ring, len);
#undef SVF_OFF
#undef SVF_SIZE
		    d["max_procs"] = SV_MAX_PROCS;
		    d["max_mcast"] = SV_MAX_MCAST;
		    d["atomic_locks"] = SV_ATOMIC_LOCKS;
		    d["max_objs"] = SV_MAX_OBJS;
		    d["max_qps"] = SV_MAX_QPS;
		    d["max_mrs"] = SV_MAX_MRS;
		    d["qpn_slot_mask"] = SV_QPN_SLOT_MASK;
		    d["mr_key_bits"] = SV_MR_KEY_BITS;
		    d["OBJ_CQ"] = static_cast<int>(SV_OBJ_CQ);
		    d["OBJ_RQ"] = static_cast<int>(SV_OBJ_RQ);
		    d["OBJ_SRQ"] = static_cast<int>(SV_OBJ_SRQ);
		    d["OBJ_SVC"] = static_cast<int>(SV_OBJ_SVC);
		    return d;
	    },
	    "Offsets and sizes of the shared-memory regions (kernel-abi/softverbs-abi.h), "
	    "as 'segment.field' -> bytes, for fault-injection tests");
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
