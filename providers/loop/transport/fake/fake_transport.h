// SPDX-License-Identifier: MIT
// The fake transport, for the engine's unit tests: the loop transport's
// peers (QPs of this process), reached through a wire that loses,
// delays, duplicates and reorders requests and answers on command.  Its
// responder keeps an expected sequence number per destination QP
// (responder.cpp: resp_seq), as a transport whose wire can misbehave
// must: a duplicate is answered again but not executed again, a request
// beyond a gap is refused (the requester retries it).
// Built into the test binaries only, never into libibverbs.so.1.
#pragma once

#include <atomic>
#include <cstdint>

namespace loop {

struct fake_faults {
	// Each counts down: while above zero, the next event of its kind is hit.
	std::atomic<int> drop_requests{0}; // A request never reaches the responder
	std::atomic<int> drop_answers{0};  // The responder executes; its answer is lost
	std::atomic<int> duplicate{0};	   // A SEND-class request arrives twice
	std::atomic<int> replay_stale{0};  // The previous request arrives again, late
	// Requests are held this long (from their first try) before they
	// arrive: a delay longer than the QP's timeout makes retries.
	std::atomic<uint64_t> delay_ns{0};
};

struct fake_stats {
	uint64_t requests;   // Handed to the wire (deliver, move, atomic)
	uint64_t dropped;    // Requests and answers lost
	uint64_t executed;   // Requests the responder executed
	uint64_t duplicates; // Requests the responder knew as duplicates
	uint64_t refused;    // Requests beyond a gap (future sequence numbers)
};

fake_faults &fake_transport_faults();
fake_stats fake_transport_stats();
// Registers the fake (once) and makes it the transport the engine calls;
// clears the faults, the statistics and the responders' sequence state.
// 0 or the errno of registration.
int fake_transport_install();
// Back to the loop transport.
void fake_transport_uninstall();
// Registers, under name, the loop transport's table less the call named
// `missing` (nullptr: none): the errno of transport_register.  For tests of
// the completeness check, which include no provider header.
int fake_register_partial(const char *name, const char *missing);
// transport.h's, for those tests.
int transport_select(const char *name);

} // namespace loop
