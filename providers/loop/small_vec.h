// SPDX-License-Identifier: MIT
// A vector of trivially copyable elements whose first N live inside it (on
// the caller's stack), for the engine's per-WR scratch lists: iovecs and
// copy pieces.  They used to be thread_local std::vectors, and every access
// to a thread_local in a shared library is a call to __tls_get_addr (two
// with its guard): about 30 such calls per 64-byte WRITE, a quarter of the
// posting path (docs/PERFORMANCE.md).  Past N elements it moves to the
// heap, so any length still works; the common WR never gets there.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>

namespace loop {

template <class T, size_t N> class small_vec {
	static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
	static_assert(N > 0);

public:
	// The inline elements are left unconstructed (see inl_).
	small_vec() {}
	small_vec(const small_vec &o) { *this = o; }
	small_vec &operator=(const small_vec &o)
	{
		if (this != &o) {
			clear();
			insert_end(o.begin(), o.end());
		}
		return *this;
	}

	void clear() { n_ = 0; }
	// Drops the elements from n on (n <= size()).
	void shrink(size_t n) { n_ = n; }
	// May throw std::bad_alloc past N (the caller's c_boundary.h catch).
	void push_back(const T &v)
	{
		if (n_ == cap_) [[unlikely]] {
			T copy = v; // v may be one of ours, freed by grow()
			grow();
			std::construct_at(p_ + n_++, copy);
			return;
		}
		std::construct_at(p_ + n_++, v);
	}
	// [first, last) must not be this vector's own elements.
	template <class It> void insert_end(It first, It last)
	{
		for (; first != last; ++first)
			push_back(*first);
	}
	size_t size() const { return n_; }
	bool empty() const { return n_ == 0; }
	T *data() { return p_; }
	const T *data() const { return p_; }
	T *begin() { return p_; }
	T *end() { return p_ + n_; }
	const T *begin() const { return p_; }
	const T *end() const { return p_ + n_; }
	T &operator[](size_t i) { return p_[i]; }
	const T &operator[](size_t i) const { return p_[i]; }
	T &back() { return p_[n_ - 1]; }

private:
	void grow()
	{
		size_t cap = cap_ * 2;
		std::unique_ptr<T[]> h(new T[cap]);
		memcpy(h.get(), p_, n_ * sizeof(T));
		heap_ = std::move(h);
		p_ = heap_.get();
		cap_ = cap;
	}

	// In a union, so that a small_vec's construction does not construct N
	// elements: a T with default member initializers (tp_move's psn) made
	// each rdma_batch write all 64 of its ops, about 200 instructions per
	// posting call (callgrind, ib_send_bw 64 B).  Elements begin their
	// lifetime when push_back copies one in; T is trivially copyable and
	// destructible, so nothing is owed at the end.
	union {
		T inl_[N];
	};
	std::unique_ptr<T[]> heap_;
	T *p_ = inl_;
	size_t n_ = 0;
	size_t cap_ = N;
};

} // namespace loop
