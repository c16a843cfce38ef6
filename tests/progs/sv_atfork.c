// SPDX-License-Identifier: MIT
/*
 * sv_atfork: verbs called from another library's pthread_atfork prepare
 * handler, as UCX's registration cache deregisters its MRs before a fork
 * (UCX_IB_RCACHE_PURGE_ON_FORK, on by default).  Before, the process hung
 * inside fork(): our prepare handler held the remap lock that the
 * deregistration then took (a helper's probe, with Open MPI over UCX).
 *
 *   sv_atfork ORDER OP
 *     ORDER early: the handler is registered before libibverbs is loaded
 *                  (dlopen'ed after), so it runs after ours;
 *           late:  registered after, so it runs before ours.
 *     OP    dereg: the handler deregisters MR b; reg: it registers c;
 *           childdereg: a child handler deregisters the inherited MR b (in
 *           the child, before our child handler when early: the parent's
 *           memory must stay as it is).
 *
 * Then: fork returns in both processes, the verb in the handler succeeded,
 * and registered memory keeps rdma-core's copy-on-fork semantics: the child
 * sees a's bytes as at the fork and its writes stay its own.  Prints
 * "OK sv_atfork ORDER OP".  The library comes from LD_LIBRARY_PATH.
 */
#include <infiniband/verbs.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN (1 << 20)

static struct ibv_device **(*get_list)(int *);
static struct ibv_context *(*open_dev)(struct ibv_device *);
static struct ibv_pd *(*alloc_pd)(struct ibv_context *);
static struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
static int (*dereg_mr)(struct ibv_mr *);

static struct ibv_pd *pd;
static struct ibv_mr *mr_b, *mr_c;
static char *buf_c;
static int op_reg, op_child, handler_rc = -1;

#define FAIL(...)                                                                  \
	do {                                                                       \
		fprintf(stderr, "FAIL sv_atfork: " __VA_ARGS__);                   \
		fputc('\n', stderr);                                               \
		exit(1);                                                           \
	} while (0)

static void child(void)
{
	/* In the child: only the child's verbs, the parent unaffected */
	if (op_child && pd && mr_b) {
		if (dereg_mr(mr_b))
			_exit(4);
		mr_b = NULL;
	}
}

static void prepare(void)
{
	if (!pd || op_child) {
		handler_rc = 0;
		return;
	}
	if (op_reg) {
		mr_c = reg_mr(pd, buf_c, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		handler_rc = mr_c ? 0 : 1;
	} else {
		handler_rc = dereg_mr(mr_b);
		mr_b = NULL;
	}
}

static void load(void)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!h)
		FAIL("dlopen: %s", dlerror());
	get_list = (struct ibv_device * *(*)(int *))dlsym(h, "ibv_get_device_list");
	open_dev = (struct ibv_context * (*)(struct ibv_device *)) dlsym(h, "ibv_open_device");
	alloc_pd = (struct ibv_pd * (*)(struct ibv_context *)) dlsym(h, "ibv_alloc_pd");
	/* The versioned symbols rdma-core's headers bind to */
	reg_mr = (struct ibv_mr * (*)(struct ibv_pd *, void *, size_t, int))
		dlvsym(h, "ibv_reg_mr", "IBVERBS_1.1");
	dereg_mr = (int (*)(struct ibv_mr *))dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.1");
	if (!get_list || !open_dev || !alloc_pd || !reg_mr || !dereg_mr)
		FAIL("dlsym");
}

static char *region(int fill)
{
	char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		FAIL("mmap");
	memset(p, fill, LEN);
	return p;
}

static int all(const char *p, int v)
{
	for (size_t i = 0; i < LEN; i++)
		if (p[i] != (char)v)
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[1], "early") && strcmp(argv[1], "late")) ||
	    (strcmp(argv[2], "dereg") && strcmp(argv[2], "reg") && strcmp(argv[2], "childdereg")))
		FAIL("usage: sv_atfork early|late dereg|reg|childdereg");
	int early = !strcmp(argv[1], "early");
	op_reg = !strcmp(argv[2], "reg");
	op_child = !strcmp(argv[2], "childdereg");
	alarm(60); /* A hang in fork() fails, it does not hold CI */
	if (early && pthread_atfork(prepare, NULL, child))
		FAIL("pthread_atfork");
	load();
	if (!early && pthread_atfork(prepare, NULL, child))
		FAIL("pthread_atfork");
	int n = 0;
	struct ibv_device **l = get_list(&n);
	if (!l || !n)
		FAIL("no device");
	struct ibv_context *ctx = open_dev(l[0]);
	struct ibv_pd *p = ctx ? alloc_pd(ctx) : NULL;
	if (!p)
		FAIL("open/alloc_pd");
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	char *a = region(0x11), *b = region(0x22);
	buf_c = region(0x33);
	struct ibv_mr *mr_a = reg_mr(p, a, LEN, acc);
	mr_b = reg_mr(p, b, LEN, acc);
	if (!mr_a || !mr_b)
		FAIL("reg_mr");
	pd = p;
	pid_t c = fork();
	if (c < 0)
		FAIL("fork");
	if (c == 0) {
		/* The child: memory as at the fork, and its own from now on */
		if (!all(a, 0x11) || !all(b, 0x22) || !all(buf_c, 0x33))
			_exit(3);
		if (op_child && mr_b)
			_exit(5); /* The child handler did not run */
		memset(a, 0x44, LEN);
		memset(b, 0x55, LEN);
		_exit(0);
	}
	int st = 0;
	if (waitpid(c, &st, 0) != c)
		FAIL("waitpid");
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		FAIL("child status %#x", st);
	if (handler_rc)
		FAIL("the verb in the prepare handler failed (%d)", handler_rc);
	/* The child's writes are not ours */
	if (!all(a, 0x11) || !all(b, 0x22))
		FAIL("the child's writes reached the parent's memory");
	if (mr_c && dereg_mr(mr_c))
		FAIL("dereg c");
	if (dereg_mr(mr_a))
		FAIL("dereg a");
	printf("OK sv_atfork %s %s\n", argv[1], argv[2]);
	return 0;
}
