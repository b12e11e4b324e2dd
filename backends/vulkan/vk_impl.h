/*
 * backends/vulkan — private declarations of the Vulkan backend module.
 *
 * The module dlopens the Vulkan loader (libvulkan.so.1) itself, so it loads on machines
 * without one and then declines politely (enumerate → DSI_ERR_UNSUPPORTED). Every Vulkan
 * entry point is called through the function table below.
 *
 * Large tensors (docs/vulkan.md "Buffers"): a dsib_buffer is one or more chunks, each its
 * own VkDeviceMemory + VkBuffer of at most `chunk_max` bytes (≤ maxMemoryAllocationSize).
 * A shader binding is a window of at most `max_binding` bytes (≤ maxStorageBufferRange)
 * inside one chunk; ops that read big weights split their dispatches by rows / experts so
 * each dispatch's weight bytes fit one window. A row (or a small activation view) must not
 * straddle a chunk boundary — impossible for buffers of ≤ chunk_max bytes.
 */
#ifndef DSI_VK_IMPL_H
#define DSI_VK_IMPL_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include "backends/backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Vulkan entry points ----------------------------------------------------------------- */

#define DSIB_VK_GLOBAL_FNS(X)                                                                  \
    X(vkCreateInstance)                                                                        \
    X(vkEnumerateInstanceLayerProperties)                                                      \
    X(vkEnumerateInstanceExtensionProperties)

#define DSIB_VK_INSTANCE_FNS(X)                                                                \
    X(vkDestroyInstance)                                                                       \
    X(vkEnumeratePhysicalDevices)                                                              \
    X(vkGetPhysicalDeviceProperties)                                                           \
    X(vkGetPhysicalDeviceProperties2)                                                          \
    X(vkGetPhysicalDeviceFeatures2)                                                            \
    X(vkGetPhysicalDeviceMemoryProperties)                                                     \
    X(vkGetPhysicalDeviceQueueFamilyProperties)                                                \
    X(vkEnumerateDeviceExtensionProperties)                                                    \
    X(vkCreateDevice)                                                                          \
    X(vkGetDeviceProcAddr)

#define DSIB_VK_DEVICE_FNS(X)                                                                  \
    X(vkDestroyDevice)                                                                         \
    X(vkGetDeviceQueue)                                                                        \
    X(vkAllocateMemory)                                                                        \
    X(vkFreeMemory)                                                                            \
    X(vkMapMemory)                                                                             \
    X(vkUnmapMemory)                                                                           \
    X(vkCreateBuffer)                                                                          \
    X(vkDestroyBuffer)                                                                         \
    X(vkGetBufferMemoryRequirements)                                                           \
    X(vkBindBufferMemory)                                                                      \
    X(vkCreateCommandPool)                                                                     \
    X(vkDestroyCommandPool)                                                                    \
    X(vkAllocateCommandBuffers)                                                                \
    X(vkResetCommandPool)                                                                      \
    X(vkBeginCommandBuffer)                                                                    \
    X(vkEndCommandBuffer)                                                                      \
    X(vkCmdCopyBuffer)                                                                         \
    X(vkCmdFillBuffer)                                                                         \
    X(vkCmdPipelineBarrier)                                                                    \
    X(vkCmdBindPipeline)                                                                       \
    X(vkCmdBindDescriptorSets)                                                                 \
    X(vkCmdPushConstants)                                                                      \
    X(vkCmdDispatch)                                                                           \
    X(vkQueueSubmit)                                                                           \
    X(vkCreateFence)                                                                           \
    X(vkDestroyFence)                                                                          \
    X(vkWaitForFences)                                                                         \
    X(vkResetFences)                                                                           \
    X(vkGetFenceStatus)                                                                        \
    X(vkCreateShaderModule)                                                                    \
    X(vkDestroyShaderModule)                                                                   \
    X(vkCreatePipelineCache)                                                                   \
    X(vkDestroyPipelineCache)                                                                  \
    X(vkCreateComputePipelines)                                                                \
    X(vkDestroyPipeline)                                                                       \
    X(vkCreatePipelineLayout)                                                                  \
    X(vkDestroyPipelineLayout)                                                                 \
    X(vkCreateDescriptorSetLayout)                                                             \
    X(vkDestroyDescriptorSetLayout)                                                            \
    X(vkCreateDescriptorPool)                                                                  \
    X(vkDestroyDescriptorPool)                                                                 \
    X(vkResetDescriptorPool)                                                                   \
    X(vkAllocateDescriptorSets)                                                                \
    X(vkUpdateDescriptorSets)                                                                  \
    X(vkDeviceWaitIdle)

typedef struct dsib_vk_fns {
#define DSIB_VK_DECL(name) PFN_##name name;
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    DSIB_VK_GLOBAL_FNS(DSIB_VK_DECL)
    DSIB_VK_INSTANCE_FNS(DSIB_VK_DECL)
    DSIB_VK_DEVICE_FNS(DSIB_VK_DECL)
    PFN_vkCreateDebugUtilsMessengerEXT vkCreateDebugUtilsMessengerEXT;
    PFN_vkDestroyDebugUtilsMessengerEXT vkDestroyDebugUtilsMessengerEXT;
#undef DSIB_VK_DECL
} dsib_vk_fns;

/* ---- shaders and pipelines ---------------------------------------------------------------- */

#define DSIB_VK_MAX_BINDINGS 8
#define DSIB_VK_PUSH_WORDS 32 /* 128 bytes: the guaranteed minimum maxPushConstantsSize */

/* Device features a shader variant may need (bits of dsib_vk_shader.needs). */
enum {
    DSIB_VK_NEED_SUBGROUP_ARITH = 1u << 0, /* subgroupAdd etc. in compute */
    DSIB_VK_NEED_FP16 = 1u << 1,           /* shaderFloat16 */
    DSIB_VK_NEED_STORAGE16 = 1u << 2,      /* storageBuffer16BitAccess */
    DSIB_VK_NEED_STORAGE8 = 1u << 3,       /* storageBuffer8BitAccess */
    DSIB_VK_NEED_INT_DOT = 1u << 4,        /* VK_KHR_shader_integer_dot_product */
    DSIB_VK_NEED_NARROW = 1u << 5          /* a CPU device, subgroups >= 8 (NARROW variants) */
};

typedef struct dsib_vk_shader {
    const char *name;      /* e.g. "matmul_q4_k" */
    const uint32_t *code;  /* SPIR-V words (embedded at build time) */
    size_t size;           /* bytes */
    uint32_t needs;        /* DSIB_VK_NEED_* */
    uint32_t n_bindings;   /* storage buffers used (bindings 0..n-1) */
} dsib_vk_shader;

extern const dsib_vk_shader dsib_vk_shaders[];
extern const size_t dsib_vk_n_shaders;

/* ---- buffers ---------------------------------------------------------------------------- */

typedef struct dsib_vk_chunk {
    VkBuffer buf;
    VkDeviceMemory mem;
    uint64_t size;
    uint8_t *mapped; /* persistent mapping when the memory is host-visible + coherent */
    int in_host;     /* DSIB_BUFFER_HOST_MEMORY placed outside the device-local heap */
} dsib_vk_chunk;

struct dsib_buffer {
    uint64_t size;
    uint64_t chunk_size;    /* every chunk but the last has exactly this size */
    uint32_t n_chunks;
    uint32_t flags;
    int host_mapped;        /* all chunks mapped */
    dsib_vk_chunk chunks[]; /* n_chunks */
};

/* A resolved shader binding: a window of one chunk. `base` is the (aligned) offset the
 * descriptor starts at; the shader adds the remaining byte offset itself. */
typedef struct dsib_vk_bind {
    VkBuffer buf;
    uint64_t base;   /* descriptor offset (multiple of minStorageBufferOffsetAlignment) */
    uint64_t range;  /* descriptor range */
    uint32_t skew;   /* view offset − base, bytes (< alignment + 0) */
} dsib_vk_bind;

/* ---- recording: stream frames and graphs -------------------------------------------------- */

typedef struct dsib_vk_dpool {
    struct dsib_vk_dpool *next;
    VkDescriptorPool pool;
    uint32_t used;
} dsib_vk_dpool;

/* A recording target: one command buffer and the descriptor pools its dispatches use (a
 * chain that grows, so recording never stops mid-step). */
typedef struct dsib_vk_rec {
    dsib_instance *inst;
    VkCommandPool pool;
    VkCommandBuffer cb;
    int reusable;          /* graph: recorded once, submitted many times */
    int has_cmds;          /* begun */
    int ended;
    dsib_vk_dpool *dpools;
    dsi_status status;     /* first failure recorded into it */
    char msg[512];
} dsib_vk_rec;

/* Streams keep a few frames so recording can continue while earlier work runs. */
#define DSIB_VK_FRAMES 3

typedef struct dsib_vk_frame {
    dsib_vk_rec rec;
    VkFence fence;
    int submitted;
    uint64_t serial;
    struct dsib_graph *graph; /* the frame's submission was this graph's command buffer */
} dsib_vk_frame;

struct dsib_stream {
    dsib_instance *inst;
    dsib_stream_desc desc;
    dsib_buffer *ws;              /* workspace (ops' temporaries) */
    pthread_mutex_t lock;         /* frames, serials, status (events are queried from any thread) */
    dsib_vk_frame frames[DSIB_VK_FRAMES];
    uint32_t cur;                 /* frame being recorded */
    uint64_t serial, done_serial; /* last submitted / last known complete */
    dsi_status status;            /* first failure since the last sync */
    char msg[512];
    struct dsib_graph *capturing; /* capture target, NULL when not capturing */
};

struct dsib_graph {
    dsib_instance *inst;
    dsib_vk_rec rec;
    int in_flight;
};

struct dsib_event {
    dsib_stream *s;
    uint64_t serial;
};

/* Per-instance rope tables (rope.comp): [3][1024][half] (cos, sin), one per config. */
typedef struct dsib_vk_rope_tab {
    dsib_rope key;
    dsib_buffer *buf;
} dsib_vk_rope_tab;
#define DSIB_VK_ROPE_TABLES 16

/* ---- the instance ------------------------------------------------------------------------- */

typedef struct dsib_vk_pipeline {
    VkPipeline pipe;
    int tried;  /* creation attempted (pipe may be VK_NULL_HANDLE on failure) */
} dsib_vk_pipeline;

struct dsib_instance {
    dsib_host host;
    dsib_vk_fns vk;
    void *libvulkan;
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice phys;
    VkDevice device;
    VkQueue queue;
    uint32_t queue_family;
    pthread_mutex_t queue_lock;  /* VkQueue access is externally synchronised */
    pthread_mutex_t rope_lock;   /* rope tables */
    pthread_mutex_t pipe_lock;   /* lazy pipeline creation */
    pthread_mutex_t staging_lock;

    dsib_device_desc desc;
    uint32_t vk_features;        /* DSIB_VK_NEED_* the device supports (and were enabled) */
    uint32_t variant_features;   /* features shader variants may use (0: DSINFER_VULKAN_BASELINE=1) */
    uint32_t subgroup_size;
    uint64_t min_align;          /* minStorageBufferOffsetAlignment (>= 4) */
    uint64_t max_binding;        /* window size (<= maxStorageBufferRange) */
    uint64_t chunk_max;          /* chunk size (<= maxMemoryAllocationSize) */
    uint64_t weight_chunk_max; /* pieces of row-structured (weight) buffers */
    uint32_t max_groups[3];
    uint32_t mem_type_device;    /* memory type index for device buffers */
    int mem_type_offload;        /* host RAM the device reads (DSIB_BUFFER_HOST_MEMORY), or -1 */
    uint32_t mem_type_host;      /* host-visible + coherent, for staging / readback */
    int device_is_mappable;      /* mem_type_device is host-visible + coherent */
    int force_staging;           /* DSINFER_VULKAN_FORCE_STAGING=1: never map device buffers */
    uint64_t heap_size;          /* of the device memory type's heap */
    atomic_uint_fast64_t mem_used;
    atomic_uint_fast64_t host_mem_used; /* DSIB_BUFFER_HOST_MEMORY chunks in host RAM */

    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkPipelineCache cache;
    dsib_vk_pipeline *pipes;     /* one per dsib_vk_shaders entry */
    dsib_buffer *dummy;          /* bound to unused binding slots */

    /* staging for non-mappable device memory */
    dsib_buffer *staging;
    VkCommandPool staging_pool;
    VkCommandBuffer staging_cb;
    VkFence staging_fence;

    dsib_vk_rope_tab ropes[DSIB_VK_ROPE_TABLES];
    uint32_t n_ropes;
};

/* ---- shared helpers (vk_backend.c) ------------------------------------------------------- */

void *dsib_vk_malloc(const dsib_host *host, size_t size);
void dsib_vk_free(const dsib_host *host, void *p);
void dsib_vk_log(const dsib_host *host, int32_t level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Allocates a device buffer (size > 0); on failure returns a status and fills msg. */
dsi_status dsib_vk_buffer_create(dsib_instance *inst, uint64_t size, uint32_t flags,
                                 dsib_buffer **out, char *msg, size_t msg_cap);
/* Same, with chunks that hold a whole number of `row_bytes` rows (row_bytes 0: any). */
dsi_status dsib_vk_buffer_create_rows(dsib_instance *inst, uint64_t size, uint64_t row_bytes,
                                      uint32_t flags, dsib_buffer **out, char *msg,
                                      size_t msg_cap);
void dsib_vk_buffer_destroy(dsib_instance *inst, dsib_buffer *b);

/* Resolves [offset, offset + need) of `b` to a binding window (need may be 0: then as much
 * as fits from offset, at least 4 bytes). Fails if the range straddles a chunk or exceeds
 * max_binding. */
dsi_status dsib_vk_resolve(const dsib_instance *inst, const dsib_buffer *b, uint64_t offset,
                           uint64_t need, dsib_vk_bind *out);
/* Bytes available from `offset` to the end of its chunk, capped by the window size (minus
 * the alignment skew). */
uint64_t dsib_vk_window_avail(const dsib_instance *inst, const dsib_buffer *b, uint64_t offset);

/* The recording target of a stream: its capture when capturing, else its current frame
 * (waiting for that frame's previous submission). */
dsib_vk_rec *dsib_vk_stream_rec(dsib_stream *s);
/* The stream's workspace when it holds `need` bytes, else NULL. */
dsib_buffer *dsib_vk_stream_ws(dsib_stream *s, uint64_t need);
/* Records a failure on the target (first one wins) and returns `st`. */
dsi_status dsib_vk_rec_fail(dsib_vk_rec *r, dsi_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Records one dispatch of shader `shader_index` with the given bindings and push words,
 * preceded by a full memory barrier. */
dsi_status dsib_vk_dispatch(dsib_instance *inst, dsib_vk_rec *r, uint32_t shader_index,
                            const dsib_vk_bind *binds, uint32_t n_binds, const uint32_t *push,
                            uint32_t n_push, uint32_t gx, uint32_t gy, uint32_t gz);
/* Records buffer-to-buffer copies (regions must each lie in one chunk of src and dst). */
dsi_status dsib_vk_copy(dsib_instance *inst, dsib_vk_rec *r, const dsib_buffer *src,
                        uint64_t src_off, dsib_buffer *dst, uint64_t dst_off, uint64_t bytes);
/* The rope table of `rope` (built and uploaded on first use; per instance). */
dsi_status dsib_vk_rope_table(dsib_instance *inst, const dsib_rope *rope, dsib_buffer **out,
                              char *msg, size_t cap);
/* Immediate host → buffer copy (the backend's upload entry point). */
dsi_status dsib_vk_upload(dsib_instance *inst, dsib_buffer *dst, uint64_t offset, const void *src,
                          uint64_t size, dsib_error *err);
/* Index of a shader by name, or -1. */
int dsib_vk_shader_index(const char *name);

/* The op table (vk_ops.c). */
extern const dsib_ops dsib_vk_ops;

/* Debug counters (validation messages), exported for tests as dsib_vulkan_debug_stats. */
typedef struct dsib_vk_debug_stats {
    uint32_t struct_size;
    uint32_t validation_enabled;
    uint64_t validation_errors;
    uint64_t validation_warnings;
    char last_error[512];
} dsib_vk_debug_stats;

#endif /* DSI_VK_IMPL_H */
