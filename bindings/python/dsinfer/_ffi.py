"""Low-level ctypes declarations of include/dsinfer.h and the library search.

Everything here mirrors the C header one to one (names without the ``dsi_`` prefix for
structs). tests/test_abi.py checks the structs against tests/abi/struct-layout.txt (which
the C ABI test pins against the header) and the prototypes against the header text.
"""

import ctypes
import ctypes.util
import glob
import os
import subprocess

# The ABI version this binding was written against (DSI_ABI_VERSION of include/dsinfer.h).
ABI_VERSION = 2

LIBRARY_ENV = "DSINFER_LIBRARY"
SONAME = "libdsinfer.so.0"


class LibraryNotFound(OSError):
    """No libdsinfer shared library could be loaded; the message lists what was tried."""


def _source_root():
    """The repository root if this package is imported from a source checkout, else None."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    if os.path.isfile(os.path.join(root, "include", "dsinfer.h")) and \
            os.path.isdir(os.path.join(root, "bindings", "python")):
        return root
    return None


def _build_tree_candidates():
    root = _source_root()
    if not root:
        return []
    found = []
    for pattern in ("build*", "builddir*"):
        for d in glob.glob(os.path.join(root, pattern)):
            lib = os.path.join(d, SONAME)
            if os.path.isfile(lib):
                found.append(lib)
    # the most recently built first
    found.sort(key=lambda p: os.path.getmtime(p), reverse=True)
    return found


def _pkg_config_candidate():
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "dsinfer"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    libdir = out.stdout.strip()
    if out.returncode != 0 or not libdir:
        return None
    return os.path.join(libdir, SONAME)


def find_library():
    """Returns (path, tried): the library to load, in this order:

    1. ``$DSINFER_LIBRARY`` (a file, or a directory holding libdsinfer.so.0);
    2. the build tree, when this package is imported from a source checkout: the newest
       ``build*/libdsinfer.so.0`` or ``builddir*/libdsinfer.so.0`` of the checkout;
    3. ``pkg-config --variable=libdir dsinfer`` (an installed library);
    4. the dynamic loader's own search (``LD_LIBRARY_PATH``, ldconfig cache).
    """
    tried = []
    env = os.environ.get(LIBRARY_ENV)
    if env:
        path = os.path.join(env, SONAME) if os.path.isdir(env) else env
        return path, [LIBRARY_ENV + "=" + env]
    for cand in _build_tree_candidates():
        return cand, ["build tree"]
    tried.append("build tree (none)")
    cand = _pkg_config_candidate()
    if cand and os.path.isfile(cand):
        return cand, tried + ["pkg-config"]
    tried.append("pkg-config (%s)" % (cand or "not found"))
    return SONAME, tried + ["dynamic loader"]


def load_library():
    path, tried = find_library()
    try:
        return ctypes.CDLL(path), path
    except OSError as e:
        raise LibraryNotFound("cannot load libdsinfer (%s; tried: %s): %s"
                              % (path, ", ".join(tried), e)) from None


# ---- constants (include/dsinfer.h) ------------------------------------------------------

OK = 0
ERR_INVALID_ARGUMENT = -1
ERR_OUT_OF_HOST_MEMORY = -2
ERR_OUT_OF_DEVICE_MEMORY = -3
ERR_IO = -4
ERR_BAD_FORMAT = -5
ERR_UNSUPPORTED = -6
ERR_BACKEND = -7
ERR_CANCELLED = -8
ERR_CONTEXT_FULL = -9
ERR_STATE_MISMATCH = -10
ERR_ABI_MISMATCH = -11
ERR_BUSY = -12
ERR_NOT_FOUND = -13
ERR_INTERNAL = -14

LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_NONE = 0, 1, 2, 3, 4
ACCESS_MMAP, ACCESS_PREAD, ACCESS_READER = 0, 1, 2
MODEL_FLAG_VERIFY_FILE = 1 << 1
MODEL_FLAG_RESIDENT = 1 << 2
# experimental section of the header (DSI_EXPERIMENTAL; since 0.2)
MODEL_FLAG_COALESCE = 1 << 0
SESSION_FLAG_NO_CAPTURE = 1 << 16
SESSION_FLAG_F32_STATE = 1 << 17  # since 0.3
ARCH_UNKNOWN, ARCH_DEEPSEEK4, ARCH_DEEPSEEK41 = 0, 1, 2
TOKENIZE_PARSE_SPECIAL = 1 << 0
TOKENIZE_ADD_BOS = 1 << 1
SPECIAL_BOS, SPECIAL_EOS, SPECIAL_PAD, SPECIAL_USER, SPECIAL_ASSISTANT, \
    SPECIAL_THINK_BEGIN, SPECIAL_THINK_END = range(7)
ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL = 0, 1, 2, 3
THINKING_OFF, THINKING_ON, THINKING_MAX = 0, 1, 2
SESSION_FLAG_NO_FAKE_QUANT = 1 << 0
FINISH_NONE, FINISH_LENGTH, FINISH_EOS, FINISH_STOP_TOKEN, FINISH_STOP_STRING, \
    FINISH_CALLBACK, FINISH_CANCELLED, FINISH_CONTEXT_FULL = range(8)

# ---- types ------------------------------------------------------------------------------

c_status = ctypes.c_int32
c_token = ctypes.c_int32
c_char_pp = ctypes.POINTER(ctypes.c_char_p)

LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p)
MALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
REALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64,
                               ctypes.c_uint64, ctypes.c_void_p)
PREAD_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_uint64, ctypes.c_uint64)
CLOSE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# text is not NUL-terminated: a plain pointer, read with ctypes.string_at(text, len)
TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int32, c_token, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_void_p)


class Struct(ctypes.Structure):
    """Base of the public structs; ``struct_size`` is always the first field."""


class context_options(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("abi_version", ctypes.c_uint32),
                ("log_fn", LOG_FN), ("log_user_data", ctypes.c_void_p),
                ("log_level", ctypes.c_int32), ("n_threads", ctypes.c_int32),
                ("malloc_fn", MALLOC_FN), ("realloc_fn", REALLOC_FN), ("free_fn", FREE_FN),
                ("alloc_user_data", ctypes.c_void_p),
                ("backend", ctypes.c_char_p), ("backend_dir", ctypes.c_char_p),
                ("device_index", ctypes.c_int32), ("flags", ctypes.c_uint32),
                ("devices", ctypes.c_char_p)]  # since ABI 2


class device_info(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("type", ctypes.c_int32),
                ("backend", ctypes.c_char * 16), ("name", ctypes.c_char * 256),
                ("memory_total", ctypes.c_uint64), ("memory_free", ctypes.c_uint64),
                ("max_buffer_size", ctypes.c_uint64), ("features", ctypes.c_uint32),
                ("subgroup_size", ctypes.c_uint32), ("index", ctypes.c_int32),
                ("reserved", ctypes.c_int32)]


class model_options(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("access", ctypes.c_int32),
                ("progress_fn", PROGRESS_FN), ("progress_user_data", ctypes.c_void_p),
                ("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("draft_path", ctypes.c_char_p),
                ("place", ctypes.c_void_p)]  # experimental dsi_place_options * (NULL)


class reader(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("size", ctypes.c_uint64), ("pread_fn", PREAD_FN), ("close_fn", CLOSE_FN),
                ("user_data", ctypes.c_void_p)]


class model_info(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("arch", ctypes.c_int32),
                ("arch_name", ctypes.c_char * 32), ("name", ctypes.c_char * 128),
                ("n_layers", ctypes.c_int32), ("n_embd", ctypes.c_int32),
                ("n_vocab", ctypes.c_int32), ("n_heads", ctypes.c_int32),
                ("n_ctx_train", ctypes.c_int32), ("n_experts", ctypes.c_int32),
                ("n_experts_used", ctypes.c_int32), ("n_draft_layers", ctypes.c_int32),
                ("has_mtp", ctypes.c_int32), ("has_dspark", ctypes.c_int32),
                ("has_engram", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("n_params", ctypes.c_uint64), ("weight_bytes", ctypes.c_uint64),
                ("fingerprint", ctypes.c_uint8 * 32)]


class chat_message(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("role", ctypes.c_int32),
                ("content", ctypes.c_char_p), ("reasoning", ctypes.c_char_p)]


class chat_options(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("thinking", ctypes.c_int32),
                ("add_generation_prompt", ctypes.c_int32), ("add_bos", ctypes.c_int32)]


class session_options(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("n_ctx", ctypes.c_uint32),
                ("n_batch", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                # experimental (since 0.3): speculative decoding, docs/spec.md
                ("spec", ctypes.c_uint32), ("draft_max", ctypes.c_uint32),
                ("draft_confidence", ctypes.c_float), ("spec_reserved", ctypes.c_uint32)]


class logit_bias(ctypes.Structure):
    _fields_ = [("token", c_token), ("bias", ctypes.c_float)]


class sampler_options(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("temperature", ctypes.c_float),
                ("top_k", ctypes.c_int32), ("top_p", ctypes.c_float),
                ("min_p", ctypes.c_float), ("repetition_penalty", ctypes.c_float),
                ("frequency_penalty", ctypes.c_float), ("presence_penalty", ctypes.c_float),
                ("penalty_last_n", ctypes.c_int32), ("reserved", ctypes.c_uint32),
                ("seed", ctypes.c_uint64), ("logit_bias", ctypes.POINTER(logit_bias)),
                ("n_logit_bias", ctypes.c_size_t)]


class generate_options(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("max_tokens", ctypes.c_int32),
                ("prompt", ctypes.POINTER(c_token)), ("n_prompt", ctypes.c_size_t),
                ("stop_tokens", ctypes.POINTER(c_token)), ("n_stop_tokens", ctypes.c_size_t),
                ("stop_strings", c_char_pp), ("n_stop_strings", ctypes.c_size_t),
                ("on_token", TOKEN_FN), ("user_data", ctypes.c_void_p),
                ("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


class generate_result(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("finish_reason", ctypes.c_int32),
                ("n_prompt", ctypes.c_uint64), ("n_reused", ctypes.c_uint64),
                ("n_generated", ctypes.c_uint64), ("prefill_ms", ctypes.c_double),
                ("decode_ms", ctypes.c_double),
                # experimental (since 0.3): speculative decoding counters
                ("n_spec_steps", ctypes.c_uint64), ("n_drafted", ctypes.c_uint64),
                ("n_accepted", ctypes.c_uint64)]


# experimental (since 0.2): snapshots and the prompt cache, docs/snapshots.md
WRITE_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
READ_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class prompt_cache_options(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("chunk_tokens", ctypes.c_uint32),
                ("dir", ctypes.c_char_p), ("max_bytes", ctypes.c_uint64),
                ("min_tokens", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


class prompt_cache_stats(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("hits", ctypes.c_uint64), ("misses", ctypes.c_uint64),
                ("tokens_restored", ctypes.c_uint64), ("writes", ctypes.c_uint64),
                ("bytes_written", ctypes.c_uint64), ("write_errors", ctypes.c_uint64),
                ("evictions", ctypes.c_uint64), ("corrupt_removed", ctypes.c_uint64),
                ("write_ns", ctypes.c_uint64), ("read_ns", ctypes.c_uint64)]


class place_options(Struct):
    """Experimental: memory tiers (docs/placement.md)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("policy", ctypes.c_uint32),
                ("device_budget", ctypes.c_uint64), ("host_budget", ctypes.c_uint64),
                ("overrides", ctypes.c_char_p), ("cache_policy", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("engram_cache_bytes", ctypes.c_uint64),
                ("hybrid", ctypes.c_uint32), ("device_experts", ctypes.c_uint32),
                ("expert_counts", ctypes.POINTER(ctypes.c_uint64)),
                ("n_expert_counts", ctypes.c_uint64), ("hybrid_rows", ctypes.c_uint32)]


class place_class(Struct):
    _fields_ = [("name", ctypes.c_char * 32), ("tier", ctypes.c_uint32),
                ("n_tensors", ctypes.c_uint32), ("bytes", ctypes.c_uint64),
                ("device_bytes", ctypes.c_uint64), ("host_bytes", ctypes.c_uint64),
                ("disk_bytes", ctypes.c_uint64)]


class place_info(Struct):
    _fields_ = [("struct_size", ctypes.c_uint32), ("policy", ctypes.c_uint32),
                ("device_budget", ctypes.c_uint64), ("host_budget", ctypes.c_uint64),
                ("device_bytes", ctypes.c_uint64), ("host_bytes", ctypes.c_uint64),
                ("disk_bytes", ctypes.c_uint64), ("mapped_bytes", ctypes.c_uint64),
                ("expert_cache_bytes", ctypes.c_uint64), ("expert_cache_slots", ctypes.c_uint32),
                ("cache_policy", ctypes.c_uint32), ("n_experts_streamed", ctypes.c_uint32),
                ("n_classes", ctypes.c_uint32), ("classes", place_class * 8),
                ("cache_hits", ctypes.c_uint64), ("cache_misses", ctypes.c_uint64),
                ("prefetches", ctypes.c_uint64), ("prefetch_hits", ctypes.c_uint64),
                ("bytes_read", ctypes.c_uint64), ("bytes_uploaded", ctypes.c_uint64),
                ("read_ns", ctypes.c_uint64), ("steps", ctypes.c_uint64),
                ("cpu_experts", ctypes.c_uint64), ("device_experts", ctypes.c_uint64),
                ("host_peak", ctypes.c_uint64), ("engram_cache_bytes", ctypes.c_uint64),
                ("engram_hits", ctypes.c_uint64), ("engram_misses", ctypes.c_uint64),
                ("engram_bytes_read", ctypes.c_uint64), ("hybrid", ctypes.c_uint32),
                ("expert_cache_tier", ctypes.c_uint32), ("device_weight_bytes", ctypes.c_uint64),
                ("device_used", ctypes.c_uint64), ("device_experts_per_layer", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32), ("overlap_cpu_ns", ctypes.c_uint64),
                ("overlap_wait_ns", ctypes.c_uint64)]


# Opaque handles are plain void pointers.
H = ctypes.c_void_p
P = ctypes.POINTER
sz = ctypes.c_size_t
u32, i32, u64 = ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64

# name: (restype, [argtypes]) — the prototypes of include/dsinfer.h.
PROTOTYPES = {
    "dsi_version_string": (ctypes.c_char_p, []),
    "dsi_version": (None, [P(u32), P(u32), P(u32)]),
    "dsi_abi_version": (u32, []),
    "dsi_status_string": (ctypes.c_char_p, [c_status]),
    "dsi_last_error": (ctypes.c_char_p, []),
    "dsi_context_options_init": (None, [P(context_options), u32]),
    "dsi_context_create": (c_status, [P(context_options), P(H)]),
    "dsi_context_free": (c_status, [H]),
    "dsi_context_last_error": (ctypes.c_char_p, [H]),
    "dsi_context_backend": (ctypes.c_char_p, [H]),
    "dsi_context_n_threads": (i32, [H]),
    "dsi_device_info_init": (None, [P(device_info)]),
    "dsi_context_device_count": (c_status, [H, P(i32)]),
    "dsi_context_device_info": (c_status, [H, i32, P(device_info)]),
    "dsi_model_options_init": (None, [P(model_options)]),
    "dsi_reader_init": (None, [P(reader)]),
    "dsi_model_load": (c_status, [H, ctypes.c_char_p, P(model_options), P(H)]),
    "dsi_model_load_from_reader": (c_status, [H, P(reader), P(model_options), P(H)]),
    "dsi_model_free": (c_status, [H]),
    "dsi_model_last_error": (ctypes.c_char_p, [H]),
    "dsi_model_info_init": (None, [P(model_info)]),
    "dsi_model_get_info": (c_status, [H, P(model_info)]),
    "dsi_type_name": (ctypes.c_char_p, [i32]),
    "dsi_model_type_bytes": (c_status, [H, i32, P(u64)]),
    "dsi_model_meta_count": (c_status, [H, P(i32)]),
    "dsi_model_meta_key": (c_status, [H, i32, ctypes.c_char_p, sz, P(sz)]),
    "dsi_model_meta_value": (c_status, [H, i32, ctypes.c_char_p, sz, P(sz)]),
    "dsi_model_meta_find": (c_status, [H, ctypes.c_char_p, ctypes.c_char_p, sz, P(sz)]),
    "dsi_tokenize": (c_status, [H, ctypes.c_char_p, sz, u32, P(c_token), sz, P(sz)]),
    "dsi_token_to_bytes": (c_status, [H, c_token, ctypes.c_char_p, sz, P(sz)]),
    "dsi_detokenize": (c_status, [H, P(c_token), sz, ctypes.c_char_p, sz, P(sz)]),
    "dsi_model_special_token": (c_status, [H, i32, P(c_token)]),
    "dsi_detokenizer_create": (c_status, [H, P(H)]),
    "dsi_detokenizer_feed": (c_status, [H, c_token, ctypes.c_char_p, sz, P(sz)]),
    "dsi_detokenizer_flush": (c_status, [H, ctypes.c_char_p, sz, P(sz)]),
    "dsi_detokenizer_free": (None, [H]),
    "dsi_chat_message_init": (None, [P(chat_message)]),
    "dsi_chat_options_init": (None, [P(chat_options)]),
    "dsi_chat_render": (c_status, [H, P(P(chat_message)), sz, P(chat_options),
                                   ctypes.c_char_p, sz, P(sz)]),
    "dsi_chat_tokenize": (c_status, [H, P(P(chat_message)), sz, P(chat_options),
                                     P(c_token), sz, P(sz)]),
    "dsi_session_options_init": (None, [P(session_options)]),
    "dsi_session_create": (c_status, [H, P(session_options), P(H)]),
    "dsi_session_free": (None, [H]),
    "dsi_session_last_error": (ctypes.c_char_p, [H]),
    "dsi_session_sync": (c_status, [H, P(c_token), sz, P(sz)]),
    "dsi_session_append": (c_status, [H, P(c_token), sz]),
    "dsi_session_logits": (c_status, [H, P(P(ctypes.c_float)), P(i32)]),
    "dsi_session_position": (c_status, [H, P(u32)]),
    "dsi_session_tokens": (c_status, [H, P(c_token), sz, P(sz)]),
    "dsi_session_reset": (c_status, [H]),
    "dsi_session_cancel": (None, [H]),
    "dsi_session_cancel_clear": (None, [H]),
    "dsi_sampler_options_init": (None, [P(sampler_options)]),
    "dsi_sampler_create": (c_status, [P(sampler_options), P(H)]),
    "dsi_sampler_create_with_context": (c_status, [H, P(sampler_options), P(H)]),
    "dsi_sampler_free": (None, [H]),
    "dsi_sampler_last_error": (ctypes.c_char_p, [H]),
    "dsi_sampler_sample": (c_status, [H, P(ctypes.c_float), i32, P(c_token)]),
    "dsi_sampler_accept": (c_status, [H, c_token]),
    "dsi_sampler_reset": (c_status, [H]),
    "dsi_sampler_probs": (c_status, [H, P(P(ctypes.c_float)), P(i32)]),
    "dsi_generate_options_init": (None, [P(generate_options)]),
    "dsi_generate_result_init": (None, [P(generate_result)]),
    "dsi_session_generate": (c_status, [H, H, P(generate_options), P(generate_result)]),
    # experimental (DSI_EXPERIMENTAL, since 0.2); exported by the library either way
    "dsi_session_append_batch": (c_status, [sz, P(H), P(P(c_token)), P(sz), P(c_status)]),
    # experimental (since 0.3): speculative decoding
    "dsi_session_draft": (c_status, [H, c_token, P(c_token), P(ctypes.c_float), sz, P(sz)]),
    # experimental (since 0.2): snapshots and the prompt cache
    "dsi_session_save": (c_status, [H, WRITE_FN, ctypes.c_void_p, P(u64)]),
    "dsi_session_save_buffer": (c_status, [H, ctypes.c_void_p, sz, P(sz)]),
    "dsi_session_save_file": (c_status, [H, ctypes.c_char_p]),
    "dsi_session_load": (c_status, [H, READ_FN, ctypes.c_void_p]),
    "dsi_session_load_buffer": (c_status, [H, ctypes.c_void_p, sz]),
    "dsi_session_load_file": (c_status, [H, ctypes.c_char_p]),
    "dsi_prompt_cache_options_init": (None, [P(prompt_cache_options)]),
    "dsi_session_set_prompt_cache": (c_status, [H, P(prompt_cache_options)]),
    "dsi_prompt_cache_stats_init": (None, [P(prompt_cache_stats)]),
    "dsi_session_prompt_cache_stats": (c_status, [H, P(prompt_cache_stats)]),
    "dsi_place_options_init": (None, [P(place_options)]),
    "dsi_place_info_init": (None, [P(place_info)]),
    "dsi_model_place_info": (c_status, [H, P(place_info)]),
    "dsi_model_expert_counts": (c_status, [H, P(u64), u64, P(u64), P(ctypes.c_uint32),
                                           P(ctypes.c_uint32)]),
}

# Functions that a newer library may add (declared when present, see bind()).
OPTIONAL = {}


def bind(lib):
    """Sets restype/argtypes on every function of PROTOTYPES (all must exist)."""
    for name, (res, args) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    for name, (res, args) in OPTIONAL.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = res
            fn.argtypes = args
    return lib


# Slack after a struct when the library's *_init() fills it: a newer library may know a
# larger struct and zero-fill all of it, so init writes into a padded scratch buffer.
_INIT_SLACK = 4096


def init_struct(cls, init_fn, *args):
    """A ``cls`` filled with the library's defaults, declaring only this binding's size.

    The library's ``*_init()`` writes its own ``sizeof`` worth of bytes, which may exceed
    ours when the library is newer; it therefore runs on a padded scratch buffer and only
    our prefix is kept, with ``struct_size = sizeof(cls)`` so the library uses its own
    defaults for any field this binding does not know (docs/api.md, "Options").
    """
    scratch = (ctypes.c_char * (ctypes.sizeof(cls) + _INIT_SLACK))()
    init_fn(ctypes.cast(scratch, ctypes.POINTER(cls)), *args)
    out = cls()
    ctypes.memmove(ctypes.addressof(out), scratch, ctypes.sizeof(cls))
    out.struct_size = ctypes.sizeof(cls)
    return out
