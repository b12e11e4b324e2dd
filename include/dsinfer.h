/*
 * dsinfer.h — the public C API of libdsinfer.
 *
 * libdsinfer runs DeepSeek V4 Flash (GGUF arch "deepseek4") and DeepSeek V4.1 Flash
 * ("deepseek41") behind four opaque handles:
 *
 *   dsi_context   runtime root: log sink, allocator hooks, backends, CPU threads.
 *   dsi_model     immutable weights + tokenizer; shared by many sessions.
 *   dsi_session   one timeline: KV cache, Engram n-gram history, logits.
 *   dsi_sampler   sampling settings + RNG.
 *
 * ABI rules (see docs/api.md):
 *   - Every options/info struct starts with `uint32_t struct_size`, is filled by its
 *     `*_init()` function, is passed by pointer and only ever grows at the end. The library
 *     reads only the fields that `struct_size` covers and uses defaults for the rest.
 *   - No struct is passed or returned by value; public structs hold only fixed-width
 *     integers, floats, doubles, pointers and fixed-size char arrays.
 *   - Every function returns a `dsi_status` unless it is a trivial getter.
 *   - The library never prints, never exits, never aborts, never installs signal handlers.
 *     Messages reach the application only through the context's log callback.
 *
 * Thread-safety is stated per function as [thread-safe], [per-handle] (one thread at a time
 * per handle; different handles may be used concurrently) or [any-thread] (callable at any
 * time from any thread, including while another call on the same handle is running).
 *
 * Valid as C99 and later, and as C++98 and later.
 */
#ifndef DSINFER_H
#define DSINFER_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && !defined(DSI_STATIC)
#  if defined(DSI_BUILDING_LIBRARY)
#    define DSI_API __declspec(dllexport)
#  else
#    define DSI_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define DSI_API __attribute__((visibility("default")))
#else
#  define DSI_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------ */
/* Versions                                                                             */
/* ------------------------------------------------------------------------------------ */

#define DSI_VERSION_MAJOR 0
#define DSI_VERSION_MINOR 1
#define DSI_VERSION_PATCH 0
#define DSI_VERSION_STRING "0.1.0"

/* The ABI this header describes. Bumped when a function or struct field is appended
 * (compatible) — the SONAME major (libdsinfer.so.0) changes only on an incompatible break. */
#define DSI_ABI_VERSION 2   /* 2: dsi_session_cancel_clear, dsi_sampler_create_with_context,
                                  dsi_chat_tokenize, dsi_model_options.flags
                                  (DSI_MODEL_FLAG_*), the experimental batched API */

/* [thread-safe] Library version "MAJOR.MINOR.PATCH"; static storage. */
DSI_API const char *dsi_version_string(void);
/* [thread-safe] Library version numbers; any pointer may be NULL. */
DSI_API void dsi_version(uint32_t *major, uint32_t *minor, uint32_t *patch);
/* [thread-safe] The ABI version the library implements (DSI_ABI_VERSION it was built with). */
DSI_API uint32_t dsi_abi_version(void);

/* ------------------------------------------------------------------------------------ */
/* Status codes and errors                                                               */
/* ------------------------------------------------------------------------------------ */

typedef int32_t dsi_status;

enum {
    DSI_OK = 0,
    DSI_ERR_INVALID_ARGUMENT = -1,
    DSI_ERR_OUT_OF_HOST_MEMORY = -2,
    DSI_ERR_OUT_OF_DEVICE_MEMORY = -3,
    DSI_ERR_IO = -4,
    DSI_ERR_BAD_FORMAT = -5,
    DSI_ERR_UNSUPPORTED = -6,
    DSI_ERR_BACKEND = -7,
    DSI_ERR_CANCELLED = -8,
    DSI_ERR_CONTEXT_FULL = -9,
    DSI_ERR_STATE_MISMATCH = -10,
    DSI_ERR_ABI_MISMATCH = -11,
    DSI_ERR_BUSY = -12,
    DSI_ERR_NOT_FOUND = -13,
    DSI_ERR_INTERNAL = -14
};

/* [thread-safe] A short static description of a status code ("unknown status" otherwise). */
DSI_API const char *dsi_status_string(dsi_status status);

/* [thread-safe] The message of the last failed call made by this thread; "" if none. Every
 * failing call records its message here (also those that keep it on a handle), so this is
 * the way to read the failure of one's own call on a handle that several threads share, and
 * the only one for calls without a handle (constructors, NULL handles). Thread-local: other
 * threads never change it; valid until this thread's next failing call. */
DSI_API const char *dsi_last_error(void);

/* ------------------------------------------------------------------------------------ */
/* Handles                                                                               */
/* ------------------------------------------------------------------------------------ */

typedef struct dsi_context dsi_context;
typedef struct dsi_model dsi_model;
typedef struct dsi_session dsi_session;
typedef struct dsi_sampler dsi_sampler;
typedef struct dsi_detokenizer dsi_detokenizer;

typedef int32_t dsi_token;

/* ------------------------------------------------------------------------------------ */
/* Context                                                                               */
/* ------------------------------------------------------------------------------------ */

enum {
    DSI_LOG_DEBUG = 0,
    DSI_LOG_INFO = 1,
    DSI_LOG_WARN = 2,
    DSI_LOG_ERROR = 3,
    DSI_LOG_NONE = 4
};

/* Log sink. Called on the thread that called into the library, never from internal worker
 * threads. `message` is UTF-8, NUL-terminated, without a trailing newline. */
typedef void (*dsi_log_fn)(int32_t level, const char *message, void *user_data);

/* Host allocator hooks: all three or none. `realloc_fn(NULL, n)` must behave like malloc. */
typedef void *(*dsi_malloc_fn)(size_t size, void *user_data);
typedef void *(*dsi_realloc_fn)(void *ptr, size_t size, void *user_data);
typedef void (*dsi_free_fn)(void *ptr, void *user_data);

typedef struct dsi_context_options {
    uint32_t struct_size;      /* sizeof(dsi_context_options), set by init */
    uint32_t abi_version;      /* the DSI_ABI_VERSION the caller was compiled with */
    dsi_log_fn log_fn;         /* NULL: nothing is logged anywhere (default) */
    void *log_user_data;
    int32_t log_level;         /* minimum level delivered; default DSI_LOG_INFO */
    int32_t n_threads;         /* CPU worker threads; 0 = number of online CPUs (default) */
    dsi_malloc_fn malloc_fn;   /* NULL: the C library's malloc/realloc/free */
    dsi_realloc_fn realloc_fn;
    dsi_free_fn free_fn;
    void *alloc_user_data;
    const char *backend;       /* "cpu", "vulkan", "cuda" or "auto"; NULL = "cpu" (default) */
    const char *backend_dir;   /* directory of backend modules; NULL = built-in search path */
    int32_t device_index;      /* device of the chosen backend; -1 = best (default) */
    uint32_t flags;            /* DSI_CONTEXT_FLAG_*; 0 = defaults */
    /* since 0.2: the devices to open, a comma-separated list of "backend[:index]" entries
     * (e.g. "vulkan:0,vulkan:1"); NULL (default) = `backend` and `device_index`. The CPU is
     * always opened as well (hybrid work, host-side ops); the forward pass runs on the
     * first GPU listed. Copied by dsi_context_create. */
    const char *devices;
} dsi_context_options;

/* Context flags (dsi_context_options.flags).
 * DSI_CONTEXT_FLAG_EXACT_MATMUL (since 0.2): the CPU backend multiplies every weight type
 * with f32 activations (the exact path). By default it quantises each activation row once
 * to 8-bit blocks for the integer-coded weight types (Q8_0, Q4_K, Q2_K, MXFP4, ...) and
 * uses integer dot products — faster, with a small, documented change of the results
 * (docs/performance.md "Two activation paths"). Use the flag for tight comparisons against
 * a reference implementation. GPU backends ignore it (they always use f32 activations). */
#define DSI_CONTEXT_FLAG_EXACT_MATMUL (1u << 0)

/* [thread-safe] Fills `opt` with defaults. `abi_version` must be DSI_ABI_VERSION (bindings
 * pass the version they were written against); dsi_context_create refuses a newer one with
 * DSI_ERR_ABI_MISMATCH. Does nothing if `opt` is NULL. */
DSI_API void dsi_context_options_init(dsi_context_options *opt, uint32_t abi_version);

/* [thread-safe] Creates a context. `opt` may be NULL for all defaults. On failure `*out` is
 * set to NULL and dsi_last_error() says why. Status: INVALID_ARGUMENT (bad struct_size,
 * bad enum value, partial allocator hooks, unknown backend name), ABI_MISMATCH,
 * UNSUPPORTED / BACKEND (requested backend unavailable), OUT_OF_HOST_MEMORY. */
DSI_API dsi_status dsi_context_create(const dsi_context_options *opt, dsi_context **out);

/* [per-handle] Frees a context. NULL is accepted. All models and samplers created from it must
 * have been freed first (otherwise DSI_ERR_BUSY is returned and nothing is freed). */
DSI_API dsi_status dsi_context_free(dsi_context *ctx);

/* [thread-safe] The last error recorded on this context, by a call from any thread; "" if
 * none. The message is copied under the context's lock into storage owned by the calling
 * thread: the pointer and its text stay valid until this thread calls
 * dsi_context_last_error again (other threads' failures do not touch it). */
DSI_API const char *dsi_context_last_error(const dsi_context *ctx);

/* [thread-safe] Name of the backend the context runs on ("cpu", "vulkan", "cuda"). */
DSI_API const char *dsi_context_backend(const dsi_context *ctx);

/* [thread-safe] Effective CPU thread count. */
DSI_API int32_t dsi_context_n_threads(const dsi_context *ctx);

enum {
    DSI_DEVICE_CPU = 0,
    DSI_DEVICE_DISCRETE_GPU = 1,
    DSI_DEVICE_INTEGRATED_GPU = 2,
    DSI_DEVICE_VIRTUAL_GPU = 3,
    DSI_DEVICE_SOFTWARE = 4,   /* e.g. Mesa lavapipe */
    DSI_DEVICE_OTHER = 5
};

/* Device feature bits (dsi_device_info.features). */
#define DSI_DEVICE_FEATURE_FP16        (1u << 0)
#define DSI_DEVICE_FEATURE_STORAGE_16  (1u << 1)
#define DSI_DEVICE_FEATURE_STORAGE_8   (1u << 2)
#define DSI_DEVICE_FEATURE_SUBGROUPS   (1u << 3)
#define DSI_DEVICE_FEATURE_INT_DOT     (1u << 4)
#define DSI_DEVICE_FEATURE_BF16        (1u << 5)
#define DSI_DEVICE_FEATURE_COOPMAT     (1u << 6)
#define DSI_DEVICE_FEATURE_AVX2        (1u << 16)
#define DSI_DEVICE_FEATURE_AVX512      (1u << 17)

typedef struct dsi_device_info {
    uint32_t struct_size;      /* caller sets sizeof(dsi_device_info) (or use the init) */
    int32_t type;              /* DSI_DEVICE_* */
    char backend[16];          /* "cpu", "vulkan", "cuda" */
    char name[256];            /* UTF-8, NUL-terminated */
    uint64_t memory_total;     /* bytes of device-local memory (host RAM for the CPU) */
    uint64_t memory_free;      /* bytes, 0 if unknown */
    uint64_t max_buffer_size;  /* largest single storage binding, bytes */
    uint32_t features;         /* DSI_DEVICE_FEATURE_* */
    uint32_t subgroup_size;    /* 0 if not applicable */
    int32_t index;             /* index within its backend */
    int32_t reserved;
} dsi_device_info;

/* [thread-safe] Sets struct_size and zeroes the rest. */
DSI_API void dsi_device_info_init(dsi_device_info *info);

/* [thread-safe] Number of devices visible to this context across all backends that could be
 * loaded (the CPU is always device 0). */
DSI_API dsi_status dsi_context_device_count(dsi_context *ctx, int32_t *count);

/* [thread-safe] Information on device `i` (0 <= i < count). NOT_FOUND for a bad index. */
DSI_API dsi_status dsi_context_device_info(dsi_context *ctx, int32_t i, dsi_device_info *info);

/* ------------------------------------------------------------------------------------ */
/* Model                                                                                 */
/* ------------------------------------------------------------------------------------ */

/* Access modes and the file-stability contract (docs/api.md "Model files"). A model file
 * must not be modified or truncated while a model loaded from it is alive: replace files
 * atomically (write a new file, then rename it over the old one — a loaded model keeps
 * reading the old one).
 *   DSI_ACCESS_MMAP   the file is mapped and the weights are used in place: truncating it
 *                     kills the process with SIGBUS at the next access, rewriting it in
 *                     place changes the results (DSI_MODEL_FLAG_VERIFY_FILE turns both,
 *                     when they happen between calls, into DSI_ERR_IO).
 *   DSI_ACCESS_PREAD  everything is copied into library-owned memory during the load except
 *                     the Engram tables (model-spec §4.6; up to ~100 GB), whose rows are read
 *                     from the open file on demand during inference, by the threads running
 *                     sessions; a truncation then gives DSI_ERR_IO. With
 *                     DSI_MODEL_FLAG_RESIDENT the tables are copied too and the file is
 *                     closed before the load returns: nothing is read later.
 *   DSI_ACCESS_READER as PREAD, through the application's dsi_reader. */
enum {
    DSI_ACCESS_MMAP = 0,   /* default: weights used in place from the mapping */
    DSI_ACCESS_PREAD = 1,  /* buffered reads into library-owned memory (Engram rows lazily) */
    DSI_ACCESS_READER = 2  /* set implicitly by dsi_model_load_from_reader */
};

/* dsi_model_options.flags (since ABI 2; older libraries refuse them with INVALID_ARGUMENT).
 * VERIFY_FILE (dsi_model_load only): the file's size and modification time are recorded at
 *   load and compared before every evaluation step and every lazy read; a difference fails
 *   the call with DSI_ERR_IO and leaves the session as it was. It cannot see a change made
 *   during a step (in MMAP mode that may still be SIGBUS): it is a safety net, not a
 *   licence to modify files. Keeps one descriptor open per model.
 * RESIDENT (DSI_ACCESS_PREAD or a reader): read every tensor, Engram tables included, into
 *   library-owned memory during the load, then close the file — or call the reader's
 *   close_fn — before the load returns; the model never touches its source again. The way
 *   to load without mmap into owned memory. */
#define DSI_MODEL_FLAG_VERIFY_FILE (1u << 1)   /* bit 0 is the experimental COALESCE */
#define DSI_MODEL_FLAG_RESIDENT    (1u << 2)

enum {
    DSI_LOAD_STAGE_HEADER = 0,
    DSI_LOAD_STAGE_VALIDATE = 1,
    DSI_LOAD_STAGE_TENSORS = 2,
    DSI_LOAD_STAGE_UPLOAD = 3,
    DSI_LOAD_STAGE_DONE = 4
};

/* Progress callback: return nonzero to continue, 0 to abort loading (the load then fails
 * with DSI_ERR_CANCELLED and frees everything it allocated). Runs on the loading thread. */
typedef int32_t (*dsi_progress_fn)(int32_t stage, uint64_t done, uint64_t total,
                                   void *user_data);

struct dsi_place_options; /* experimental section */

typedef struct dsi_model_options {
    uint32_t struct_size;
    int32_t access;               /* DSI_ACCESS_MMAP (default) or DSI_ACCESS_PREAD */
    dsi_progress_fn progress_fn;  /* may be NULL */
    void *progress_user_data;
    uint32_t flags;               /* DSI_MODEL_FLAG_* (COALESCE: experimental section); default 0 */
    uint32_t reserved;
    /* since 0.2: a second GGUF holding the draft blocks (V4 MTP / V4.1 DSpark) when the
     * model file has none — llama.cpp's converter and ds4 ship the V4 MTP as a separate
     * file (docs/model-files.md §4.3). NULL: none. Opened with the same access mode
     * (DSI_ACCESS_PREAD for reader-loaded models); the path is not kept after loading. */
    const char *draft_path;
    /* since 0.3, experimental (dsi_place_options in the experimental section; docs/placement.md):
     * memory tiers — where each class of tensors lives (device / host RAM / streamed from
     * disk) under device and host budgets. NULL: every tensor resident, as before. The
     * struct is read during the load only. */
    const struct dsi_place_options *place;
} dsi_model_options;

/* [thread-safe] Fills `opt` with defaults. */
DSI_API void dsi_model_options_init(dsi_model_options *opt);

/* Reader callbacks for models stored in an application's own containers (docs/api.md
 * "Reader callbacks"). `pread_fn` reads exactly `size` bytes at `offset` into `buf` and
 * returns 0, or nonzero on failure (the library's call then fails with DSI_ERR_IO). It must
 * be reentrant and thread-safe: it runs during the load and — unless the model was loaded
 * with DSI_MODEL_FLAG_RESIDENT — after it, for Engram rows read on demand during inference,
 * from any thread that runs a session of the model, several calls at once. Reads always lie
 * inside [0, dsi_reader.size). The struct is copied at load; the functions and `user_data` must stay
 * valid until `close_fn` (may be NULL) is called, exactly once: when the model is freed,
 * when loading fails, or (RESIDENT) before the load returns. `pread_fn` is never called
 * after `close_fn`. */
typedef struct dsi_reader {
    uint32_t struct_size;
    uint32_t reserved;
    uint64_t size;  /* total bytes */
    int32_t (*pread_fn)(void *user_data, void *buf, uint64_t size, uint64_t offset);
    void (*close_fn)(void *user_data);
    void *user_data;
} dsi_reader;

/* [thread-safe] Sets struct_size and zeroes the rest. */
DSI_API void dsi_reader_init(dsi_reader *reader);

/* [thread-safe] Loads a GGUF model. Status: INVALID_ARGUMENT, IO, BAD_FORMAT (message names
 * the key or tensor and the offending value), UNSUPPORTED (unknown arch or tensor type),
 * OUT_OF_HOST_MEMORY, OUT_OF_DEVICE_MEMORY, CANCELLED. On failure *out is NULL. `path` must
 * name a regular file (or a block device): a FIFO, socket, character device or directory
 * gives DSI_ERR_IO at once — no path makes the call block. */
DSI_API dsi_status dsi_model_load(dsi_context *ctx, const char *path,
                                  const dsi_model_options *opt, dsi_model **out);

/* [thread-safe] Same, reading through callbacks. */
DSI_API dsi_status dsi_model_load_from_reader(dsi_context *ctx, const dsi_reader *reader,
                                              const dsi_model_options *opt, dsi_model **out);

/* [per-handle] Frees a model. NULL accepted. Returns DSI_ERR_BUSY (and frees nothing) while
 * sessions or detokenizers created from it are alive (docs/api.md "Lifetimes"). */
DSI_API dsi_status dsi_model_free(dsi_model *model);

/* [thread-safe] Last error recorded on this model (by any thread; "" if none), copied under
 * the model's lock into storage owned by the calling thread: valid until this thread calls
 * dsi_model_last_error again. For the failure of one's own call use dsi_last_error(). */
DSI_API const char *dsi_model_last_error(const dsi_model *model);

enum {
    DSI_ARCH_UNKNOWN = 0,
    DSI_ARCH_DEEPSEEK4 = 1,   /* DeepSeek V4 Flash */
    DSI_ARCH_DEEPSEEK41 = 2   /* DeepSeek V4.1 Flash */
};

typedef struct dsi_model_info {
    uint32_t struct_size;
    int32_t arch;             /* DSI_ARCH_* */
    char arch_name[32];       /* "deepseek4" / "deepseek41" */
    char name[128];           /* general.name, or "" */
    int32_t n_layers;         /* backbone layers */
    int32_t n_embd;
    int32_t n_vocab;
    int32_t n_heads;
    int32_t n_ctx_train;
    int32_t n_experts;
    int32_t n_experts_used;
    int32_t n_draft_layers;   /* MTP (V4) or DSpark (V4.1) blocks; 0 if none */
    int32_t has_mtp;          /* 1 if a V4 MTP block is present */
    int32_t has_dspark;       /* 1 if V4.1 DSpark blocks are present */
    int32_t has_engram;       /* 1 if Engram tables are present */
    int32_t reserved;
    uint64_t n_params;        /* elements over all bound tensors */
    uint64_t weight_bytes;    /* bytes of all bound tensors as stored */
    uint8_t fingerprint[32];  /* hash over architecture, hyperparameters, tensor layout and
                                 types (not the weight values); used to key saved state */
} dsi_model_info;

/* [thread-safe] Sets struct_size and zeroes the rest. */
DSI_API void dsi_model_info_init(dsi_model_info *info);

/* [thread-safe] Fills `info` (as far as info->struct_size covers). */
DSI_API dsi_status dsi_model_get_info(const dsi_model *model, dsi_model_info *info);

/* Tensor storage types; the values are ggml's type ids where ggml has one. */
enum {
    DSI_TYPE_F32 = 0,
    DSI_TYPE_F16 = 1,
    DSI_TYPE_Q8_0 = 8,
    DSI_TYPE_Q2_K = 10,
    DSI_TYPE_Q4_K = 12,
    DSI_TYPE_IQ2_XXS = 16,
    DSI_TYPE_I8 = 24,
    DSI_TYPE_I16 = 25,
    DSI_TYPE_I32 = 26,
    DSI_TYPE_I64 = 27,
    DSI_TYPE_F64 = 28,
    DSI_TYPE_BF16 = 30,
    DSI_TYPE_MXFP4 = 39,
    DSI_TYPE_FP8_E4M3_B128 = 1024, /* libdsinfer extensions, layouts in docs/tensor-types.md */
    DSI_TYPE_FP8_E4M3_B32 = 1025,
    DSI_TYPE_FP8_E4M3_R32 = 1026
};

/* [thread-safe] Static name of a tensor type ("f32", "q4_k", …) or NULL if unknown. */
DSI_API const char *dsi_type_name(int32_t type);

/* [thread-safe] Bytes of bound tensors stored as `type` (0 if none). */
DSI_API dsi_status dsi_model_type_bytes(const dsi_model *model, int32_t type, uint64_t *bytes);

/* [thread-safe] Metadata enumeration. Strings use the two-call pattern: `*needed` receives
 * the length without the NUL; the text (NUL-terminated, truncated if needed) is written only
 * when `buf` is non-NULL and `cap` > 0. Values are rendered as text: numbers in decimal,
 * strings verbatim, arrays as "[a, b, …]" (at most 64 elements shown, then "…"). */
DSI_API dsi_status dsi_model_meta_count(const dsi_model *model, int32_t *count);
DSI_API dsi_status dsi_model_meta_key(const dsi_model *model, int32_t i,
                                      char *buf, size_t cap, size_t *needed);
DSI_API dsi_status dsi_model_meta_value(const dsi_model *model, int32_t i,
                                        char *buf, size_t cap, size_t *needed);
/* [thread-safe] Looks a key up by name; NOT_FOUND if absent. */
DSI_API dsi_status dsi_model_meta_find(const dsi_model *model, const char *key,
                                       char *buf, size_t cap, size_t *needed);

/* ------------------------------------------------------------------------------------ */
/* Tokenizer                                                                             */
/* ------------------------------------------------------------------------------------ */

#define DSI_TOKENIZE_PARSE_SPECIAL (1u << 0) /* match special-token text literally */
#define DSI_TOKENIZE_ADD_BOS       (1u << 1) /* prepend BOS */

/* [thread-safe] Tokenizes `len` bytes of `text` (any bytes; invalid UTF-8 is tokenized
 * byte-wise). Writes at most `cap` ids to `tokens` (may be NULL with cap 0) and sets
 * `*n_needed` to the full count; returns DSI_OK when all fit, DSI_ERR_INVALID_ARGUMENT
 * with `*n_needed` set when `cap` was too small (nothing is written then). */
DSI_API dsi_status dsi_tokenize(const dsi_model *model, const char *text, size_t len,
                                uint32_t flags, dsi_token *tokens, size_t cap,
                                size_t *n_needed);

/* [thread-safe] Raw bytes of one token (may be part of a UTF-8 character). Two-call pattern
 * as dsi_tokenize: `*n_needed` always set; bytes written only when they all fit.
 * INVALID_ARGUMENT for a token outside the vocabulary. */
DSI_API dsi_status dsi_token_to_bytes(const dsi_model *model, dsi_token token,
                                      char *buf, size_t cap, size_t *n_needed);

/* [thread-safe] Concatenated bytes of `n` tokens (not NUL-terminated). Two-call pattern. */
DSI_API dsi_status dsi_detokenize(const dsi_model *model, const dsi_token *tokens, size_t n,
                                  char *buf, size_t cap, size_t *n_needed);

enum {
    DSI_SPECIAL_BOS = 0,
    DSI_SPECIAL_EOS = 1,
    DSI_SPECIAL_PAD = 2,
    DSI_SPECIAL_USER = 3,
    DSI_SPECIAL_ASSISTANT = 4,
    DSI_SPECIAL_THINK_BEGIN = 5,
    DSI_SPECIAL_THINK_END = 6
};

/* [thread-safe] Id of a special token; NOT_FOUND if the vocabulary lacks it. */
DSI_API dsi_status dsi_model_special_token(const dsi_model *model, int32_t which,
                                           dsi_token *token);

/* [thread-safe] Incremental decoder: turns a stream of tokens into complete UTF-8 pieces,
 * holding back the bytes of an unfinished character. Invalid sequences are passed through
 * as U+FFFD. The detokenizer points at the model: dsi_model_free returns DSI_ERR_BUSY until
 * it is freed. */
DSI_API dsi_status dsi_detokenizer_create(const dsi_model *model, dsi_detokenizer **out);
/* [per-handle] Feeds one token; writes the text that became complete. Two-call pattern: if
 * `cap` is too small nothing is consumed and INVALID_ARGUMENT is returned with *n_needed. */
DSI_API dsi_status dsi_detokenizer_feed(dsi_detokenizer *d, dsi_token token,
                                        char *buf, size_t cap, size_t *n_needed);
/* [per-handle] Emits whatever is held back (as U+FFFD for an unfinished character). */
DSI_API dsi_status dsi_detokenizer_flush(dsi_detokenizer *d, char *buf, size_t cap,
                                         size_t *n_needed);
/* [per-handle] NULL accepted. */
DSI_API void dsi_detokenizer_free(dsi_detokenizer *d);

/* ------------------------------------------------------------------------------------ */
/* Chat rendering (DeepSeek V4 encoding, model-spec.md §6)                               */
/* ------------------------------------------------------------------------------------ */

enum {
    DSI_ROLE_SYSTEM = 0,
    DSI_ROLE_USER = 1,
    DSI_ROLE_ASSISTANT = 2,
    DSI_ROLE_TOOL = 3        /* a tool result; rendered inside user content */
};

typedef struct dsi_chat_message {
    uint32_t struct_size;
    int32_t role;            /* DSI_ROLE_* */
    const char *content;     /* UTF-8, NUL-terminated; NULL = "" */
    const char *reasoning;   /* assistant's thinking text, or NULL; rendered only for an
                                assistant turn after the last user turn with thinking on
                                (earlier reasoning is dropped, as the official encoder does) */
} dsi_chat_message;

enum {
    DSI_THINKING_OFF = 0,
    DSI_THINKING_ON = 1,
    DSI_THINKING_MAX = 2
};

typedef struct dsi_chat_options {
    uint32_t struct_size;
    int32_t thinking;               /* DSI_THINKING_*; default OFF */
    int32_t add_generation_prompt;  /* 1 (default): end with the assistant prefix */
    int32_t add_bos;                /* 1 (default) */
} dsi_chat_options;

/* [thread-safe] */
DSI_API void dsi_chat_message_init(dsi_chat_message *msg);
/* [thread-safe] */
DSI_API void dsi_chat_options_init(dsi_chat_options *opt);

/* [thread-safe] Renders a conversation (array of `n` pointers) as text; the text contains
 * special tokens literally (docs/tokenizer.md "Chat rendering" has the exact format).
 * Prompt-injection risk: tokenizing this text with DSI_TOKENIZE_PARSE_SPECIAL turns special-
 * token text inside a message (e.g. a user typing the assistant-turn marker) into real
 * special tokens, letting message content forge turns. To run a conversation, use
 * dsi_chat_tokenize, which cannot be forged that way; this text form is for display,
 * logging and other tools. Consecutive user / tool messages form one user
 * turn (parts joined by "\n\n"). Two-call pattern: `*n_needed` receives the length without
 * the NUL; when cap >= that length the text is written (NUL-terminated if cap > length) and
 * DSI_OK returned, otherwise INVALID_ARGUMENT and nothing is written. `model` is required
 * (errors are recorded on it). INVALID_ARGUMENT names the message index and field for a NULL
 * message, a bad struct_size or role, or bad options. */
DSI_API dsi_status dsi_chat_render(const dsi_model *model,
                                   const dsi_chat_message *const *messages, size_t n,
                                   const dsi_chat_options *opt,
                                   char *buf, size_t cap, size_t *n_needed);

/* [thread-safe] The token ids of the conversation dsi_chat_render renders (since ABI 2): the
 * template's structure (BOS, turn markers, think tags) becomes special tokens, and every
 * message's content and reasoning is tokenized as plain text — special-token text inside a
 * message stays text. For ordinary messages the ids equal dsi_tokenize(rendered text,
 * DSI_TOKENIZE_PARSE_SPECIAL). Two-call pattern as dsi_tokenize: `*n_needed` receives the
 * count; ids are written only when they all fit (INVALID_ARGUMENT otherwise). Errors as
 * dsi_chat_render (recorded on the model); UNSUPPORTED if the model has no tokenizer. */
DSI_API dsi_status dsi_chat_tokenize(const dsi_model *model,
                                     const dsi_chat_message *const *messages, size_t n,
                                     const dsi_chat_options *opt,
                                     dsi_token *tokens, size_t cap, size_t *n_needed);

/* ------------------------------------------------------------------------------------ */
/* Session                                                                               */
/* ------------------------------------------------------------------------------------ */

/* Debug switch (model-spec.md §10.4): turns the FP8/FP4 fake-quant rounding off (clamp and
 * rescale only), for tight comparisons between implementations. Not the model's graph. */
#define DSI_SESSION_FLAG_NO_FAKE_QUANT (1u << 0)

typedef struct dsi_session_options {
    uint32_t struct_size;
    uint32_t n_ctx;          /* maximum timeline length; 0 = min(4096, trained context) */
    uint32_t n_batch;        /* prefill chunk size in tokens; 0 = 256 */
    uint32_t flags;          /* DSI_SESSION_FLAG_* */
    /* since 0.3, experimental (DSI_SPEC_* in the experimental section): speculative
     * decoding in dsi_session_generate with the model's draft blocks (V4 MTP, V4.1 DSpark).
     * The output is the same as without it: identical at temperature 0, the same
     * distribution when sampling. 0 = off (the default). */
    uint32_t spec;           /* DSI_SPEC_OFF / DSI_SPEC_ON / DSI_SPEC_AUTO */
    uint32_t draft_max;      /* drafts per step, 0 = the draft block's (DSpark 5, MTP 1) */
    float draft_confidence;  /* DSpark: end a proposal at a slot whose confidence (0..1) is
                                below this; 0 = never */
    uint32_t spec_reserved;  /* 0 */
} dsi_session_options;

/* [thread-safe] */
DSI_API void dsi_session_options_init(dsi_session_options *opt);

/* [thread-safe] Creates a session on a model; several sessions of one model may run on
 * different threads at once. */
DSI_API dsi_status dsi_session_create(dsi_model *model, const dsi_session_options *opt,
                                      dsi_session **out);
/* [per-handle] NULL accepted. */
DSI_API void dsi_session_free(dsi_session *session);
/* [per-handle] Last error recorded on this session; "". Valid until the next call on it. */
DSI_API const char *dsi_session_last_error(const dsi_session *session);

/* [per-handle] Makes the timeline equal to tokens[0..n): keeps the longest common prefix
 * with the current timeline, evaluates the rest, and leaves the logits of the last token
 * available. `n_reused` (may be NULL) receives how many tokens were kept.
 * INVALID_ARGUMENT for a token outside the vocabulary or n == 0; CONTEXT_FULL if n exceeds
 * n_ctx; CANCELLED if dsi_session_cancel was called (the session then holds a valid prefix,
 * see dsi_session_position). On INVALID_ARGUMENT / CONTEXT_FULL the session is unchanged. */
DSI_API dsi_status dsi_session_sync(dsi_session *session, const dsi_token *tokens, size_t n,
                                    size_t *n_reused);

/* [per-handle] Evaluates `n` more tokens at the end of the timeline. Errors as sync. */
DSI_API dsi_status dsi_session_append(dsi_session *session, const dsi_token *tokens,
                                      size_t n);

/* [per-handle] Logits of the last evaluated token (n_vocab floats); valid until the next
 * mutating call on the session. NOT_FOUND if nothing was evaluated yet. */
DSI_API dsi_status dsi_session_logits(dsi_session *session, const float **logits,
                                      int32_t *n_vocab);

/* [per-handle] Number of tokens in the timeline. */
DSI_API dsi_status dsi_session_position(const dsi_session *session, uint32_t *pos);

/* [per-handle] Copies the timeline's tokens, two-call pattern (count in *n_needed). */
DSI_API dsi_status dsi_session_tokens(const dsi_session *session, dsi_token *tokens,
                                      size_t cap, size_t *n_needed);

/* [per-handle] Empties the timeline. */
DSI_API dsi_status dsi_session_reset(dsi_session *session);

/* [any-thread] Asks the running dsi_session_sync / append / generate on this session to stop
 * at the next token or prefill chunk; it then returns DSI_ERR_CANCELLED. The request is
 * sticky: made while no such call runs, it stays pending and the next one returns
 * DSI_ERR_CANCELLED as soon as its arguments are checked, before it changes the session — a
 * "stop" pressed just before a call starts is never lost. One request cancels one call: the
 * call that returns DSI_ERR_CANCELLED absorbs every request made until it returns; other
 * calls (reset, logits, …) leave a pending request alone. Only atomic stores
 * (async-signal-safe). The session must stay alive while this runs: never call it
 * concurrently with or after dsi_session_free (docs/api.md "Cancellation"). */
DSI_API void dsi_session_cancel(dsi_session *session);

/* [any-thread] Drops a pending cancel request (since ABI 2). For a request that arrived after
 * the call it was meant for had already finished: call it when starting a new piece of work
 * (e.g. when the user sends the next message), before the call that does it. Only an atomic
 * store (async-signal-safe); NULL accepted. */
DSI_API void dsi_session_cancel_clear(dsi_session *session);

/* ------------------------------------------------------------------------------------ */
/* Sampler                                                                               */
/* ------------------------------------------------------------------------------------ */

typedef struct dsi_logit_bias {
    dsi_token token;
    float bias;
} dsi_logit_bias;

typedef struct dsi_sampler_options {
    uint32_t struct_size;
    float temperature;          /* 0 = greedy; must be >= 0; default 1.0 */
    int32_t top_k;              /* 0 = off (default); must be >= 0 */
    float top_p;                /* in (0, 1]; 1 = off (default) */
    float min_p;                /* in [0, 1); 0 = off (default) */
    float repetition_penalty;   /* > 0; 1 = off (default) */
    float frequency_penalty;    /* 0 = off (default) */
    float presence_penalty;     /* 0 = off (default) */
    int32_t penalty_last_n;     /* window of past tokens for penalties; default 64; >= 0 */
    uint32_t reserved;
    uint64_t seed;              /* RNG seed; default 0 */
    const dsi_logit_bias *logit_bias; /* copied at creation */
    size_t n_logit_bias;
} dsi_sampler_options;

/* [thread-safe] */
DSI_API void dsi_sampler_options_init(dsi_sampler_options *opt);
/* [thread-safe] INVALID_ARGUMENT (with a message naming the field) for bad options. The
 * sampler allocates with the C library's malloc; see dsi_sampler_create_with_context. */
DSI_API dsi_status dsi_sampler_create(const dsi_sampler_options *opt, dsi_sampler **out);
/* [thread-safe] Like dsi_sampler_create, but every allocation the sampler makes (now and in
 * dsi_sampler_sample) goes through the allocator hooks of `ctx` (since ABI 2). The sampler
 * points at the context: dsi_context_free returns DSI_ERR_BUSY until it is freed. A NULL
 * `ctx` behaves as dsi_sampler_create. */
DSI_API dsi_status dsi_sampler_create_with_context(dsi_context *ctx,
                                                   const dsi_sampler_options *opt,
                                                   dsi_sampler **out);
/* [per-handle] NULL accepted. */
DSI_API void dsi_sampler_free(dsi_sampler *sampler);
/* [per-handle] Last error recorded on this sampler; "". Valid until the next call on it. */
DSI_API const char *dsi_sampler_last_error(const dsi_sampler *sampler);
/* [per-handle] Samples a token from `logits` (n_vocab floats; not modified) and records it
 * in the penalty history. Order: penalties over the last penalty_last_n tokens (repetition:
 * positive logits divided, negative multiplied; then − count·frequency − presence), logit
 * bias, then greedy (temperature 0: argmax, ties to the lower id) or temperature → top-k →
 * softmax → top-p → min-p → draw. NaN logits count as −inf. Same seed and inputs give the
 * same token on every platform (own RNG and exp, total order by logit then id).
 * INVALID_ARGUMENT if a logit_bias token is >= n_vocab. */
DSI_API dsi_status dsi_sampler_sample(dsi_sampler *sampler, const float *logits,
                                      int32_t n_vocab, dsi_token *token);
/* [per-handle] Adds a token to the penalty history without sampling (e.g. prompt tokens). */
DSI_API dsi_status dsi_sampler_accept(dsi_sampler *sampler, dsi_token token);
/* [per-handle] Clears history and re-seeds the RNG with the creation seed. */
DSI_API dsi_status dsi_sampler_reset(dsi_sampler *sampler);
/* [per-handle] The probability distribution (n_vocab floats, zeros outside the kept set)
 * the last dsi_sampler_sample drew from; valid until the next call on the sampler.
 * For greedy sampling it is one-hot. */
DSI_API dsi_status dsi_sampler_probs(dsi_sampler *sampler, const float **probs,
                                     int32_t *n_vocab);

/* ------------------------------------------------------------------------------------ */
/* Generation                                                                            */
/* ------------------------------------------------------------------------------------ */

/* Called for each generated token with its text: complete UTF-8 (bytes of an unfinished
 * character are held back to the next call; invalid bytes arrive as U+FFFD) and, with stop
 * strings, without any tail that could still start a stop string. A token is passed only
 * after it was appended to the session; EOS and stop tokens are not passed. When generation
 * ends (except by a stop string or cancellation) text still held back is delivered in one
 * last call with token = -1 (its return value is ignored). Return nonzero to continue, 0 to
 * stop (finish reason DSI_FINISH_CALLBACK). Runs on the calling thread. */
typedef int32_t (*dsi_token_fn)(dsi_token token, const char *text, size_t text_len,
                                void *user_data);

typedef struct dsi_generate_options {
    uint32_t struct_size;
    int32_t max_tokens;                 /* default 256; must be >= 0 */
    const dsi_token *prompt;            /* if non-NULL, synced first (prefix reused) */
    size_t n_prompt;
    const dsi_token *stop_tokens;       /* in addition to EOS */
    size_t n_stop_tokens;
    const char *const *stop_strings;    /* generation stops when the text ends with one */
    size_t n_stop_strings;
    dsi_token_fn on_token;
    void *user_data;
    uint32_t flags;                     /* reserved, must be 0 */
    uint32_t reserved;
} dsi_generate_options;

enum {
    DSI_FINISH_NONE = 0,
    DSI_FINISH_LENGTH = 1,
    DSI_FINISH_EOS = 2,
    DSI_FINISH_STOP_TOKEN = 3,
    DSI_FINISH_STOP_STRING = 4,
    DSI_FINISH_CALLBACK = 5,
    DSI_FINISH_CANCELLED = 6,
    DSI_FINISH_CONTEXT_FULL = 7
};

typedef struct dsi_generate_result {
    uint32_t struct_size;
    int32_t finish_reason;   /* DSI_FINISH_* */
    uint64_t n_prompt;
    uint64_t n_reused;
    uint64_t n_generated;
    double prefill_ms;
    double decode_ms;
    /* since 0.3, experimental: speculative decoding (dsi_session_options.spec) */
    uint64_t n_spec_steps;   /* verify steps (each evaluates the next token + its drafts) */
    uint64_t n_drafted;      /* draft tokens proposed */
    uint64_t n_accepted;     /* draft tokens accepted */
} dsi_generate_result;

/* [thread-safe] */
DSI_API void dsi_generate_options_init(dsi_generate_options *opt);
/* [thread-safe] */
DSI_API void dsi_generate_result_init(dsi_generate_result *result);

/* [per-handle: session and sampler] Generates up to max_tokens tokens. `opt` may be NULL for
 * all defaults (dsi_generate_options_init: no prompt, 256 tokens, no callback). Returns
 * DSI_OK for every normal finish (see result->finish_reason), DSI_ERR_CANCELLED when
 * cancelled (the session keeps the prompt and every delivered token, and a later call
 * without a prompt continues from it; a call cancelled before it started — a request was
 * pending, see dsi_session_cancel — leaves the session unchanged), or an error (recorded on
 * the session). Without a prompt the session must already hold logits. EOS / stop tokens end the call without being appended; they
 * count in n_generated. A stop string is never delivered; the token that completed it stays
 * in the session. The prompt is not added to the sampler's penalty history (use
 * dsi_sampler_accept). `result` may be NULL; only the fields its struct_size covers are
 * written. */
DSI_API dsi_status dsi_session_generate(dsi_session *session, dsi_sampler *sampler,
                                        const dsi_generate_options *opt,
                                        dsi_generate_result *result);

/* ------------------------------------------------------------------------------------ */
/* Experimental API                                                                      */
/* ------------------------------------------------------------------------------------ */
/* Declared only when DSI_EXPERIMENTAL is defined before this header is included (the
 * pattern of zstd's ZSTD_STATIC_LINKING_ONLY): these may still change between minor
 * releases; each carries the version it appeared in. The symbols are exported by the
 * library either way. docs/api.md "Experimental: batched steps". */
#if defined(DSI_EXPERIMENTAL)

/* since 0.2 — dsi_model_options.flags: sessions of this model coalesce their evaluation.
 * Concurrent dsi_session_sync / dsi_session_append / dsi_session_generate calls on
 * different sessions of the model (from different threads) are merged into shared
 * batched steps; results are bit-identical to running each session alone. Cancellation,
 * errors and context-full stay per session. */
#define DSI_MODEL_FLAG_COALESCE (1u << 0)

/* since 0.2 — dsi_session_options.flags: never capture / replay the session's steps (a
 * debugging switch: replayed steps give identical logits). */
#define DSI_SESSION_FLAG_NO_CAPTURE (1u << 16)

/* since 0.3 — dsi_session_options.flags: keep the session's state as f32 rows even where
 * the backend stores it packed (FP8 / FP4 codes with their block scales; docs/internals.md
 * "State layout"). The logits are bit-identical either way (the stored numbers are the
 * same); a verification switch that costs about 4× the state memory. */
#define DSI_SESSION_FLAG_F32_STATE (1u << 17)

/* since 0.2 — [per-handle: every session listed] Advances `n` sessions of ONE model by one
 * call each: session i evaluates tokens[i][0 .. n_tokens[i]) appended to its timeline (one
 * decode token, or a prefill chunk of any length), and afterwards holds the logits of its
 * last token (dsi_session_logits). Rows of all sessions run together in shared steps
 * (long prefills in several steps); each session's results are bit-identical to
 * dsi_session_append on it alone.
 * Per session, exactly as dsi_session_append: INVALID_ARGUMENT (token outside the
 * vocabulary, n_tokens 0) and CONTEXT_FULL leave that session unchanged; CANCELLED when
 * dsi_session_cancel was called on it (it keeps a valid prefix; a request pending before
 * the call — sticky, see dsi_session_cancel — cancels it before it changes), IO when the
 * file of a DSI_MODEL_FLAG_VERIFY_FILE model changed. One session's failure
 * does not change any other session's result. `status` (may be NULL) receives each
 * session's status. Returns DSI_OK when every session succeeded, otherwise the first
 * failing session's status. INVALID_ARGUMENT for the whole call (nothing changes) when an
 * array is NULL, a session is NULL or listed twice, or the sessions belong to different
 * models. */
DSI_API dsi_status dsi_session_append_batch(size_t n, dsi_session *const *sessions,
                                            const dsi_token *const *tokens,
                                            const size_t *n_tokens, dsi_status *status);

/* since 0.3 — dsi_session_options.spec: speculative decoding in dsi_session_generate
 * (docs/spec.md). ON fails session creation with UNSUPPORTED when the model has no usable
 * draft blocks; AUTO uses them when present and, within a call, speculates only while it
 * measures faster than plain decoding (and stops when the drafts are rarely accepted). */
#define DSI_SPEC_OFF 0u
#define DSI_SPEC_ON 1u
#define DSI_SPEC_AUTO 2u

/* since 0.3 — [per-handle] Debugging / cross-checking drafters: runs the session's draft
 * block(s) after its timeline followed by `next` (not appended) and returns up to `cap`
 * drafts (the greedy picks, Markov bias and confidence applied as in generation) in
 * ids[0 .. *n_drafts), and, when `logits` is not NULL, their draft logits (cap × n_vocab
 * floats, row i = the distribution draft i was picked from). The timeline and the target
 * state are unchanged (draft rings beyond the timeline are scratch). INVALID_ARGUMENT for
 * NULL ids / n_drafts, cap 0 or `next` outside the vocabulary; NOT_FOUND when the session
 * holds no token; UNSUPPORTED when the session was created without speculation;
 * CONTEXT_FULL when the block does not fit before n_ctx. */
DSI_API dsi_status dsi_session_draft(dsi_session *session, dsi_token next, dsi_token *ids,
                                     float *logits, size_t cap, size_t *n_drafts);
/* ---- since 0.2 — session snapshots and the prompt cache (docs/snapshots.md) ---------- */

/* Output callback of dsi_session_save: writes `size` bytes; returns 0 on success, anything
 * else stops the save (DSI_ERR_IO). Runs on the calling thread. */
typedef int32_t (*dsi_write_fn)(void *user_data, const void *data, size_t size);
/* Input callback of dsi_session_load: fills exactly `size` bytes; returns 0 on success,
 * anything else (end of data, error) stops the load. */
typedef int32_t (*dsi_read_fn)(void *user_data, void *data, size_t size);

/* since 0.2 — [per-handle] Saves the session's complete state — its timeline tokens, the
 * last logits (if it holds them), every per-sequence model state row its timeline needs
 * (KV windows, compressed rows, index keys, compressor frontiers; the Engram history is the
 * timeline) — as a snapshot (docs/snapshots.md: versioned, model fingerprint, xxHash3
 * checksums per section, backend-independent). The session is only read. IO when `write`
 * fails; INVALID_ARGUMENT for an empty session. *n_written (may be NULL): bytes written. */
DSI_API dsi_status dsi_session_save(dsi_session *session, dsi_write_fn write, void *user_data,
                                    uint64_t *n_written);
/* since 0.2 — [per-handle] Saves into buf[0 .. cap). *n_needed always receives the size;
 * buf NULL with cap 0 only asks for it (DSI_OK); a smaller capacity gives INVALID_ARGUMENT. */
DSI_API dsi_status dsi_session_save_buffer(dsi_session *session, void *buf, size_t cap,
                                           size_t *n_needed);
/* since 0.2 — [per-handle] Saves to the file `path` atomically (temporary file beside it,
 * fsync, rename): a crash leaves the old file or the new one, never a partial one. */
DSI_API dsi_status dsi_session_save_file(dsi_session *session, const char *path);

/* since 0.2 — [per-handle] Loads a snapshot into a session (fresh or in use) of the same
 * model: afterwards its timeline, logits and state are the saved ones and evaluation
 * continues bit-identically to the saved session (on another backend: within the
 * cross-backend tolerance). The session's n_ctx must hold the snapshot; its n_batch and
 * backend may differ; DSI_SESSION_FLAG_NO_FAKE_QUANT must match. Everything is validated
 * before the session changes: BAD_FORMAT (not a snapshot, truncated, a checksum mismatch —
 * corrupt), UNSUPPORTED (a newer format version), STATE_MISMATCH (another model, other
 * flags), CONTEXT_FULL (longer than n_ctx) leave the session exactly as it was. Only a
 * device failure while the state is written makes the session forget its timeline. */
DSI_API dsi_status dsi_session_load(dsi_session *session, dsi_read_fn read, void *user_data);
DSI_API dsi_status dsi_session_load_buffer(dsi_session *session, const void *buf, size_t size);
DSI_API dsi_status dsi_session_load_file(dsi_session *session, const char *path);

/* dsi_prompt_cache_options.flags */
#define DSI_PROMPT_CACHE_NO_WRITE (1u << 0) /* only read entries */
#define DSI_PROMPT_CACHE_NO_READ (1u << 1)  /* only write entries */

typedef struct dsi_prompt_cache_options {
    uint32_t struct_size;
    uint32_t chunk_tokens;   /* prefixes are cached at multiples of this; 0 = 256 */
    const char *dir;         /* an existing directory (copied); NULL turns the cache off */
    uint64_t max_bytes;      /* size cap of the directory's entries (LRU eviction); 0 = 4 GiB */
    uint32_t min_tokens;     /* shorter prefixes are not cached; 0 = chunk_tokens */
    uint32_t flags;          /* DSI_PROMPT_CACHE_* */
} dsi_prompt_cache_options;

/* since 0.2 — [thread-safe] Sets struct_size and zeroes the rest. */
DSI_API void dsi_prompt_cache_options_init(dsi_prompt_cache_options *opt);

/* since 0.2 — [per-handle] Turns the disk prefix cache on (or off: opt NULL or dir NULL)
 * for this session. dsi_session_sync (and dsi_session_generate with a prompt) then restore
 * the longest cached prefix of the new timeline (at a chunk boundary, longer than what the
 * session already holds) before evaluating the rest, and cache the prefix at the last chunk
 * boundary after evaluating. Entries are snapshots (checksummed; a corrupt entry is removed
 * and ignored), written atomically; several sessions and processes may share a directory
 * (lock-free: docs/snapshots.md). Cache failures never fail a sync. IO when `dir` is not a
 * directory. */
DSI_API dsi_status dsi_session_set_prompt_cache(dsi_session *session,
                                                const dsi_prompt_cache_options *opt);

typedef struct dsi_prompt_cache_stats {
    uint32_t struct_size;
    uint32_t reserved;
    uint64_t hits;             /* syncs that restored a prefix from disk */
    uint64_t misses;           /* syncs that looked and found none usable */
    uint64_t tokens_restored;  /* tokens not evaluated thanks to hits */
    uint64_t writes;           /* entries written */
    uint64_t bytes_written;
    uint64_t write_errors;
    uint64_t evictions;        /* entries removed by the size cap */
    uint64_t corrupt_removed;  /* corrupt entries found and removed */
    uint64_t write_ns;         /* time spent writing entries (incl. fsync, eviction) */
    uint64_t read_ns;          /* time spent probing, reading, validating, restoring */
} dsi_prompt_cache_stats;

/* since 0.2 — [thread-safe] Sets struct_size and zeroes the rest. */
DSI_API void dsi_prompt_cache_stats_init(dsi_prompt_cache_stats *stats);
/* since 0.2 — [per-handle] The session's prompt-cache counters (zero when off). */
DSI_API dsi_status dsi_session_prompt_cache_stats(const dsi_session *session,
                                                  dsi_prompt_cache_stats *stats);

/* ---- since 0.3 — memory tiers (docs/placement.md) ------------------------------------- */

/* dsi_place_options.policy */
#define DSI_PLACE_AUTO 0u             /* all resident when it fits the budgets, else experts streamed */
#define DSI_PLACE_ALL_RESIDENT 1u     /* every tensor resident on the compute device */
#define DSI_PLACE_EXPERTS_HOST 2u     /* routed experts in host RAM (the CPU device: resident) */
#define DSI_PLACE_EXPERTS_STREAMED 3u /* routed experts read from the file into a bounded cache */

/* dsi_place_options.cache_policy: replacement in the expert cache */
#define DSI_CACHE_LRU 0u              /* least recently used (default) */
#define DSI_CACHE_LFU 1u              /* least frequently used (ties: least recent) */

/* dsi_place_options.flags */
#define DSI_PLACE_FLAG_NO_PREFETCH (1u << 0) /* no read-ahead of the next layer's experts */
/* since 0.3.1: the expert tier reads the disk tier with O_DIRECT (bypassing the page cache,
 * so streamed experts are not cached twice); a model loaded from a path in pread mode only
 * (INVALID_ARGUMENT otherwise; UNSUPPORTED where the file system refuses O_DIRECT) */
#define DSI_PLACE_FLAG_DIRECT_IO (1u << 1)

/* dsi_place_options.hybrid (since 0.3.1): how a GPU compute device runs the routed experts
 * it does not hold (host or disk tier) */
#define DSI_HYBRID_CPU 0u             /* the CPU instance computes them from host RAM (default) */
#define DSI_HYBRID_UPLOAD 1u          /* they are copied into an expert cache on the GPU and
                                         computed there (logits bit-identical to all-resident) */
/* since 0.3.1: chosen per step and layer — a step whose routed experts serve at least
 * hybrid_rows rows each on average uploads them (moving an expert then costs less than
 * computing its rows on the CPU), otherwise (decode, small batches) the CPU computes them
 * from host RAM; layers on disk always upload. Trades the batch-invariance of the logits for
 * speed: a prompt chunked differently, or rows sharing a step with other sessions' rows, may
 * give logits that differ in the last bits (the same steps always give the same logits) */
#define DSI_HYBRID_AUTO 2u
/* dsi_place_options.device_experts: as many per tiered layer as the device budget leaves */
#define DSI_DEVICE_EXPERTS_AUTO 0xFFFFFFFFu

/* Tiers (dsi_place_class.tier) */
#define DSI_TIER_DEVICE 0u            /* the compute device's memory (the CPU: host RAM, in use in place) */
#define DSI_TIER_HOST 1u              /* host RAM next to a GPU */
#define DSI_TIER_DISK 2u              /* the model file, read on demand (through a cache) */

typedef struct dsi_place_options {
    uint32_t struct_size;
    uint32_t policy;           /* DSI_PLACE_*; default AUTO */
    uint64_t device_budget;    /* bytes of device memory for weights; 0 = auto (the device's
                                  free memory; the CPU device: the host budget applies) */
    uint64_t host_budget;      /* bytes of library-owned host memory for weights and caches
                                  (pread-owned weights, the expert cache); 0 = auto (half of
                                  the physical memory). Mapped pages (DSI_ACCESS_MMAP) are
                                  page cache, not counted (reported as mapped_bytes). */
    /* Per-tensor overrides, llama.cpp -ot style: "PATTERN=TIER[,PATTERN=TIER...]", PATTERN a
     * glob on GGUF tensor names ('*', '?', '[0-9]' classes), TIER one of "device", "host",
     * "disk"; the first matching pattern wins. "disk" is valid for routed experts and Engram
     * tables only; the three expert tensors of a layer share one tier. NULL: none. Copied
     * during the load. */
    const char *overrides;
    uint32_t cache_policy;     /* DSI_CACHE_*; default LRU */
    uint32_t flags;            /* DSI_PLACE_FLAG_* */
    uint64_t engram_cache_bytes; /* a row cache for Engram tables in the disk tier (part of
                                    the host budget); 0 = none */
    /* since 0.3.1 */
    uint32_t hybrid;           /* DSI_HYBRID_*; default CPU. Ignored on the CPU device */
    uint32_t device_experts;   /* DSI_HYBRID_CPU: routed experts 0 .. N-1 of every tiered layer
                                  kept on the GPU (computed there while the CPU computes the
                                  rest of the step's experts); DSI_DEVICE_EXPERTS_AUTO: as many
                                  as the device budget leaves; default 0 (all on the CPU) */
    /* since 0.3.1: a routing profile — dsi_model_expert_counts of an earlier run of this
     * model (or of a workload like the coming one), layer-major [n_layers][n_experts] as that
     * call returns it. The expert cache (host or GPU) starts with the most often routed
     * experts that fit (read during the load), and DSI_HYBRID_CPU keeps, of every tiered
     * layer, the device_experts most often routed experts on the GPU (ties: the lower id)
     * instead of experts 0 .. N-1. Both are decided once, at the load: a session's logits
     * do not depend on other sessions. NULL: none. Copied during the load. */
    const uint64_t *expert_counts;
    uint64_t n_expert_counts;  /* entries of expert_counts: n_layers × n_experts of the model
                                  (INVALID_ARGUMENT otherwise) */
    uint32_t hybrid_rows;      /* since 0.3.1, DSI_HYBRID_AUTO: a step uploads when its routed
                                  experts serve this many rows each on average (n·k >=
                                  hybrid_rows × distinct experts); 0 = 16 */
} dsi_place_options;

/* since 0.3 — [thread-safe] Sets struct_size and zeroes the rest (policy AUTO, auto budgets). */
DSI_API void dsi_place_options_init(dsi_place_options *opt);

/* One class of tensors in a plan. */
typedef struct dsi_place_class {
    char name[32];             /* "embeddings", "attention", "router", "experts", "shared_experts",
                                  "engram", "draft", "other" */
    uint32_t tier;             /* DSI_TIER_* of most of its bytes */
    uint32_t n_tensors;
    uint64_t bytes;            /* bytes of its tensors as stored */
    uint64_t device_bytes;     /* split by tier */
    uint64_t host_bytes;
    uint64_t disk_bytes;
} dsi_place_class;

#define DSI_PLACE_MAX_CLASSES 8

typedef struct dsi_place_info {
    uint32_t struct_size;
    uint32_t policy;               /* the policy the plan was made with (AUTO resolved) */
    uint64_t device_budget;        /* effective budgets (bytes) */
    uint64_t host_budget;
    uint64_t device_bytes;         /* weights planned on the device (CPU device: in host RAM) */
    uint64_t host_bytes;           /* library-owned host memory of the plan (owned weights + caches) */
    uint64_t disk_bytes;           /* weights left in the file, read on demand */
    uint64_t mapped_bytes;         /* weights used in place from the mapping (page cache) */
    uint64_t expert_cache_bytes;   /* the expert cache (see expert_cache_tier) */
    uint32_t expert_cache_slots;   /* experts it holds */
    uint32_t cache_policy;         /* DSI_CACHE_* */
    uint32_t n_experts_streamed;   /* (layer, expert) pairs in the disk tier */
    uint32_t n_classes;
    dsi_place_class classes[8]; /* DSI_PLACE_MAX_CLASSES */
    /* live counters since the load (every session of the model) */
    uint64_t cache_hits;           /* expert uses found in the cache */
    uint64_t cache_misses;         /* expert uses that waited for a read */
    uint64_t prefetches;           /* experts read ahead of their layer */
    uint64_t prefetch_hits;        /* uses of an expert that a read-ahead brought in */
    uint64_t bytes_read;           /* bytes read from the file by the tiers */
    uint64_t bytes_uploaded;       /* bytes copied to the device by the tiers */
    uint64_t read_ns;              /* time spent in those reads (all threads) */
    uint64_t steps;                /* evaluation steps of the model's sessions */
    uint64_t cpu_experts;          /* (layer, expert) groups computed by the CPU instance */
    uint64_t device_experts;       /* ... by the GPU instance */
    uint64_t host_peak;            /* peak library-owned host bytes of the plan's tiers */
    uint64_t engram_cache_bytes;   /* the Engram row cache (part of host_bytes) */
    uint64_t engram_hits;          /* Engram rows found in the row cache */
    uint64_t engram_misses;        /* Engram rows read from the file */
    uint64_t engram_bytes_read;
    /* since 0.3.1 */
    uint32_t hybrid;               /* DSI_HYBRID_* in effect (GPU compute device with experts
                                      outside it), else 0 */
    uint32_t expert_cache_tier;    /* DSI_TIER_DEVICE: the expert cache is GPU memory (part of
                                      device_weight_bytes); DSI_TIER_HOST: host RAM (part of
                                      host_bytes) */
    uint64_t device_weight_bytes;  /* bytes allocated on the compute device for weights and the
                                      expert cache, counted from the backend's allocations
                                      (never above device_budget) */
    uint64_t device_used;          /* everything the compute device instance holds now
                                      (weights, caches, sessions' state and scratch) */
    uint32_t device_experts_per_layer; /* DSI_HYBRID_CPU: experts per tiered layer kept on the GPU */
    uint32_t reserved;
    uint64_t overlap_cpu_ns;       /* DSI_HYBRID_CPU: time the CPU instance spent on experts */
    uint64_t overlap_wait_ns;      /* ... time then spent waiting for the GPU's part */
} dsi_place_info;

/* since 0.3 — [thread-safe] Sets struct_size and zeroes the rest. */
DSI_API void dsi_place_info_init(dsi_place_info *info);

/* since 0.3 — [thread-safe] The model's placement plan and live counters (counters are read
 * without stopping running sessions: each is exact, together they are a near snapshot).
 * INVALID_ARGUMENT for NULL arguments or a bad struct_size. */
DSI_API dsi_status dsi_model_place_info(const dsi_model *model, dsi_place_info *info);

/* since 0.3.1 — [thread-safe] How often each routed expert was chosen since the load, over
 * every session of the model (prompt and generated rows, speculative verification rows),
 * layer-major: counts[l * n_experts + e] for backbone layer l (hash-routed layers too; draft
 * blocks not counted). Counted where the routing ids reach the host anyway: on the CPU
 * device, and for the tiered layers of a GPU model (experts in host RAM or on disk); layers
 * whose experts are resident on a GPU count 0 (reading their ids would cost a
 * synchronisation per layer). Each entry is exact; together they are a near snapshot while
 * sessions run. The result can be given back as dsi_place_options.expert_counts.
 * Two-call pattern: *n_needed (may be NULL) = n_layers × n_experts always; the counts are
 * written only when `cap` holds them all (INVALID_ARGUMENT otherwise, nothing written).
 * n_layers / n_experts may be NULL. INVALID_ARGUMENT for a NULL model, or NULL counts with
 * a non-zero cap; UNSUPPORTED for a model without routed experts or forward pass. */
DSI_API dsi_status dsi_model_expert_counts(const dsi_model *model, uint64_t *counts, uint64_t cap,
                                           uint64_t *n_needed, uint32_t *n_layers,
                                           uint32_t *n_experts);

#endif /* DSI_EXPERIMENTAL */

#ifdef __cplusplus
}
#endif

#endif /* DSINFER_H */
