// SPDX-License-Identifier: MIT
// Thread domains and parent domains.
//
// A thread domain is a promise by the application that one thread at a
// time uses the objects under it; mlx5 uses it to drop locks and pick a
// doorbell.  The loop provider's locks are uncontended user-space mutexes,
// so a TD is accepted and recorded, and changes nothing.
//
// A parent domain stands in for its protection domain wherever a PD is
// taken (QPs, SRQs, MRs, CQs through IBV_CQ_INIT_ATTR_MASK_PD): it carries
// the protection domain's PD number, so keys and checks are those of the
// protection domain.  The application's allocators
// (IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) are accepted and not called: the
// provider's queue memory is shared memory that peers map, which an
// application allocator cannot supply; its other allocations are small
// host objects.  See docs/extended-verbs.md.
#include "loop.h"
#include "objects.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <new>

namespace loop {

namespace {

struct loop_td {
	ibv_td base; // Must be first
	obj_life life{kLifeTd}; // Users: parent domains
};

struct loop_parent_domain {
	loop_pd pd; // Must be first; pd.pdn is the protection domain's
	ibv_pd *protection_domain;
	ibv_td *td;
	void *pd_context;
	void *(*alloc)(ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
		       uint64_t resource_type);
	void (*free)(ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type);
	parent_refs parents; // Its protection domain and thread domain
};

loop_td *to_loop_td(ibv_td *td)
{
	return reinterpret_cast<loop_td *>(td);
}

} // namespace

ibv_td *loop_alloc_td(ibv_context *ctx, ibv_td_init_attr *attr)
{
	if (ctx_closed(ctx, "ibv_alloc_td"))
		return nullptr;
	if (!attr || attr->comp_mask) {
		errno = EINVAL;
		return nullptr;
	}
	auto *td = new (std::nothrow) loop_td{};
	if (!td) {
		errno = ENOMEM;
		return nullptr;
	}
	td->base.context = ctx;
	owned_add(ctx, td, kOwnTd);
	return &td->base;
}

int loop_dealloc_td(ibv_td *ibtd)
{
	if (ctx_orphaned(ibtd->context))
		return EBADF;
	loop_td *td = to_loop_td(ibtd);
	// EBUSY while a parent domain uses it, as mlx5 answers.
	if (int e = td->life.begin_destroy(kLifeTd, "ibv_dealloc_td", td))
		return e;
	td->life.end_destroy(kLifeTd);
	quarantine(td);
	return 0;
}

ibv_pd *loop_alloc_parent_domain(ibv_context *ctx, ibv_parent_domain_init_attr *attr)
{
	if (ctx_closed(ctx, "ibv_alloc_parent_domain"))
		return nullptr;
	uint32_t known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			 IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	if (!attr || !attr->pd || (attr->comp_mask & ~known)) {
		errno = attr && (attr->comp_mask & ~known) ? EOPNOTSUPP : EINVAL;
		return nullptr;
	}
	loop_pd *prot = to_loop_pd(attr->pd);
	parent_guard parents;
	if (!parents.add(prot->life, kLifePd)) {
		errno = life_bad("ibv_alloc_parent_domain", prot, prot->life, kLifePd);
		return nullptr;
	}
	if (attr->td && !parents.add(to_loop_td(attr->td)->life, kLifeTd)) {
		errno = life_bad("ibv_alloc_parent_domain", attr->td, to_loop_td(attr->td)->life,
				 kLifeTd);
		return nullptr;
	}
	if (prot->parent_domain || attr->pd->context != ctx ||
	    (attr->td && attr->td->context != ctx)) {
		errno = EINVAL;
		return nullptr;
	}
	if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) &&
	    (!attr->alloc || !attr->free)) {
		errno = EINVAL;
		return nullptr;
	}
	auto *p = new (std::nothrow) loop_parent_domain{};
	if (!p) {
		errno = ENOMEM;
		return nullptr;
	}
	p->pd.base.context = ctx;
	p->pd.base.handle = attr->pd->handle;
	p->pd.pdn = prot->pdn;
	p->pd.parent_domain = true;
	p->protection_domain = attr->pd;
	p->td = attr->td;
	if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
		p->pd_context = attr->pd_context;
	if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
		p->alloc = attr->alloc;
		p->free = attr->free;
	}
	p->parents = parents.keep();
	owned_add(ctx, p, kOwnParentDomain);
	return &p->pd.base;
}

// After loop_dealloc_pd's begin_destroy: nothing uses the parent domain.
int loop_dealloc_parent_domain(loop_pd *pd)
{
	auto *p = reinterpret_cast<loop_parent_domain *>(pd);
	p->parents.release();
	pd->life.end_destroy(kLifePd);
	quarantine(p);
	return 0;
}

void *pd_alloc(ibv_pd *pd, size_t size, size_t alignment, uint64_t resource_type)
{
	if (!pd || !to_loop_pd(pd)->parent_domain)
		return IBV_ALLOCATOR_USE_DEFAULT;
	auto *p = reinterpret_cast<loop_parent_domain *>(to_loop_pd(pd));
	if (!p->alloc)
		return IBV_ALLOCATOR_USE_DEFAULT;
	return p->alloc(pd, p->pd_context, size, alignment, resource_type);
}

int loop_dv_alloc_fd(ibv_pd *pd, void *addr, size_t len, int fd, uint64_t offset)
{
	loop_pd *p = to_loop_pd(pd);
	if (!p->life.is(kLifePd))
		return life_bad("softverbs_dv_alloc_fd", p, p->life, kLifePd);
	return place_publish(addr, len, fd, offset);
}

int pd_place(ibv_pd *pd, uint64_t type, size_t bytes, queue_place &place,
	     std::shared_ptr<placed_file> &file)
{
	place = {};
	void *mem = pd_alloc(pd, bytes, 4096, type);
	if (!mem)
		return ENOMEM;
	if (mem == IBV_ALLOCATOR_USE_DEFAULT)
		return 0;
	if (reinterpret_cast<uintptr_t>(mem) % SV_CACHELINE) {
		pd_free(pd, mem, type);
		return EINVAL; // The ring's lines must be cache lines
	}
	uint64_t offset = 0;
	std::shared_ptr<placed_file> f = place_find(mem, bytes, offset);
	if (!f) {
		// Peers write into the ring: memory they cannot map cannot hold
		// it.  Given back, and the queue gets ours, as an allocator that
		// said USE_DEFAULT would (rdma-core's tests hand out
		// posix_memalign memory for every type and expect the object).
		pd_free(pd, mem, type);
		static std::atomic<bool> said{false};
		if (!said.exchange(true))
			fprintf(stderr,
				"softverbs: a CQ or receive-queue ring from a parent domain's "
				"allocator is in memory whose file the library was not told "
				"(softverbs_dv_alloc_fd): other processes could not reach it, so "
				"the library uses its own memory for it (docs/agent.md)\n");
		return 0;
	}
	if (reinterpret_cast<uintptr_t>(mem) % 4096) {
		pd_free(pd, mem, type);
		return EINVAL; // Peers map it by pages
	}
	place.mem = mem;
	place.file = f.get();
	place.offset = offset;
	file = std::move(f);
	return 0;
}

void pd_free(ibv_pd *pd, void *ptr, uint64_t resource_type)
{
	auto *p = reinterpret_cast<loop_parent_domain *>(to_loop_pd(pd));
	p->free(pd, p->pd_context, ptr, resource_type);
}

} // namespace loop
