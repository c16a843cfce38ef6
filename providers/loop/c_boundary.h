// SPDX-License-Identifier: MIT
// The C boundary: no C++ exception leaves the provider through an op that C
// code calls (libibverbs' inline verbs, the application's own frames, which
// have no handlers and would abort).  Every verbs_context_ops and
// verbs_device_ops entry goes through c_boundary<fn>::call, which turns an
// exception the op did not handle itself (std::bad_alloc from a container
// on a verb path, std::system_error from starting a thread) into the verb's
// own way of failing:
//  - a pointer: NULL with errno (ENOMEM, or the system_error's code);
//  - an int: that errno returned (the ops return errnos), except poll_cq
//    and the provider's enumerate, which return it negated (a count
//    otherwise), and the post verbs, which also point bad_wr
//    at the first WR (each of them catches per WR itself, so that bad_wr
//    is exact; this is the backstop);
//  - void: nothing to report.
// A thread cancelled inside a blocking verb unwinds through here as C
// frames would let it: abi::__forced_unwind is rethrown, never swallowed.
#pragma once

#include <cerrno>
#include <cxxabi.h>
#include <pthread.h>
#include <new>
#include <system_error>
#include <tuple>
#include <type_traits>

struct ibv_cq;
struct ibv_wc;
struct verbs_sysfs_dev;

namespace loop {

// Holds off thread cancellation for its scope: around a system call that
// is a cancellation point (sendto, open, close) made after the WR it serves
// already took effect, so that a cancelled poster never leaves a WR posted
// to run a second time (a receive WQE consumed twice, a completion pushed
// twice).
class cancel_off {
public:
	cancel_off() noexcept
	{
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_);
	}
	~cancel_off()
	{
		int ignored;
		pthread_setcancelstate(old_, &ignored);
	}
	cancel_off(const cancel_off &) = delete;
	cancel_off &operator=(const cancel_off &) = delete;

private:
	int old_ = PTHREAD_CANCEL_ENABLE;
};

// The errno an escaping exception stands for.  Call inside a catch block.
inline int current_exception_errno() noexcept
{
	try {
		throw;
	} catch (const std::system_error &e) {
		return e.code().value() > 0 ? e.code().value() : ENOMEM;
	} catch (...) {
		return ENOMEM; // bad_alloc, length_error: out of memory for this request
	}
}

template <auto Fn> struct c_boundary;

template <typename R, typename... A, R (*Fn)(A...)> struct c_boundary<Fn> {
	static R call(A... a)
	{
		try {
			return Fn(a...);
		} catch (abi::__forced_unwind &) {
			throw;
		} catch (...) {
			int err = current_exception_errno();
			(void)err;
			if constexpr (std::is_pointer_v<R>) {
				errno = err;
				return nullptr;
			} else if constexpr (std::is_same_v<R, int>) {
				// post_send, post_recv, post_srq_recv: (object, wr, bad_wr).
				if constexpr (sizeof...(A) == 3) {
					using last = std::tuple_element_t<2, std::tuple<A...>>;
					using wr = std::tuple_element_t<1, std::tuple<A...>>;
					if constexpr (std::is_same_v<last, wr *>) {
						set_bad(a...);
					}
				}
				// poll_cq and enumerate return a count, and a negative
				// errno on error.
				if constexpr (std::is_same_v<std::tuple<A...>,
							     std::tuple<ibv_cq *, int, ibv_wc *>> ||
					      std::is_same_v<std::tuple<A...>,
							     std::tuple<verbs_sysfs_dev *, int>>)
					return -err;
				return err;
			} else if constexpr (!std::is_void_v<R>) {
				static_assert(std::is_void_v<R>, "no failure convention for this op");
			}
		}
	}

private:
	template <typename O, typename W> static void set_bad(O, W wr, W *bad)
	{
		if (bad)
			*bad = wr;
	}
};

} // namespace loop

// The ops tables name each op as SV_C(fn).
#define SV_C(fn) (&::loop::c_boundary<fn>::call)
