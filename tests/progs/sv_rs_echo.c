// SPDX-License-Identifier: MIT
// A plain TCP echo over the BSD socket calls, nothing RDMA in it: run under
// librspreload.so (pyverbs-tests/test_rsocket.py) its sockets become
// rsockets.  Every byte is checked.
//
//   sv_rs_echo server ADDR PORT [block|poll|dual]
//       accepts one connection and echoes it until end of file; prints
//       "listening" once it listens, then "server bytes=N sum=X".  dual:
//       blocking, and an IPv6 ADDR listens with IPV6_V6ONLY off (IPv4
//       peers too, as iperf3's default listener does).
//   sv_rs_echo client ADDR PORT BYTES [poll|select]
//       sends BYTES bytes (the 32-bit little-endian word i at byte 4i) in
//       chunks of varying size while reading the echo back, nonblocking;
//       shuts down its sending side, reads to end of file, and checks that
//       the echo is the stream it sent; prints "client bytes=N sum=X".
// Exit status 0 when everything matched.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "sv_rs_echo: %s: %s\n", what, strerror(errno));
	exit(2);
}

static int addr_of(const char *host, const char *port, struct sockaddr_storage *ss, socklen_t *len)
{
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
	memset(ss, 0, sizeof(*ss));
	if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons((uint16_t)atoi(port));
		*len = sizeof(*a4);
		return AF_INET;
	}
	if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons((uint16_t)atoi(port));
		*len = sizeof(*a6);
		return AF_INET6;
	}
	fprintf(stderr, "sv_rs_echo: bad address %s\n", host);
	exit(2);
}

// FNV-1a over the stream
static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

static unsigned char pattern(uint64_t off)
{
	uint32_t word = (uint32_t)(off / 4);
	return (unsigned char)(word >> (8 * (off % 4)));
}

static int server(const char *host, const char *port, const char *mode)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fam = addr_of(host, port, &ss, &len);
	int one = 1;
	int l = socket(fam, SOCK_STREAM, 0);
	if (l < 0)
		die("socket");
	if (setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)))
		die("setsockopt SO_REUSEADDR");
	if (mode && !strcmp(mode, "dual")) {
		int zero = 0, got = 1;
		socklen_t gl = sizeof(got);
		if (setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)))
			die("setsockopt IPV6_V6ONLY");
		if (getsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &got, &gl) || got != 0)
			die("getsockopt IPV6_V6ONLY");
	}
	if (bind(l, (struct sockaddr *)&ss, len))
		die("bind");
	if (listen(l, 4))
		die("listen");
	printf("listening\n");
	fflush(stdout);
	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept");
	if (setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
		die("setsockopt TCP_NODELAY");
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);
	if (getpeername(c, (struct sockaddr *)&peer, &plen))
		die("getpeername");
	int use_poll = mode && !strcmp(mode, "poll");
	if (use_poll && fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK))
		die("fcntl");
	static unsigned char buf[200000];
	uint64_t total = 0, sum = 0xcbf29ce484222325ULL;
	for (;;) {
		if (use_poll) {
			struct pollfd p = {c, POLLIN, 0};
			if (poll(&p, 1, 30000) != 1)
				die("poll (in)");
		}
		ssize_t n = read(c, buf, sizeof(buf));
		if (n < 0 && errno == EAGAIN)
			continue;
		if (n < 0)
			die("read");
		if (n == 0)
			break;
		sum = fnv(sum, buf, (size_t)n);
		total += (uint64_t)n;
		for (ssize_t off = 0; off < n;) {
			if (use_poll) {
				struct pollfd p = {c, POLLOUT, 0};
				if (poll(&p, 1, 30000) != 1)
					die("poll (out)");
			}
			ssize_t w = write(c, buf + off, (size_t)(n - off));
			if (w < 0 && errno == EAGAIN)
				continue;
			if (w <= 0)
				die("write");
			off += w;
		}
	}
	printf("server bytes=%llu sum=%016llx\n", (unsigned long long)total, (unsigned long long)sum);
	if (close(c) || close(l))
		die("close");
	return 0;
}

static int client(const char *host, const char *port, uint64_t bytes, const char *mode)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fam = addr_of(host, port, &ss, &len);
	int use_select = mode && !strcmp(mode, "select");
	int s = socket(fam, SOCK_STREAM, 0);
	if (s < 0)
		die("socket");
	if (connect(s, (struct sockaddr *)&ss, len))
		die("connect");
	struct sockaddr_storage me;
	socklen_t mlen = sizeof(me);
	if (getsockname(s, (struct sockaddr *)&me, &mlen))
		die("getsockname");
	if (fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK))
		die("fcntl");
	if (!(fcntl(s, F_GETFL) & O_NONBLOCK)) {
		fprintf(stderr, "sv_rs_echo: O_NONBLOCK did not stick\n");
		return 1;
	}
	static unsigned char out[300000], in[300000];
	uint64_t sent = 0, got = 0, sum = 0xcbf29ce484222325ULL;
	uint32_t rnd = 12345;
	int shut = 0;
	while (got < bytes || !shut) {
		int want_out = sent < bytes;
		if (!want_out && !shut) {
			if (shutdown(s, SHUT_WR))
				die("shutdown");
			shut = 1;
			continue;
		}
		int r_in = 0, r_out = 0;
		if (use_select) {
			fd_set rd, wr;
			FD_ZERO(&rd);
			FD_ZERO(&wr);
			FD_SET(s, &rd);
			if (want_out)
				FD_SET(s, &wr);
			struct timeval tv = {30, 0};
			int r = select(s + 1, &rd, &wr, NULL, &tv);
			if (r <= 0)
				die("select");
			r_in = FD_ISSET(s, &rd);
			r_out = FD_ISSET(s, &wr);
		} else {
			struct pollfd p = {s, (short)(POLLIN | (want_out ? POLLOUT : 0)), 0};
			int r = poll(&p, 1, 30000);
			if (r != 1)
				die("poll");
			r_in = p.revents & (POLLIN | POLLHUP | POLLERR);
			r_out = p.revents & POLLOUT;
		}
		if (r_out && want_out) {
			rnd = rnd * 1103515245u + 12345u;
			size_t chunk = 1 + (rnd >> 8) % 150000;
			if (chunk > bytes - sent)
				chunk = (size_t)(bytes - sent);
			for (size_t i = 0; i < chunk; i++)
				out[i] = pattern(sent + i);
			ssize_t w = write(s, out, chunk);
			if (w < 0 && errno != EAGAIN)
				die("write");
			if (w > 0)
				sent += (uint64_t)w;
		}
		if (r_in) {
			ssize_t n = read(s, in, sizeof(in));
			if (n < 0 && errno != EAGAIN)
				die("read");
			if (n == 0) {
				if (got != bytes) {
					fprintf(stderr, "sv_rs_echo: end of file after %llu of %llu bytes\n",
						(unsigned long long)got, (unsigned long long)bytes);
					return 1;
				}
				break;
			}
			for (ssize_t i = 0; i < n; i++)
				if (in[i] != pattern(got + (uint64_t)i)) {
					fprintf(stderr, "sv_rs_echo: byte %llu is %#x, sent %#x\n",
						(unsigned long long)(got + (uint64_t)i), in[i],
						pattern(got + (uint64_t)i));
					return 1;
				}
			if (n > 0) {
				sum = fnv(sum, in, (size_t)n);
				got += (uint64_t)n;
			}
		}
	}
	// The server closes after the echo: end of file now.
	for (int tries = 0;; tries++) {
		struct pollfd p = {s, POLLIN, 0};
		if (poll(&p, 1, 30000) != 1)
			die("poll (eof)");
		ssize_t n = read(s, in, sizeof(in));
		if (n == 0)
			break;
		if (n < 0 && errno == EAGAIN && tries < 1000)
			continue;
		fprintf(stderr, "sv_rs_echo: expected end of file, read %zd\n", n);
		return 1;
	}
	printf("client bytes=%llu sum=%016llx\n", (unsigned long long)got, (unsigned long long)sum);
	if (close(s))
		die("close");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 4 && !strcmp(argv[1], "server"))
		return server(argv[2], argv[3], argc > 4 ? argv[4] : NULL);
	if (argc >= 5 && !strcmp(argv[1], "client"))
		return client(argv[2], argv[3], strtoull(argv[4], NULL, 0), argc > 5 ? argv[5] : NULL);
	fprintf(stderr, "usage: sv_rs_echo server ADDR PORT [block|poll]\n"
			"       sv_rs_echo client ADDR PORT BYTES [poll|select]\n");
	return 2;
}
