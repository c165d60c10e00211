/* Test-only control interface of softverbs (libmc_softverbs.so), the
 * software STAND-IN for RDMA hardware. Nothing here exists on real
 * hardware: tests resolve these functions with dlsym() on the library
 * handle (mcrs::ibv::VerbsLibrary::symbol) and must not link against them.
 *
 * Device configuration: env MC_SOFTVERBS_DEVICES, read on first use (or
 * mc_softverbs_configure). Comma-separated devices, each
 *     name:ib|roce[:key=value]...
 * e.g. "sv0:ib:numa=0,sv1:roce:numa=1,sv2:roce:numa=0:gids=4".
 * Keys (all optional):
 *   numa=N          NUMA node in the fake sysfs (-1 allowed; default 0)
 *   pci=D:B:S.F     PCI bus id (default 0000:XX:00.0, XX = 0x10 + index)
 *   bridge=D:B:S.F  the function sits behind this (fake) bridge:
 *                   devices/pci0000:00/<bridge>/<pci> (default: no bridge)
 *   gids=N          populated GID entries, 1..16 (default: ib 1, roce 2)
 *   netdev=NAME     netdev of every RoCE GID (default svethN, N = index)
 *   ipv4=A.B.C.D    address of the IPv4-mapped RoCE GIDs (default
 *                   10.77.<index>.1; pair p >= 1 uses last octet + p - 1)
 *   mtu=256..4096   active MTU (default: ib 4096, roce 1024)
 *   port=up|down    initial port state (default up)
 *   max_qp=N, max_cqe=N, max_qp_wr=N, max_sge=N, max_mr_size=N[k|m|g|t]
 * The default (env unset) is "sv0:roce,sv1:roce".
 *
 * GID table: IB ports have one entry per gid (fe80::<guid>, type
 * "IB/RoCE v1", no netdev). RoCE entries come in pairs (even index
 * "IB/RoCE v1", odd index "RoCE v2"): pair 0 is the IPv6 link-local
 * fe80::<guid>, pair p >= 1 the IPv4-mapped ::ffff:<ipv4 + p - 1>.
 * IB ports get LID index+1; RoCE ports LID 0.
 *
 * Fake sysfs: under $MC_SOFTVERBS_SYSFS (created if missing) or a fresh
 * mkdtemp directory, removed at process exit; same layout as /sys:
 *   devices/pci0000:00/[<bridge>/]<pci>/{numa_node,vendor,device}
 *   (the paths below likewise gain the bridge component when one is set)
 *   devices/pci0000:00/<pci>/infiniband/<name>/device -> ../../../<pci>
 *   devices/pci0000:00/<pci>/infiniband/<name>/ports/1/{state,link_layer}
 *   devices/pci0000:00/<pci>/infiniband/<name>/ports/1/gid_attrs/types/<i>
 *   devices/pci0000:00/<pci>/infiniband/<name>/ports/1/gid_attrs/ndevs/<i>
 *   devices/pci0000:00/<pci>/infiniband_verbs/uverbsK/ibdev
 *   class/infiniband/<name> -> ../../devices/.../infiniband/<name>
 *   class/infiniband_verbs/uverbsK -> ...
 *   bus/pci/devices/<pci> -> ../../../devices/pci0000:00/<pci>
 * ibv_device.ibdev_path = <root>/class/infiniband/<name>, dev_path =
 * <root>/class/infiniband_verbs/uverbsK. Files exist only for populated
 * GID entries (reading an empty entry fails, as on real sysfs); IB
 * entries have no ndevs file. There is no /dev/infiniband node.
 *
 * Data path: RC QPs only, RDMA READ and WRITE only (SEND/RECV, atomics
 * and immediate data are rejected at post time with EINVAL). DMA-BUF MRs
 * treat the iova as a CPU address (the stand-in cannot map dmabufs).
 *
 * Return values: 0 on success, else a positive errno value (ENODEV for an
 * unknown device name, EINVAL for bad arguments, EBUSY for configure while
 * contexts are open). */
#ifndef MC_SOFTVERBS_CONTROL_H
#define MC_SOFTVERBS_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mc_softverbs_counters {
    uint64_t wrs_executed;  /* WRs this device executed as requester, ok or not */
    uint64_t wrs_failed;    /* of those, completed with a status != SUCCESS */
    uint64_t bytes_moved;   /* payload bytes of successful READ/WRITE WRs */
    uint64_t reads;         /* successful READ WRs */
    uint64_t writes;        /* successful WRITE WRs */
    uint64_t served_wrs;    /* successful WRs where this device was the responder */
    uint64_t served_bytes;  /* their bytes */
};

/* Replaces the device set (spec as in MC_SOFTVERBS_DEVICES; NULL: the
 * env, else the default) and rebuilds the fake sysfs. EBUSY while any
 * context is open. Device pointers from earlier lists stay readable. */
int mc_softverbs_configure(const char *spec);
int mc_softverbs_device_count(void);
/* Root of the fake sysfs tree (valid until the next configure). */
const char *mc_softverbs_sysfs_root(void);

/* Port 1 down (up = 0) or up: IBV_EVENT_PORT_ERR / IBV_EVENT_PORT_ACTIVE on
 * every open context of the device; while down, WRs from or to the device
 * complete with IBV_WC_RETRY_EXC_ERR. */
int mc_softverbs_set_port_state(const char *device, int up);
/* Replaces the populated GID entry `index` of port 1 with the 16 bytes at
 * `gid` and raises IBV_EVENT_GID_CHANGE on every open context of the
 * device (stand-in feature: on hardware the kernel changes the table, e.g.
 * when an IP address moves). QPs addressed to the old GID no longer reach
 * the device. EINVAL for an unpopulated index. */
int mc_softverbs_set_gid(const char *device, int index, const uint8_t *gid);
/* The next `count` WRs executed by `device` as requester (peer_device NULL)
 * or by `device` towards `peer_device` complete with `wc_status` (not
 * SUCCESS) without moving data, and their QP goes to ERR, like hardware.
 * Several injections are consumed in the order they were added. */
int mc_softverbs_inject_wc_error(const char *device, const char *peer_device, int count,
                                 int wc_status);
/* Moves a QP of `device` to ERR and raises IBV_EVENT_QP_FATAL for it. */
int mc_softverbs_set_qp_error(const char *device, uint32_t qp_num);
/* ibv_reg_mr / ibv_reg_mr_iova2 over any byte of [addr, addr + length)
 * fail with errno EFAULT (a GPU buffer without nvidia-peermem). */
int mc_softverbs_add_efault_range(uint64_t addr, uint64_t length);
void mc_softverbs_clear_efault_ranges(void);
/* The next `count` successful WRs executed by `device` move their data but
 * never produce a completion (a lost CQE), so tests can exercise slice
 * timeouts. 0 cancels. */
int mc_softverbs_drop_completions(const char *device, int count);
/* Holds (paused = 1) or resumes the execution of posted WRs on a device,
 * so tests can fill send queues and CQs deterministically. */
int mc_softverbs_set_paused(const char *device, int paused);
/* Clears injected errors, dropped completions, EFAULT ranges and pauses and puts every port
 * back in its configured state (raising PORT_ACTIVE / PORT_ERR where that
 * changes it). Counters are kept. */
void mc_softverbs_reset_faults(void);
int mc_softverbs_get_counters(const char *device, struct mc_softverbs_counters *out);
void mc_softverbs_reset_counters(void);
/* Number of WRs posted to the device and not yet executed. */
int mc_softverbs_pending(const char *device);

struct mc_softverbs_mr_info {
    uint32_t lkey;
    uint32_t rkey;
    uint64_t length;
    uint64_t offset;      /* dmabuf offset */
    int32_t dmabuf;       /* registered by ibv_reg_dmabuf_mr */
    int32_t fd;           /* the dmabuf fd it was given, else -1 */
    int32_t fd_is_dmabuf; /* at registration, /proc/self/fd/<fd> named a DMA-BUF */
    int32_t reserved;
};
/* The newest live MR of `device` whose iova range holds `addr`: 0, ENOENT
 * when none, ENODEV for an unknown device. Lets GPU tests see which
 * registration path the engine took and what it handed to the "NIC". */
int mc_softverbs_find_mr(const char *device, uint64_t addr, struct mc_softverbs_mr_info *out);

#ifdef __cplusplus
}
#endif

#endif /* MC_SOFTVERBS_CONTROL_H */
