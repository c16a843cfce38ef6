// SPDX-License-Identifier: MIT
// The fake transport (fake_transport.h).  Everything the wire does not
// touch (addressing, keys, the responder's rings) is the loop transport's;
// the wire's faults sit in front of the responder and of one-sided copies.
// One lock serialises the wire: tests run several QPs and the progress
// thread, and the faults are counted exactly.
#include "fake_transport.h"

#include "engine.h"

#include <cerrno>
#include <map>
#include <mutex>
#include <string>

namespace loop {

namespace {

struct held_request {
	bool valid = false;
	peer p;
	send_wr w;
	local_buf lb;
	tp_request r;
};

struct responder_state {
	resp_seq seq;
	uint32_t last_psn = 0;
	tp_answer last{tp_answer::kind::ack, IBV_WC_SUCCESS, 0};
};

struct wire {
	std::mutex lock;
	fake_faults faults;
	fake_stats stats{};
	std::map<uint32_t, responder_state> responders; // By destination QPN
	std::map<uint64_t, uint64_t> first_try;		 // (QPN, PSN) -> ns, for delay
	held_request last;
};

wire &the_wire()
{
	static wire *w = new wire; // Never destroyed: the progress thread may outlive main
	return *w;
}

bool take(std::atomic<int> &n)
{
	int v = n.load(std::memory_order_relaxed);
	while (v > 0)
		if (n.compare_exchange_weak(v, v - 1, std::memory_order_relaxed))
			return true;
	return false;
}

// Whether a request is still on the wire (the delay fault).  Caller holds lock.
bool delayed(wire &wi, uint32_t qpn, uint32_t psn)
{
	uint64_t d = wi.faults.delay_ns.load(std::memory_order_relaxed);
	if (!d)
		return false;
	uint64_t key = (uint64_t{qpn} << 32) | psn;
	uint64_t now = now_ns();
	auto [it, fresh] = wi.first_try.emplace(key, now);
	return now - it->second < d;
}

constexpr tp_answer kLost{tp_answer::kind::lost, IBV_WC_SUCCESS, 0};

// The responder's side of the wire: sequence check, then the engine's
// responder on the loop transport's rings.  Caller holds lock.
tp_answer arrive(wire &wi, loop_qp *qp, const peer &p, const tp_request &r)
{
	if (r.psn == kNoPsn) // A datagram: not sequenced
		return respond(loop_transport_ops, qp, p, r);
	responder_state &rs = wi.responders[p.qpn];
	switch (resp_seq_check(rs.seq, r.psn)) {
	case psn_class::duplicate:
		// Executed before: answered again, as it was (or ACK, for an older one).
		wi.stats.duplicates++;
		if (r.psn == rs.last_psn)
			return rs.last;
		return {tp_answer::kind::ack, IBV_WC_SUCCESS, static_cast<uint32_t>(r.lb->len)};
	case psn_class::future:
		wi.stats.refused++;
		return kLost; // A sequence NAK: the requester sends it again
	case psn_class::expected:
		break;
	}
	tp_answer a = respond(loop_transport_ops, qp, p, r);
	// An RNR NAK or a request lost at the responder did not execute.
	if (a.k == tp_answer::kind::rnr || a.k == tp_answer::kind::lost)
		return a;
	wi.stats.executed++;
	resp_seq_advance(rs.seq, r.psn);
	rs.last_psn = r.psn;
	rs.last = a;
	return a;
}

tp_answer fake_deliver(loop_qp *qp, const peer &p, const tp_request &r)
{
	wire &wi = the_wire();
	std::lock_guard<std::mutex> g(wi.lock);
	wi.stats.requests++;
	if (take(wi.faults.replay_stale) && wi.last.valid) {
		// An earlier request, overtaken on the wire, arrives now.
		held_request &h = wi.last;
		h.r.w = &h.w;
		h.r.lb = &h.lb;
		arrive(wi, qp, h.p, h.r);
	}
	if (delayed(wi, p.qpn, r.psn) || take(wi.faults.drop_requests)) {
		wi.stats.dropped++;
		return kLost;
	}
	tp_answer a = arrive(wi, qp, p, r);
	if (r.psn != kNoPsn) {
		wi.last.valid = true;
		wi.last.p = p;
		wi.last.w = *r.w;
		// The buffer's description, not its holds (the requester's, for
		// the call only).
		wi.last.lb.iov = r.lb->iov;
		wi.last.lb.len = r.lb->len;
		wi.last.lb.checked = r.lb->checked;
		wi.last.lb.mapped = r.lb->mapped;
		// Inline bytes live in the requester's WR, which may be its
		// stack: the replay reads them from the copy kept here.
		if (r.w->is_inline) {
			wi.last.lb.iov.clear();
			wi.last.lb.iov.push_back({wi.last.w.inline_data, wi.last.w.inline_len});
		}
		wi.last.r = r;
	}
	if (take(wi.faults.duplicate))
		arrive(wi, qp, p, r); // The copy's answer is the same request's: dropped
	if (take(wi.faults.drop_answers)) {
		wi.stats.dropped++;
		return kLost;
	}
	return a;
}

// One-sided copies: a lost request never moved a byte; a lost answer
// (READ response, WRITE ACK) did, and the retry moves the same bytes again.
// A batch is one request with one answer: lost, none of it counts as done.
int fake_move(loop_qp *qp, const peer &p, const tp_move *ops, size_t n, size_t *done)
{
	wire &wi = the_wire();
	std::lock_guard<std::mutex> g(wi.lock);
	wi.stats.requests++;
	if (done)
		*done = 0;
	if (take(wi.faults.drop_requests)) {
		wi.stats.dropped++;
		return ETIMEDOUT;
	}
	int err = loop_transport_ops.move(qp, p, ops, n, done);
	if (!err && take(wi.faults.drop_answers)) {
		wi.stats.dropped++;
		if (done)
			*done = 0;
		return ETIMEDOUT;
	}
	return err;
}

// Atomics lose requests only: a lost atomic answer needs the responder's
// replay cache (IB 9.7.7.2.5), which the loop transport has no use for.
int fake_atomic(loop_qp *qp, const peer &p, tp_atomic &op)
{
	wire &wi = the_wire();
	std::lock_guard<std::mutex> g(wi.lock);
	wi.stats.requests++;
	if (take(wi.faults.drop_requests)) {
		wi.stats.dropped++;
		return ETIMEDOUT;
	}
	return loop_transport_ops.atomic(qp, p, op);
}

const transport_ops &fake_ops()
{
	static const transport_ops ops = [] {
		transport_ops o = loop_transport_ops;
		o.name = "fake";
		o.deliver = fake_deliver;
		o.move = fake_move;
		o.atomic = fake_atomic;
		// Every request goes through the wire above, to be dropped,
		// duplicated or reordered: no express way around it.
		o.express = nullptr;
		return o;
	}();
	return ops;
}

} // namespace

fake_faults &fake_transport_faults()
{
	return the_wire().faults;
}

fake_stats fake_transport_stats()
{
	wire &wi = the_wire();
	std::lock_guard<std::mutex> g(wi.lock);
	return wi.stats;
}

int fake_transport_install()
{
	if (int err = transport_register(&fake_ops()))
		return err;
	wire &wi = the_wire();
	{
		std::lock_guard<std::mutex> g(wi.lock);
		wi.faults.drop_requests = 0;
		wi.faults.drop_answers = 0;
		wi.faults.duplicate = 0;
		wi.faults.replay_stale = 0;
		wi.faults.delay_ns = 0;
		wi.stats = {};
		wi.responders.clear();
		wi.first_try.clear();
		wi.last.valid = false;
	}
	return transport_select("fake");
}

void fake_transport_uninstall()
{
	transport_select("loop");
}

int fake_register_partial(const char *name, const char *missing)
{
	// Kept for the life of the process when registered (the registry
	// holds the pointer).
	auto *t = new transport_ops(loop_transport_ops);
	t->name = name;
	std::string m = missing ? missing : "";
	if (m == "resolve")
		t->resolve = nullptr;
	else if (m == "move")
		t->move = nullptr;
	else if (m == "deliver")
		t->deliver = nullptr;
	else if (m == "alive")
		t->alive = nullptr;
	int err = transport_register(t);
	if (err)
		delete t;
	return err;
}

} // namespace loop
