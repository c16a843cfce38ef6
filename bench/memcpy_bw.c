// SPDX-License-Identifier: MIT
// Single-core memcpy at one size: prints "<size> <MiB/s> <ns per copy>".
// The bench harness builds and runs this beside perftest and ucx_perftest.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s SIZE [SECONDS]\n", argv[0]);
		return 2;
	}
	size_t size = strtoull(argv[1], NULL, 0);
	double secs = argc > 2 ? atof(argv[2]) : 0.3;
	char *src = aligned_alloc(4096, size + 4096);
	char *dst = aligned_alloc(4096, size + 4096);
	if (!src || !dst)
		return 1;
	memset(src, 1, size);
	memset(dst, 2, size);
	uint64_t n = 0, batch = 1;
	double t0 = now(), t;
	// Grow the batch until one takes about a millisecond, then run for secs.
	do {
		for (uint64_t i = 0; i < batch; i++) {
			memcpy(dst, src, size);
			__asm__ volatile("" ::"r"(dst) : "memory");
		}
		n += batch;
		t = now() - t0;
		if (t < 1e-3 * n / batch)
			batch *= 2;
	} while (t < secs);
	printf("%zu %.1f %.2f\n", size, (double)size * n / t / (1 << 20), t * 1e9 / n);
	return 0;
}
