// SPDX-License-Identifier: MIT
/*
 * The kernel-facing half of rdma-core's libibverbs ABI.
 *
 * In rdma-core these functions marshal verbs into ib_uverbs write()/ioctl()
 * commands. softverbs has no kernel device, so the command family can only
 * fail cleanly; it exists because foreign providers (libmlx5.so.1,
 * libefa.so.1, pyverbs' provider modules) are linked against it and must
 * load with BIND_NOW even though they are never driven. The helpers that
 * have a meaning without a kernel (sysfs reads, uAPI struct conversion,
 * logging, command-buffer bookkeeping) are implemented for real.
 *
 * Self-contained on purpose: only public headers, with the provider-private
 * structs left incomplete, so this file does not track driver.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>

#define SV_EXPORT __attribute__((visibility("default")))

/* Provider-private objects (driver.h); only ever handled by pointer here. */
struct verbs_context;
struct verbs_counters;
struct verbs_cq;
struct verbs_dm;
struct verbs_flow_action;
struct verbs_mr;
struct verbs_qp;
struct verbs_srq;
struct verbs_sysfs_dev;
struct verbs_xrcd;

/* rdma-core's kern-abi.h command structs; only ever handled by pointer. */
struct ibv_alloc_mw;
struct ibv_alloc_pd;
struct ibv_create_cq;
struct ibv_create_cq_ex;
struct ibv_create_qp;
struct ibv_create_qp_ex;
struct ibv_create_srq;
struct ibv_create_wq;
struct ibv_create_xsrq;
struct ibv_get_context;
struct ibv_modify_cq;
struct ibv_modify_qp;
struct ibv_modify_qp_ex;
struct ibv_modify_srq;
struct ibv_modify_wq;
struct ibv_open_qp;
struct ibv_open_xrcd;
struct ibv_query_port;
struct ibv_query_qp;
struct ibv_query_srq;
struct ibv_reg_mr;
struct ibv_rereg_mr;
struct ibv_resize_cq;

/*
 * Layout of rdma-core 44's struct ibv_command_buffer (cmd_ioctl.h).
 * Providers build these on their stack through inline macros and hand us
 * the pointer, so the layout is part of the private ABI.
 */
struct ibv_command_buffer {
	struct ibv_command_buffer *next;
	struct ib_uverbs_attr *next_attr;
	struct ib_uverbs_attr *last_attr;
	uint8_t uhw_in_idx;
	uint8_t uhw_out_idx;
	uint8_t uhw_in_headroom_dwords;
	uint8_t uhw_out_headroom_dwords;
	uint8_t buffer_error : 1;
	uint8_t fallback_require_ex : 1;
	uint8_t fallback_ioctl_only : 1;
	struct ib_uverbs_ioctl_hdr hdr;
};

/*
 * Consulted by rdma-core only when a kernel destroy command fails with EIO
 * after a hot unplug. We issue no kernel commands, so it stays false, but
 * providers reference the variable and it must exist.
 */
SV_EXPORT bool verbs_allow_disassociate_destroy;

/*
 * rdma-core commands report failure as a positive errno return value; some
 * callers read errno instead, so set both.
 */
static int no_kernel(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* ------------------------------------------------------------------------
 * Command family: no kernel, no commands.
 * The parameter lists must match driver.h exactly, yet none is used.
 */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"

SV_EXPORT int execute_ioctl(struct ibv_context *context, struct ibv_command_buffer *cmd)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_get_context(struct verbs_context *context, struct ibv_get_context *cmd,
				  size_t cmd_size, struct ib_uverbs_get_context_resp *resp,
				  size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_query_context(struct ibv_context *ctx, struct ibv_command_buffer *driver)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_query_device_any(struct ibv_context *context,
				       const struct ibv_query_device_ex_input *input,
				       struct ibv_device_attr_ex *attr, size_t attr_size,
				       struct ib_uverbs_ex_query_device_resp *resp,
				       size_t *resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_query_port(struct ibv_context *context, uint8_t port_num,
				 struct ibv_port_attr *port_attr, struct ibv_query_port *cmd,
				 size_t cmd_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_alloc_pd(struct ibv_context *context, struct ibv_pd *pd,
			       struct ibv_alloc_pd *cmd, size_t cmd_size,
			       struct ib_uverbs_alloc_pd_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_dealloc_pd(struct ibv_pd *pd)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_open_xrcd(struct ibv_context *context, struct verbs_xrcd *xrcd,
				int vxrcd_size, struct ibv_xrcd_init_attr *attr,
				struct ibv_open_xrcd *cmd, size_t cmd_size,
				struct ib_uverbs_open_xrcd_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_close_xrcd(struct verbs_xrcd *xrcd)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va,
			     int access, struct verbs_mr *vmr, struct ibv_reg_mr *cmd,
			     size_t cmd_size, struct ib_uverbs_reg_mr_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_rereg_mr(struct verbs_mr *vmr, uint32_t flags, void *addr, size_t length,
			       uint64_t hca_va, int access, struct ibv_pd *pd,
			       struct ibv_rereg_mr *cmd, size_t cmd_sz,
			       struct ib_uverbs_rereg_mr_resp *resp, size_t resp_sz)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_dereg_mr(struct verbs_mr *vmr)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_query_mr(struct ibv_pd *pd, struct verbs_mr *vmr, uint32_t mr_handle)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
				struct ibv_sge *sg_list, uint32_t num_sge)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				    uint64_t iova, int fd, int access, struct verbs_mr *vmr)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type, struct ibv_mw *mw,
			       struct ibv_alloc_mw *cmd, size_t cmd_size,
			       struct ib_uverbs_alloc_mw_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_dealloc_mw(struct ibv_mw *mw)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_cq(struct ibv_context *context, int cqe,
				struct ibv_comp_channel *channel, int comp_vector,
				struct ibv_cq *cq, struct ibv_create_cq *cmd, size_t cmd_size,
				struct ib_uverbs_create_cq_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_cq_ex(struct ibv_context *context,
				   const struct ibv_cq_init_attr_ex *cq_attr, struct verbs_cq *cq,
				   struct ibv_create_cq_ex *cmd, size_t cmd_size,
				   struct ib_uverbs_ex_create_cq_resp *resp, size_t resp_size,
				   uint32_t cmd_flags)
{
	return no_kernel();
}

/* Returns a count, so failure is -1 with errno, as in rdma-core. */
SV_EXPORT int ibv_cmd_poll_cq(struct ibv_cq *cq, int ne, struct ibv_wc *wc)
{
	no_kernel();
	return -1;
}

SV_EXPORT int ibv_cmd_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_resize_cq(struct ibv_cq *cq, int cqe, struct ibv_resize_cq *cmd,
				size_t cmd_size, struct ib_uverbs_resize_cq_resp *resp,
				size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_destroy_cq(struct ibv_cq *cq)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_modify_cq(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr,
				struct ibv_modify_cq *cmd, size_t cmd_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_srq(struct ibv_pd *pd, struct ibv_srq *srq,
				 struct ibv_srq_init_attr *attr, struct ibv_create_srq *cmd,
				 size_t cmd_size, struct ib_uverbs_create_srq_resp *resp,
				 size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_srq_ex(struct ibv_context *context, struct verbs_srq *srq,
				    struct ibv_srq_init_attr_ex *attr_ex,
				    struct ibv_create_xsrq *cmd, size_t cmd_size,
				    struct ib_uverbs_create_srq_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
				 int srq_attr_mask, struct ibv_modify_srq *cmd, size_t cmd_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
				struct ibv_query_srq *cmd, size_t cmd_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_destroy_srq(struct ibv_srq *srq)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_qp(struct ibv_pd *pd, struct ibv_qp *qp, struct ibv_qp_init_attr *attr,
				struct ibv_create_qp *cmd, size_t cmd_size,
				struct ib_uverbs_create_qp_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_qp_ex(struct ibv_context *context, struct verbs_qp *qp,
				   struct ibv_qp_init_attr_ex *attr_ex, struct ibv_create_qp *cmd,
				   size_t cmd_size, struct ib_uverbs_create_qp_resp *resp,
				   size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_qp_ex2(struct ibv_context *context, struct verbs_qp *qp,
				    struct ibv_qp_init_attr_ex *qp_attr,
				    struct ibv_create_qp_ex *cmd, size_t cmd_size,
				    struct ib_uverbs_ex_create_qp_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_open_qp(struct ibv_context *context, struct verbs_qp *qp, int vqp_sz,
			      struct ibv_qp_open_attr *attr, struct ibv_open_qp *cmd,
			      size_t cmd_size, struct ib_uverbs_create_qp_resp *resp,
			      size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *qp_attr, int attr_mask,
			       struct ibv_qp_init_attr *qp_init_attr, struct ibv_query_qp *cmd,
			       size_t cmd_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
				struct ibv_modify_qp *cmd, size_t cmd_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_modify_qp_ex(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
				   struct ibv_modify_qp_ex *cmd, size_t cmd_size,
				   struct ib_uverbs_ex_modify_qp_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_destroy_qp(struct ibv_qp *qp)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
				struct ibv_send_wr **bad_wr)
{
	*bad_wr = wr;
	return no_kernel();
}

SV_EXPORT int ibv_cmd_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
				struct ibv_recv_wr **bad_wr)
{
	*bad_wr = wr;
	return no_kernel();
}

SV_EXPORT int ibv_cmd_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
				    struct ibv_recv_wr **bad_wr)
{
	*bad_wr = wr;
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_ah(struct ibv_pd *pd, struct ibv_ah *ah, struct ibv_ah_attr *attr,
				struct ib_uverbs_create_ah_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_destroy_ah(struct ibv_ah *ah)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_flow(struct ibv_qp *qp, struct ibv_flow *flow_id,
				  struct ibv_flow_attr *flow_attr, void *ucmd, size_t ucmd_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_destroy_flow(struct ibv_flow *flow_id)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_flow_action_esp(struct ibv_context *ctx,
					     struct ibv_flow_action_esp_attr *attr,
					     struct verbs_flow_action *flow_action,
					     struct ibv_command_buffer *driver)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_modify_flow_action_esp(struct verbs_flow_action *flow_action,
					     struct ibv_flow_action_esp_attr *attr,
					     struct ibv_command_buffer *driver)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_destroy_flow_action(struct verbs_flow_action *action)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_wq(struct ibv_context *context, struct ibv_wq_init_attr *wq_init_attr,
				struct ibv_wq *wq, struct ibv_create_wq *cmd, size_t cmd_size,
				struct ib_uverbs_ex_create_wq_resp *resp, size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_modify_wq(struct ibv_wq *wq, struct ibv_wq_attr *attr,
				struct ibv_modify_wq *cmd, size_t cmd_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_destroy_wq(struct ibv_wq *wq)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_rwq_ind_table(struct ibv_context *context,
					   struct ibv_rwq_ind_table_init_attr *init_attr,
					   struct ibv_rwq_ind_table *rwq_ind_table,
					   struct ib_uverbs_ex_create_rwq_ind_table_resp *resp,
					   size_t resp_size)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_destroy_rwq_ind_table(struct ibv_rwq_ind_table *rwq_ind_table)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_create_counters(struct ibv_context *context,
				      struct ibv_counters_init_attr *init_attr,
				      struct verbs_counters *vcounters,
				      struct ibv_command_buffer *link)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_destroy_counters(struct verbs_counters *vcounters)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_read_counters(struct verbs_counters *vcounters, uint64_t *counters_value,
				    uint32_t ncounters, uint32_t flags,
				    struct ibv_command_buffer *link)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_alloc_dm(struct ibv_context *ctx, const struct ibv_alloc_dm_attr *dm_attr,
			       struct verbs_dm *dm, struct ibv_command_buffer *link)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_free_dm(struct verbs_dm *dm)
{
	return no_kernel();
}

SV_EXPORT int ibv_cmd_reg_dm_mr(struct ibv_pd *pd, struct verbs_dm *dm, uint64_t offset,
				size_t length, unsigned int access, struct verbs_mr *vmr,
				struct ibv_command_buffer *link)
{
	return no_kernel();
}

#pragma GCC diagnostic pop

/* ------------------------------------------------------------------------
 * Provider helpers that mean something without a kernel.
 */

/*
 * Total attributes in a chain of command buffers: what a provider's
 * on-stack buffer must hold to linearize the chain for one ioctl.
 */
SV_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs,
					       struct ibv_command_buffer *link)
{
	for (; link; link = link->next)
		num_attrs += link->next_attr - link->hdr.attrs;
	return num_attrs;
}

/*
 * rdma-core's VERBS_LOG_LEVEL / VERBS_LOG_FILE contract, except that with no
 * file named we log to stderr: with no kernel logs to fall back on, losing a
 * provider's messages helps no one.
 */
static uint32_t verbs_log_level;
static FILE *verbs_log_fp;
static pthread_once_t verbs_log_once = PTHREAD_ONCE_INIT;

static void verbs_log_init(void)
{
	const char *env = getenv("VERBS_LOG_LEVEL");

	if (env)
		verbs_log_level = strtoul(env, NULL, 0);
	if (!verbs_log_level)
		return;

	env = secure_getenv("VERBS_LOG_FILE");
	if (env)
		verbs_log_fp = fopen(env, "ae");
	if (!verbs_log_fp)
		verbs_log_fp = stderr;
}

SV_EXPORT __attribute__((format(printf, 3, 4))) void
__verbs_log(struct verbs_context *ctx, uint32_t level, const char *fmt, ...)
{
	int saved_errno = errno;
	va_list args;

	(void)ctx;
	pthread_once(&verbs_log_once, verbs_log_init);
	if (level <= verbs_log_level && verbs_log_fp) {
		va_start(args, fmt);
		vfprintf(verbs_log_fp, fmt, args);
		va_end(args);
	}
	/* Callers log from error paths and then return errno. */
	errno = saved_errno;
}

/*
 * Providers open a device with private data through this (mlx5dv_open_device
 * and friends). Without private data it is exactly ibv_open_device; with it,
 * the data is meant for a foreign provider's alloc_context, and foreign
 * providers are never driven here.
 */
SV_EXPORT struct ibv_context *verbs_open_device(struct ibv_device *device, void *private_data)
{
	if (private_data) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return ibv_open_device(device);
}

/*
 * The legacy (pre rdma-core 13) driver entry point. Old libfabric usnic
 * providers call it only to silence an old libibverbs warning, so it must
 * exist; drivers of that interface cannot be loaded by any modern libibverbs.
 */
typedef struct ibv_device *(*ibv_driver_init_func_1_1)(const char *sysfs_path, int abi_version);

SV_EXPORT void ibv_register_driver_1_1(const char *name, ibv_driver_init_func_1_1 init_func)
{
	static bool warned;

	(void)init_func;
	if (!__atomic_exchange_n(&warned, true, __ATOMIC_RELAXED))
		fprintf(stderr,
			"libibverbs: ignoring legacy driver '%s' registered "
			"through ibv_register_driver()\n",
			name ? name : "(null)");
}
__asm__(".symver ibv_register_driver_1_1, ibv_register_driver@IBVERBS_1.1");

/* ------------------------------------------------------------------------
 * sysfs helpers (IBVERBS_1.0, still used by librdmacm and ibv_devinfo).
 */

static const char *sysfs_path;
static pthread_once_t sysfs_path_once = PTHREAD_ONCE_INIT;

static void sysfs_path_init(void)
{
	/* secure_getenv: a setuid program must not be pointed elsewhere. */
	const char *env = secure_getenv("SYSFS_PATH");
	char *dup;
	size_t len;

	sysfs_path = "/sys";
	if (!env)
		return;
	dup = strndup(env, IBV_SYSFS_PATH_MAX);
	if (!dup)
		return;
	len = strlen(dup);
	while (len > 0 && dup[len - 1] == '/')
		dup[--len] = '\0';
	sysfs_path = dup;
}

SV_EXPORT const char *ibv_get_sysfs_path(void)
{
	pthread_once(&sysfs_path_once, sysfs_path_init);
	return sysfs_path;
}

/*
 * Returns the length read with a trailing newline stripped and the buffer
 * NUL-terminated, or -1 with errno set. Content that fills the buffer
 * without a newline would be truncated, so it is refused.
 */
SV_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char *path;
	ssize_t len;
	int fd;

	if (!dir || !file || !buf || !size) {
		errno = EINVAL;
		return -1;
	}
	if (asprintf(&path, "%s/%s", dir, file) < 0)
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return -1;
	len = read(fd, buf, size);
	close(fd);
	if (len < 0)
		return -1;

	if (len > 0 && buf[len - 1] == '\n')
		buf[--len] = '\0';
	else if ((size_t)len < size)
		buf[len] = '\0';
	else {
		errno = EOVERFLOW;
		return -1;
	}
	return (int)len;
}

/*
 * Reads a file under a kernel device's sysfs directory. The emulated
 * device has none; the only callers are kernel-backed providers, which
 * are never driven here.
 */
SV_EXPORT __attribute__((format(printf, 4, 5))) int
ibv_read_ibdev_sysfs_file(char *buf, size_t size, struct verbs_sysfs_dev *sysfs_dev,
			  const char *fnfmt, ...)
{
	(void)buf;
	(void)size;
	(void)fnfmt;
	errno = sysfs_dev ? ENOENT : EINVAL;
	return -1;
}

/* ------------------------------------------------------------------------
 * uAPI struct conversion (historical exports, used by librdmacm).
 * Field by field: the kernel structs pack differently from the verbs ones.
 */

SV_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src)
{
	memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid.raw));
	dst->grh.flow_label = src->grh.flow_label;
	dst->grh.sgid_index = src->grh.sgid_index;
	dst->grh.hop_limit = src->grh.hop_limit;
	dst->grh.traffic_class = src->grh.traffic_class;
	dst->dlid = src->dlid;
	dst->sl = src->sl;
	dst->src_path_bits = src->src_path_bits;
	dst->static_rate = src->static_rate;
	dst->is_global = src->is_global;
	dst->port_num = src->port_num;
}

SV_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)
{
	dst->cur_qp_state = src->cur_qp_state;
	dst->path_mtu = src->path_mtu;
	dst->path_mig_state = src->path_mig_state;
	dst->qkey = src->qkey;
	dst->rq_psn = src->rq_psn;
	dst->sq_psn = src->sq_psn;
	dst->dest_qp_num = src->dest_qp_num;
	dst->qp_access_flags = src->qp_access_flags;

	dst->cap.max_send_wr = src->max_send_wr;
	dst->cap.max_recv_wr = src->max_recv_wr;
	dst->cap.max_send_sge = src->max_send_sge;
	dst->cap.max_recv_sge = src->max_recv_sge;
	dst->cap.max_inline_data = src->max_inline_data;

	ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
	ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);

	dst->pkey_index = src->pkey_index;
	dst->alt_pkey_index = src->alt_pkey_index;
	dst->en_sqd_async_notify = src->en_sqd_async_notify;
	dst->sq_draining = src->sq_draining;
	dst->max_rd_atomic = src->max_rd_atomic;
	dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
	dst->min_rnr_timer = src->min_rnr_timer;
	dst->port_num = src->port_num;
	dst->timeout = src->timeout;
	dst->retry_cnt = src->retry_cnt;
	dst->rnr_retry = src->rnr_retry;
	dst->alt_port_num = src->alt_port_num;
	dst->alt_timeout = src->alt_timeout;
}

SV_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst,
					   struct ib_user_path_rec *src)
{
	memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid.raw));
	memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid.raw));
	dst->dlid = src->dlid;
	dst->slid = src->slid;
	dst->raw_traffic = src->raw_traffic;
	dst->flow_label = src->flow_label;
	dst->hop_limit = src->hop_limit;
	dst->traffic_class = src->traffic_class;
	dst->reversible = src->reversible;
	dst->numb_path = src->numb_path;
	dst->pkey = src->pkey;
	dst->sl = src->sl;
	dst->mtu_selector = src->mtu_selector;
	dst->mtu = src->mtu;
	dst->rate_selector = src->rate_selector;
	dst->rate = src->rate;
	dst->packet_life_time = src->packet_life_time;
	dst->preference = src->preference;
	dst->packet_life_time_selector = src->packet_life_time_selector;
}

SV_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src)
{
	memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
	memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
	dst->dlid = src->dlid;
	dst->slid = src->slid;
	dst->raw_traffic = src->raw_traffic;
	dst->flow_label = src->flow_label;
	dst->hop_limit = src->hop_limit;
	dst->traffic_class = src->traffic_class;
	dst->reversible = src->reversible;
	dst->numb_path = src->numb_path;
	dst->pkey = src->pkey;
	dst->sl = src->sl;
	dst->mtu_selector = src->mtu_selector;
	dst->mtu = src->mtu;
	dst->rate_selector = src->rate_selector;
	dst->rate = src->rate;
	dst->packet_life_time = src->packet_life_time;
	dst->preference = src->preference;
	dst->packet_life_time_selector = src->packet_life_time_selector;
}
