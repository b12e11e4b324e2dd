/*
 * lib/backend/device.h — the core's view of an opened backend instance ("device") and the
 * helpers around backends/backend.h that every core module shares:
 *
 *   - a context holds several devices: the CPU instance always (index 0), plus the GPU
 *     instance(s) named by its options; `dsii_context_compute` is the one the forward pass
 *     runs on (the first GPU, else the CPU);
 *   - ops a backend leaves NULL are composed from other ops where that is possible
 *     (dsii_op_matmul_grouped, dsii_op_copy_rows); dsii_device_check_ops names the first
 *     op a device cannot provide, so a session fails at creation, never mid-step;
 *   - waits between streams of different instances go through the host
 *     (dsii_stream_wait): event_sync on the producer's instance, then the consumer records
 *     on — the same instance uses the backend's own stream_wait.
 */
#ifndef DSI_BACKEND_DEVICE_H
#define DSI_BACKEND_DEVICE_H

#include "backends/backend.h"
#include "base/base.h"

/* One opened instance. Owned by the context (registry.c creates and closes it). */
typedef struct dsii_device {
    const dsib_backend *be;       /* the backend's function table (static storage) */
    dsib_instance *inst;          /* the instance bound to one device */
    void *dl_handle;              /* dlopen handle of the module; NULL for the built-in CPU */
    dsib_host host;               /* host services handed to the backend (outlive inst) */
    dsib_device_desc desc;        /* the instance's device, as backend->device reported */
    int32_t device_index;         /* index of that device within its backend */
    int32_t can_capture;          /* capture_begin/end, graph_launch/destroy all present */
    char name[16];                /* "cpu", "vulkan", "cuda" */
    char module_path[512];        /* file the module came from; "" for the built-in CPU */
} dsii_device;

/* Maximum devices of a context (the CPU + GPUs). */
#define DSII_MAX_DEVICES 8

/* The device the forward passes run on, and the context's CPU device (always present). */
dsii_device *dsii_context_compute(const dsi_context *ctx);
dsii_device *dsii_context_cpu(const dsi_context *ctx);
/* Number of devices and device i (0 = CPU). */
uint32_t dsii_context_n_devices(const dsi_context *ctx);
dsii_device *dsii_context_device(const dsi_context *ctx, uint32_t i);

/* UNSUPPORTED naming the first op of `needed` (DSIB_OP_* ids, n entries) the device can
 * neither run nor compose; DSI_OK otherwise. */
dsi_status dsii_device_check_ops(const dsii_device *d, const uint32_t *needed, uint32_t n,
                                 dsii_error *e);
/* UNSUPPORTED when supports_op declines `op` for weight type `type`. */
dsi_status dsii_device_check_type(const dsii_device *d, uint32_t op, int32_t type,
                                  const char *what, dsii_error *e);

/* Composable ops: the backend's entry when it has one, else a composition of other ops. */
dsi_status dsii_op_matmul_grouped(const dsii_device *d, dsib_stream *s, const dsib_weight *w,
                                  uint32_t groups, dsib_view x, uint32_t ldx, dsib_view y,
                                  uint32_t ldy, uint32_t n);
/* matmul_multi where the backend has it, else one matmul per entry (same results); nonzero
 * dsii_op_multi_off forces the latter (benchmark A/B only; set while no step runs). */
extern int dsii_op_multi_off;
dsi_status dsii_op_matmul_multi(const dsii_device *d, dsib_stream *s, const dsib_mm *mm,
                                uint32_t count);
dsi_status dsii_op_copy_rows(const dsii_device *d, dsib_stream *s, dsib_view src, uint32_t lds,
                             dsib_view dst, uint32_t ldd, uint32_t rows, uint32_t width);

/* Makes work recorded on stream `s` of device `d` after this call wait for event `ev` of
 * device `ev_dev`: the backend's stream_wait on the same instance, a host wait otherwise. */
dsi_status dsii_stream_wait(const dsii_device *d, dsib_stream *s, const dsii_device *ev_dev,
                            dsib_event *ev, dsii_error *e);

#endif /* DSI_BACKEND_DEVICE_H */
