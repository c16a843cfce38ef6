/* SPDX-License-Identifier: MIT */
/* A malloc that fails on request, for the allocation-failure tests
 * (sv_enomem.c): preloaded with LD_PRELOAD, it forwards to glibc until a
 * thread calls svfail_arm(n); from then on that thread's first n
 * allocations succeed and every later one fails with ENOMEM, until
 * svfail_disarm().  Per thread, so that the library's own threads (the
 * progress engine, the service thread) are not hit.  C++'s operator new
 * allocates through malloc, so it throws std::bad_alloc here. */
#include <errno.h>
#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

#define EXPORT __attribute__((visibility("default")))

/* Initial-exec: reading it never allocates (a malloc hook must not). */
static __thread long budget __attribute__((tls_model("initial-exec"))) = -1;
static __thread long failures __attribute__((tls_model("initial-exec")));

static int fail_now(void)
{
	if (budget < 0)
		return 0;
	if (budget > 0) {
		budget--;
		return 0;
	}
	failures++;
	errno = ENOMEM;
	return 1;
}

EXPORT void svfail_arm(long after)
{
	failures = 0;
	budget = after;
}

/* Disarms; returns how many allocations failed while armed. */
EXPORT long svfail_disarm(void)
{
	budget = -1;
	return failures;
}

EXPORT void *malloc(size_t n)
{
	return fail_now() ? NULL : __libc_malloc(n);
}

EXPORT void *calloc(size_t a, size_t b)
{
	return fail_now() ? NULL : __libc_calloc(a, b);
}

EXPORT void *realloc(void *p, size_t n)
{
	return fail_now() ? NULL : __libc_realloc(p, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
	return fail_now() ? NULL : __libc_memalign(align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	return fail_now() ? NULL : __libc_memalign(align, n);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	if (align < sizeof(void *) || (align & (align - 1)))
		return EINVAL;
	if (fail_now())
		return ENOMEM;
	void *p = __libc_memalign(align, n);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}
