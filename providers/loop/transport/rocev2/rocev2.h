// SPDX-License-Identifier: MIT
// The rocev2 transport: a connected QP whose peer is on another host
// reaches it with RoCE v2 packets (IBTA Annex A17: InfiniBand transport
// headers in UDP datagrams to port 4791, wire.h), through an unprivileged
// UDP socket of this process.  Within a host, processes keep the loop
// transport's shared memory; the loop transport hands every call for a
// remote peer (peer::remote) to this table.  docs/rocev2.md has the design.
#pragma once

#include "transport.h"

#include <atomic>
#include <cstdint>

namespace loop {

struct loop_context;
struct loop_qp;
struct send_wr;

extern const transport_ops rocev2_transport_ops;

// QPs of this process with RDMA WRITEs on the wire, which its receive
// thread sends and completes: a CQ poller that finds nothing yields its
// core to it while there are any.
extern std::atomic<uint32_t> rocev2_flying_qps;

// A context of a device with rocev2 on was opened: this process takes the
// device's UDP port, if no process of this host holds it, and starts its
// receive thread.
void rocev2_device_open(loop_context *lctx);
// After every ibv_modify_qp (caller holds qp->sq_lock): at RTR the QP's
// responder starts at rq_psn and the QP learns whether its peer is on
// another host (loop_qp::wire_remote); at RTS its requester starts at
// sq_psn; RESET forgets both.
void rocev2_qp_modified(loop_qp *qp, int mask);
// An RC QP's RDMA WRITE (wr, its gather list iov, len bytes), handed over
// by the engine under sq_lock when every WR before it is done or handed
// over too: its packets go out now and the receive thread completes it
// when its ACK comes (or fails it), several in flight at once.  False
// when the QP cannot (the engine then runs it itself).
bool rocev2_write_start(loop_qp *qp, const send_wr &wr, const iovec *iov, int niov, uint64_t len);
// Completes the QP's answered WRITEs the receive thread could not (it
// only tries sq_lock, which the caller holds).
void rocev2_settle(loop_qp *qp);
// The engine flushes the QP's send queue (caller holds sq_lock): its
// WRITEs in flight are dropped first, so that no packet reads their
// buffers once their completions are out.
void rocev2_drop_flights(loop_qp *qp);
// Before a QP's memory goes: packets for it are dropped from now on.
void rocev2_qp_destroyed(loop_qp *qp);
// Whether dgid is an address of another host (none of the port's GIDs).
bool rocev2_remote_gid(loop_context *lctx, uint8_t port, const ibv_gid &dgid);
// The largest IB MTU (enum ibv_mtu) whose packets fit the device's
// interface MTU: the port's active MTU when it speaks RoCE v2.
uint8_t rocev2_port_mtu(loop_context *lctx);

} // namespace loop
