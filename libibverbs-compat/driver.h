/* SPDX-License-Identifier: MIT */
/*
 * The provider interface of softverbs' libibverbs.so.1.
 *
 * Names follow rdma-core's libibverbs/driver.h so that anybody who wrote an
 * rdma-core provider feels at home: a provider fills a verbs_device_ops and a
 * verbs_context_ops, embeds verbs_device / verbs_context / verbs_qp / ... as
 * the first member of its own objects and registers with
 * verbs_register_driver_34().  verbs_device_ops keeps rdma-core 34's layout
 * because foreign providers (libmlx5.so.1 loaded beside perftest) register
 * themselves from a constructor; they are recorded and never driven.
 *
 * Difference from rdma-core: devices do not come from sysfs.  A softverbs
 * provider also registers a verbs_provider_sv whose enumerate() lists the
 * devices it serves; each becomes a verbs_sysfs_dev handed to alloc_device().
 */
#ifndef SOFTVERBS_DRIVER_H
#define SOFTVERBS_DRIVER_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SV_EXPORT __attribute__((visibility("default")))

/*
 * verbs.h turns some verbs into macros over inline helpers; the library
 * defines the real functions under their exported names.
 */
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

enum ibv_gid_type_sysfs {
	IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
	IBV_GID_TYPE_SYSFS_ROCE_V2,
};

SV_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num,
				 unsigned int index, enum ibv_gid_type_sysfs *type);

struct verbs_match_ent {
	void *driver_data;
	union {
		const char *modalias;
		uint64_t driver_id;
	} u;
	uint16_t vendor;
	uint16_t device;
	uint8_t kind;
};

/* Our stand-in for a sysfs device: what enumerate() reports. */
struct verbs_sysfs_dev {
	void *provider_data;
	const struct verbs_match_ent *match;
	unsigned int flags;
	char sysfs_name[IBV_SYSFS_NAME_MAX];
	dev_t sysfs_cdev;
	char ibdev_name[IBV_SYSFS_NAME_MAX];
	char ibdev_path[IBV_SYSFS_PATH_MAX];
	char modalias[512];
	uint64_t node_guid;
	uint32_t driver_id;
	enum ibv_node_type node_type;
	int ibdev_idx;
	uint32_t num_ports;
	uint32_t abi_ver;
	struct timespec time_created;
};

struct verbs_device;
struct softverbs_fast_reg_wr;
struct softverbs_dv_sq;
struct softverbs_dv_cq;

struct verbs_device_ops {
	const char *name;
	uint32_t match_min_abi_version;
	uint32_t match_max_abi_version;
	const struct verbs_match_ent *match_table;
	const struct verbs_device_ops **static_providers;
	bool (*match_device)(struct verbs_sysfs_dev *sysfs_dev);
	struct verbs_context *(*alloc_context)(struct ibv_device *device, int cmd_fd,
					       void *private_data);
	struct verbs_context *(*import_context)(struct ibv_device *device, int cmd_fd);
	struct verbs_device *(*alloc_device)(struct verbs_sysfs_dev *sysfs_dev);
	void (*uninit_device)(struct verbs_device *device);
};

struct verbs_device {
	struct ibv_device device; /* Must be first */
	const struct verbs_device_ops *ops;
	int refcount;		  /* Only touched under the core's device-list lock */
	struct verbs_sysfs_dev *sysfs;
	uint64_t core_support;
};

/*
 * softverbs' discovery hook.  enumerate() fills at most max entries and
 * returns how many devices exist (which may exceed max) or -errno.
 */
struct verbs_provider_sv {
	const struct verbs_device_ops *ops;
	int (*enumerate)(struct verbs_sysfs_dev *devs, int max);
};

enum verbs_qp_mask {
	VERBS_QP_XRCD = 1 << 0,
	VERBS_QP_EX = 1 << 1,
};

struct verbs_qp {
	union {
		struct ibv_qp qp;
		struct ibv_qp_ex qp_ex;
	};
	uint32_t comp_mask;
	struct verbs_xrcd *xrcd;
};

struct verbs_cq {
	union {
		struct ibv_cq cq;
		struct ibv_cq_ex cq_ex;
	};
};

enum verbs_srq_mask {
	VERBS_SRQ_TYPE = 1 << 0,
	VERBS_SRQ_XRCD = 1 << 1,
	VERBS_SRQ_CQ = 1 << 2,
	VERBS_SRQ_NUM = 1 << 3,
};

struct verbs_srq {
	struct ibv_srq srq;
	enum ibv_srq_type srq_type;
	struct verbs_xrcd *xrcd;
	struct ibv_cq *cq;
	uint32_t srq_num;
};

struct verbs_xrcd {
	struct ibv_xrcd xrcd;
	uint32_t comp_mask;
	uint32_t handle;
};

enum ibv_mr_type {
	IBV_MR_TYPE_MR,
	IBV_MR_TYPE_NULL_MR,
	IBV_MR_TYPE_IMPORTED_MR,
	IBV_MR_TYPE_DMABUF_MR,
};

struct verbs_mr {
	struct ibv_mr ibv_mr;
	enum ibv_mr_type mr_type;
	int access;
};

/* The operations a provider implements; anything left NULL answers EOPNOTSUPP. */
struct verbs_context_ops {
	int (*advise_mr)(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
			 struct ibv_sge *sg_list, uint32_t num_sges);
	struct ibv_dm *(*alloc_dm)(struct ibv_context *context, struct ibv_alloc_dm_attr *attr);
	struct ibv_mw *(*alloc_mw)(struct ibv_pd *pd, enum ibv_mw_type type);
	struct ibv_mr *(*alloc_null_mr)(struct ibv_pd *pd);
	struct ibv_pd *(*alloc_parent_domain)(struct ibv_context *context,
					      struct ibv_parent_domain_init_attr *attr);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
	struct ibv_td *(*alloc_td)(struct ibv_context *context, struct ibv_td_init_attr *init_attr);
	void (*async_event)(struct ibv_context *context, struct ibv_async_event *event);
	int (*attach_counters_point_flow)(struct ibv_counters *counters,
					  struct ibv_counter_attach_attr *attr, struct ibv_flow *flow);
	int (*attach_mcast)(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid);
	int (*bind_mw)(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind);
	int (*close_xrcd)(struct ibv_xrcd *xrcd);
	void (*cq_event)(struct ibv_cq *cq);
	struct ibv_ah *(*create_ah)(struct ibv_pd *pd, struct ibv_ah_attr *attr);
	struct ibv_counters *(*create_counters)(struct ibv_context *context,
						struct ibv_counters_init_attr *init_attr);
	struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe,
				    struct ibv_comp_channel *channel, int comp_vector);
	struct ibv_cq_ex *(*create_cq_ex)(struct ibv_context *context,
					  struct ibv_cq_init_attr_ex *init_attr);
	struct ibv_flow *(*create_flow)(struct ibv_qp *qp, struct ibv_flow_attr *flow_attr);
	struct ibv_flow_action *(*create_flow_action_esp)(struct ibv_context *context,
							  struct ibv_flow_action_esp_attr *attr);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	struct ibv_qp *(*create_qp_ex)(struct ibv_context *context,
				       struct ibv_qp_init_attr_ex *qp_init_attr_ex);
	struct ibv_rwq_ind_table *(*create_rwq_ind_table)(
		struct ibv_context *context, struct ibv_rwq_ind_table_init_attr *init_attr);
	struct ibv_srq *(*create_srq)(struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr);
	struct ibv_srq *(*create_srq_ex)(struct ibv_context *context,
					 struct ibv_srq_init_attr_ex *srq_init_attr_ex);
	struct ibv_wq *(*create_wq)(struct ibv_context *context,
				    struct ibv_wq_init_attr *wq_init_attr);
	int (*dealloc_mw)(struct ibv_mw *mw);
	int (*dealloc_pd)(struct ibv_pd *pd);
	int (*dealloc_td)(struct ibv_td *td);
	int (*dereg_mr)(struct verbs_mr *vmr);
	int (*destroy_ah)(struct ibv_ah *ah);
	int (*destroy_counters)(struct ibv_counters *counters);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*destroy_flow)(struct ibv_flow *flow);
	int (*destroy_flow_action)(struct ibv_flow_action *action);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*destroy_rwq_ind_table)(struct ibv_rwq_ind_table *rwq_ind_table);
	int (*destroy_srq)(struct ibv_srq *srq);
	int (*destroy_wq)(struct ibv_wq *wq);
	int (*detach_mcast)(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid);
	void (*free_context)(struct ibv_context *context);
	int (*free_dm)(struct ibv_dm *dm);
	/*
	 * softverbs: the provider owns the async event source, so it reads and
	 * validates events itself (rdma-core reads a kernel fd in the core).
	 */
	int (*get_async_event)(struct ibv_context *context, struct ibv_async_event *event);
	int (*get_srq_num)(struct ibv_srq *srq, uint32_t *srq_num);
	struct ibv_dm *(*import_dm)(struct ibv_context *context, uint32_t dm_handle);
	struct ibv_mr *(*import_mr)(struct ibv_pd *pd, uint32_t mr_handle);
	struct ibv_pd *(*import_pd)(struct ibv_context *context, uint32_t pd_handle);
	int (*modify_cq)(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr);
	int (*modify_flow_action_esp)(struct ibv_flow_action *action,
				      struct ibv_flow_action_esp_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
	int (*modify_qp_rate_limit)(struct ibv_qp *qp, struct ibv_qp_rate_limit_attr *attr);
	int (*modify_srq)(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask);
	int (*modify_wq)(struct ibv_wq *wq, struct ibv_wq_attr *wq_attr);
	struct ibv_qp *(*open_qp)(struct ibv_context *context, struct ibv_qp_open_attr *attr);
	struct ibv_xrcd *(*open_xrcd)(struct ibv_context *context,
				      struct ibv_xrcd_init_attr *xrcd_init_attr);
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
	int (*post_srq_ops)(struct ibv_srq *srq, struct ibv_ops_wr *op, struct ibv_ops_wr **bad_op);
	int (*post_srq_recv)(struct ibv_srq *srq, struct ibv_recv_wr *recv_wr,
			     struct ibv_recv_wr **bad_recv_wr);
	int (*query_device_ex)(struct ibv_context *context,
			       const struct ibv_query_device_ex_input *input,
			       struct ibv_device_attr_ex *attr, size_t attr_size);
	int (*query_ece)(struct ibv_qp *qp, struct ibv_ece *ece);
	int (*query_gid_ex)(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
			    struct ibv_gid_entry *entry, uint32_t flags);
	int (*query_pkey)(struct ibv_context *context, uint8_t port_num, int index,
			  __be16 *pkey);
	int (*query_port)(struct ibv_context *context, uint8_t port_num,
			  struct ibv_port_attr *port_attr);
	int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
			struct ibv_qp_init_attr *init_attr);
	int (*query_qp_data_in_order)(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags);
	int (*query_rt_values)(struct ibv_context *context, struct ibv_values_ex *values);
	int (*query_srq)(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr);
	int (*read_counters)(struct ibv_counters *counters, uint64_t *counters_value,
			     uint32_t ncounters, uint32_t flags);
	struct ibv_mr *(*reg_dm_mr)(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t dm_offset,
				    size_t length, unsigned int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length,
					uint64_t iova, int fd, int access);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va,
				 int access);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
	int (*rereg_mr)(struct verbs_mr *vmr, int flags, struct ibv_pd *pd, void *addr,
			size_t length, int access);
	int (*resize_cq)(struct ibv_cq *cq, int cqe);
	int (*set_ece)(struct ibv_qp *qp, struct ibv_ece *ece);
	void (*unimport_dm)(struct ibv_dm *dm);
	void (*unimport_mr)(struct ibv_mr *mr);
	void (*unimport_pd)(struct ibv_pd *pd);

	/* softverbs extensions, reached from <infiniband/softverbs_dv.h>. */
	struct ibv_mr *(*sv_reg_mr_fd)(struct ibv_pd *pd, int fd, int fd_type, uint64_t offset,
				       size_t length, uint64_t iova, unsigned int access);
	int (*sv_rereg_mr_fd)(struct ibv_mr *mr, int flags, struct ibv_pd *pd, int fd,
			      int fd_type, uint64_t offset, size_t length, uint64_t iova,
			      unsigned int access);
	struct ibv_mr *(*sv_alloc_fast_reg_mr)(struct ibv_pd *pd, uint32_t max_pages);
	int (*sv_post_fast_reg)(struct ibv_qp *qp, const struct softverbs_fast_reg_wr *wr);
	int (*sv_dv_qp_agent)(struct ibv_qp *qp, int on, struct softverbs_dv_sq *sq);
	int (*sv_dv_cq_agent)(struct ibv_cq *cq, int on, struct softverbs_dv_cq *cq_out);
	int (*sv_dv_alloc_fd)(struct ibv_pd *pd, void *addr, size_t len, int fd, uint64_t offset);
	int (*sv_dv_qp_rq)(struct ibv_qp *qp, int on, struct softverbs_dv_rq *rq);
};

/* Registration, called from a provider's constructor. */
SV_EXPORT void verbs_register_driver_34(const struct verbs_device_ops *ops);
SV_EXPORT void verbs_register_provider_sv(const struct verbs_provider_sv *provider);

/* Context life cycle, as in rdma-core. */
SV_EXPORT void *_verbs_init_and_alloc_context(struct ibv_device *device, int cmd_fd,
					      size_t alloc_size,
					      struct verbs_context *context_offset,
					      uint32_t driver_id);
#define verbs_init_and_alloc_context(ibdev, cmd_fd, drv_ctx_ptr, ctx_memb, driver_id)          \
	((__typeof__(drv_ctx_ptr))_verbs_init_and_alloc_context(                               \
		ibdev, cmd_fd, sizeof(*drv_ctx_ptr),                                           \
		&((__typeof__(drv_ctx_ptr))NULL)->ctx_memb, (driver_id)))
SV_EXPORT void verbs_uninit_context(struct verbs_context *context);
SV_EXPORT void verbs_set_ops(struct verbs_context *vctx, const struct verbs_context_ops *ops);
SV_EXPORT void verbs_init_cq(struct ibv_cq *cq, struct ibv_context *context,
			     struct ibv_comp_channel *channel, void *cq_context);

/*
 * Completion channels are owned by the core: an AF_UNIX datagram socket with
 * an abstract address.  Whoever raises a completion event on a CQ (any
 * process of the fabric) sends the CQ's 64-bit cookie to that address.
 * verbs_comp_channel_address() gives the provider the address to publish and
 * verbs_comp_channel_cookie() the cookie the core will accept for this CQ.
 */
#define VERBS_CHANNEL_ADDR_MAX 108
SV_EXPORT int verbs_comp_channel_address(struct ibv_comp_channel *channel, char *addr,
					 size_t *addr_len);
SV_EXPORT uint64_t verbs_comp_channel_cookie(struct ibv_cq *cq);
/*
 * The datagram is a doorbell the socket may refuse (a full queue).  A
 * provider that counts such refused events in a word of its own (in shared
 * memory, incremented by whoever was refused) names the word here, after
 * verbs_comp_channel_cookie() and again whenever it moves (NULL: none);
 * ibv_get_cq_event takes the count with an atomic exchange and hands out
 * that many events for the CQ.  The word must stay mapped until the next
 * call or until verbs_cq_wait_events() for the CQ.
 */
SV_EXPORT void verbs_comp_channel_lost_word(struct ibv_cq *cq, uint32_t *word);
/* 0 if channel is a live completion channel of context, else EINVAL. */
SV_EXPORT int verbs_comp_channel_check(struct ibv_comp_channel *channel,
				       struct ibv_context *context);
/*
 * For a provider's destroy_cq, once it knows the CQ will go: no event is
 * delivered for cq any more, and the call blocks until the application has
 * acknowledged every completion and async event it got for it (as
 * rdma-core's ibv_cmd_destroy_cq), warning under SOFTVERBS_DEBUG.
 */
SV_EXPORT void verbs_cq_wait_events(struct ibv_cq *cq);
/* The same for the async events of a QP or an SRQ (ibv_ack_async_event). */
SV_EXPORT void verbs_qp_wait_events(struct ibv_qp *qp);
SV_EXPORT void verbs_srq_wait_events(struct ibv_srq *srq);

static inline struct verbs_device *verbs_get_device(const struct ibv_device *dev)
{
	return (struct verbs_device *)dev;
}

#ifdef __cplusplus
}
#endif

#endif
