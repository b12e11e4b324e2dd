//! Raw declarations of `include/dsinfer.h`, written by hand (no bindgen).
//!
//! `tests/header.rs` parses the C header and checks every function, constant, struct field
//! and callback type declared here against it, and every struct's layout against
//! `tests/abi/struct-layout.txt` (which the C ABI test pins against the header). Use the
//! safe `dsinfer` crate unless you need the C API itself.
#![allow(non_camel_case_types)]

pub use std::os::raw::{c_char, c_void};

/// The ABI version these declarations describe (`DSI_ABI_VERSION`).
pub const DSI_ABI_VERSION: u32 = 2;
pub const DSI_VERSION_MAJOR: u32 = 0;
pub const DSI_VERSION_MINOR: u32 = 1;
pub const DSI_VERSION_PATCH: u32 = 0;

pub type dsi_status = i32;
pub type dsi_token = i32;

pub const DSI_OK: dsi_status = 0;
pub const DSI_ERR_INVALID_ARGUMENT: dsi_status = -1;
pub const DSI_ERR_OUT_OF_HOST_MEMORY: dsi_status = -2;
pub const DSI_ERR_OUT_OF_DEVICE_MEMORY: dsi_status = -3;
pub const DSI_ERR_IO: dsi_status = -4;
pub const DSI_ERR_BAD_FORMAT: dsi_status = -5;
pub const DSI_ERR_UNSUPPORTED: dsi_status = -6;
pub const DSI_ERR_BACKEND: dsi_status = -7;
pub const DSI_ERR_CANCELLED: dsi_status = -8;
pub const DSI_ERR_CONTEXT_FULL: dsi_status = -9;
pub const DSI_ERR_STATE_MISMATCH: dsi_status = -10;
pub const DSI_ERR_ABI_MISMATCH: dsi_status = -11;
pub const DSI_ERR_BUSY: dsi_status = -12;
pub const DSI_ERR_NOT_FOUND: dsi_status = -13;
pub const DSI_ERR_INTERNAL: dsi_status = -14;

// Opaque handles.
#[repr(C)]
pub struct dsi_context {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dsi_model {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dsi_session {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dsi_sampler {
    _private: [u8; 0],
}
#[repr(C)]
pub struct dsi_detokenizer {
    _private: [u8; 0],
}

// ---- context ------------------------------------------------------------------------------

pub const DSI_LOG_DEBUG: i32 = 0;
pub const DSI_LOG_INFO: i32 = 1;
pub const DSI_LOG_WARN: i32 = 2;
pub const DSI_LOG_ERROR: i32 = 3;
pub const DSI_LOG_NONE: i32 = 4;

pub type dsi_log_fn =
    Option<unsafe extern "C" fn(level: i32, message: *const c_char, user_data: *mut c_void)>;
pub type dsi_malloc_fn = Option<unsafe extern "C" fn(size: usize, user_data: *mut c_void) -> *mut c_void>;
pub type dsi_realloc_fn =
    Option<unsafe extern "C" fn(ptr: *mut c_void, size: usize, user_data: *mut c_void) -> *mut c_void>;
pub type dsi_free_fn = Option<unsafe extern "C" fn(ptr: *mut c_void, user_data: *mut c_void)>;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_context_options {
    pub struct_size: u32,
    pub abi_version: u32,
    pub log_fn: dsi_log_fn,
    pub log_user_data: *mut c_void,
    pub log_level: i32,
    pub n_threads: i32,
    pub malloc_fn: dsi_malloc_fn,
    pub realloc_fn: dsi_realloc_fn,
    pub free_fn: dsi_free_fn,
    pub alloc_user_data: *mut c_void,
    pub backend: *const c_char,
    pub backend_dir: *const c_char,
    pub device_index: i32,
    pub flags: u32,
    /// since ABI 2: "backend[:index],..." devices to open; NULL = backend + device_index
    pub devices: *const c_char,
}

/// since 0.2: the CPU backend multiplies with f32 activations (the exact path)
pub const DSI_CONTEXT_FLAG_EXACT_MATMUL: u32 = 1 << 0;

pub const DSI_DEVICE_CPU: i32 = 0;
pub const DSI_DEVICE_DISCRETE_GPU: i32 = 1;
pub const DSI_DEVICE_INTEGRATED_GPU: i32 = 2;
pub const DSI_DEVICE_VIRTUAL_GPU: i32 = 3;
pub const DSI_DEVICE_SOFTWARE: i32 = 4;
pub const DSI_DEVICE_OTHER: i32 = 5;

pub const DSI_DEVICE_FEATURE_FP16: u32 = 1 << 0;
pub const DSI_DEVICE_FEATURE_STORAGE_16: u32 = 1 << 1;
pub const DSI_DEVICE_FEATURE_STORAGE_8: u32 = 1 << 2;
pub const DSI_DEVICE_FEATURE_SUBGROUPS: u32 = 1 << 3;
pub const DSI_DEVICE_FEATURE_INT_DOT: u32 = 1 << 4;
pub const DSI_DEVICE_FEATURE_BF16: u32 = 1 << 5;
pub const DSI_DEVICE_FEATURE_COOPMAT: u32 = 1 << 6;
pub const DSI_DEVICE_FEATURE_AVX2: u32 = 1 << 16;
pub const DSI_DEVICE_FEATURE_AVX512: u32 = 1 << 17;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_device_info {
    pub struct_size: u32,
    pub type_: i32,
    pub backend: [c_char; 16],
    pub name: [c_char; 256],
    pub memory_total: u64,
    pub memory_free: u64,
    pub max_buffer_size: u64,
    pub features: u32,
    pub subgroup_size: u32,
    pub index: i32,
    pub reserved: i32,
}

// ---- model --------------------------------------------------------------------------------

pub const DSI_ACCESS_MMAP: i32 = 0;
pub const DSI_ACCESS_PREAD: i32 = 1;
pub const DSI_ACCESS_READER: i32 = 2;

pub const DSI_MODEL_FLAG_VERIFY_FILE: u32 = 1 << 1;
pub const DSI_MODEL_FLAG_RESIDENT: u32 = 1 << 2;
// Experimental section of the header (DSI_EXPERIMENTAL; since 0.2).
pub const DSI_MODEL_FLAG_COALESCE: u32 = 1 << 0;
pub const DSI_SESSION_FLAG_NO_CAPTURE: u32 = 1 << 16;
// since 0.3
pub const DSI_SESSION_FLAG_F32_STATE: u32 = 1 << 17;

pub const DSI_LOAD_STAGE_HEADER: i32 = 0;
pub const DSI_LOAD_STAGE_VALIDATE: i32 = 1;
pub const DSI_LOAD_STAGE_TENSORS: i32 = 2;
pub const DSI_LOAD_STAGE_UPLOAD: i32 = 3;
pub const DSI_LOAD_STAGE_DONE: i32 = 4;

pub type dsi_progress_fn =
    Option<unsafe extern "C" fn(stage: i32, done: u64, total: u64, user_data: *mut c_void) -> i32>;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_model_options {
    pub struct_size: u32,
    pub access: i32,
    pub progress_fn: dsi_progress_fn,
    pub progress_user_data: *mut c_void,
    pub flags: u32,
    pub reserved: u32,
    /// since 0.2: a second GGUF holding the draft blocks; NULL = none
    pub draft_path: *const c_char,
    /// since 0.3, experimental: memory tiers (`dsi_place_options *`); NULL = all resident
    pub place: *const dsi_place_options,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_reader {
    pub struct_size: u32,
    pub reserved: u32,
    pub size: u64,
    pub pread_fn: Option<
        unsafe extern "C" fn(user_data: *mut c_void, buf: *mut c_void, size: u64, offset: u64) -> i32,
    >,
    pub close_fn: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    pub user_data: *mut c_void,
}

pub const DSI_ARCH_UNKNOWN: i32 = 0;
pub const DSI_ARCH_DEEPSEEK4: i32 = 1;
pub const DSI_ARCH_DEEPSEEK41: i32 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_model_info {
    pub struct_size: u32,
    pub arch: i32,
    pub arch_name: [c_char; 32],
    pub name: [c_char; 128],
    pub n_layers: i32,
    pub n_embd: i32,
    pub n_vocab: i32,
    pub n_heads: i32,
    pub n_ctx_train: i32,
    pub n_experts: i32,
    pub n_experts_used: i32,
    pub n_draft_layers: i32,
    pub has_mtp: i32,
    pub has_dspark: i32,
    pub has_engram: i32,
    pub reserved: i32,
    pub n_params: u64,
    pub weight_bytes: u64,
    pub fingerprint: [u8; 32],
}

pub const DSI_TYPE_F32: i32 = 0;
pub const DSI_TYPE_F16: i32 = 1;
pub const DSI_TYPE_Q8_0: i32 = 8;
pub const DSI_TYPE_Q2_K: i32 = 10;
pub const DSI_TYPE_Q4_K: i32 = 12;
pub const DSI_TYPE_IQ2_XXS: i32 = 16;
pub const DSI_TYPE_I8: i32 = 24;
pub const DSI_TYPE_I16: i32 = 25;
pub const DSI_TYPE_I32: i32 = 26;
pub const DSI_TYPE_I64: i32 = 27;
pub const DSI_TYPE_F64: i32 = 28;
pub const DSI_TYPE_BF16: i32 = 30;
pub const DSI_TYPE_MXFP4: i32 = 39;
pub const DSI_TYPE_FP8_E4M3_B128: i32 = 1024;
pub const DSI_TYPE_FP8_E4M3_B32: i32 = 1025;
pub const DSI_TYPE_FP8_E4M3_R32: i32 = 1026;

// ---- tokenizer and chat -------------------------------------------------------------------

pub const DSI_TOKENIZE_PARSE_SPECIAL: u32 = 1 << 0;
pub const DSI_TOKENIZE_ADD_BOS: u32 = 1 << 1;

pub const DSI_SPECIAL_BOS: i32 = 0;
pub const DSI_SPECIAL_EOS: i32 = 1;
pub const DSI_SPECIAL_PAD: i32 = 2;
pub const DSI_SPECIAL_USER: i32 = 3;
pub const DSI_SPECIAL_ASSISTANT: i32 = 4;
pub const DSI_SPECIAL_THINK_BEGIN: i32 = 5;
pub const DSI_SPECIAL_THINK_END: i32 = 6;

pub const DSI_ROLE_SYSTEM: i32 = 0;
pub const DSI_ROLE_USER: i32 = 1;
pub const DSI_ROLE_ASSISTANT: i32 = 2;
pub const DSI_ROLE_TOOL: i32 = 3;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_chat_message {
    pub struct_size: u32,
    pub role: i32,
    pub content: *const c_char,
    pub reasoning: *const c_char,
}

pub const DSI_THINKING_OFF: i32 = 0;
pub const DSI_THINKING_ON: i32 = 1;
pub const DSI_THINKING_MAX: i32 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_chat_options {
    pub struct_size: u32,
    pub thinking: i32,
    pub add_generation_prompt: i32,
    pub add_bos: i32,
}

// ---- session, sampler, generation ---------------------------------------------------------

pub const DSI_SESSION_FLAG_NO_FAKE_QUANT: u32 = 1 << 0;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_session_options {
    pub struct_size: u32,
    pub n_ctx: u32,
    pub n_batch: u32,
    pub flags: u32,
    /// since 0.3, experimental: DSI_SPEC_OFF / DSI_SPEC_ON / DSI_SPEC_AUTO
    pub spec: u32,
    pub draft_max: u32,
    pub draft_confidence: f32,
    pub spec_reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_logit_bias {
    pub token: dsi_token,
    pub bias: f32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_sampler_options {
    pub struct_size: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub penalty_last_n: i32,
    pub reserved: u32,
    pub seed: u64,
    pub logit_bias: *const dsi_logit_bias,
    pub n_logit_bias: usize,
}

pub type dsi_token_fn = Option<
    unsafe extern "C" fn(token: dsi_token, text: *const c_char, text_len: usize, user_data: *mut c_void) -> i32,
>;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_generate_options {
    pub struct_size: u32,
    pub max_tokens: i32,
    pub prompt: *const dsi_token,
    pub n_prompt: usize,
    pub stop_tokens: *const dsi_token,
    pub n_stop_tokens: usize,
    pub stop_strings: *const *const c_char,
    pub n_stop_strings: usize,
    pub on_token: dsi_token_fn,
    pub user_data: *mut c_void,
    pub flags: u32,
    pub reserved: u32,
}

pub const DSI_FINISH_NONE: i32 = 0;
pub const DSI_FINISH_LENGTH: i32 = 1;
pub const DSI_FINISH_EOS: i32 = 2;
pub const DSI_FINISH_STOP_TOKEN: i32 = 3;
pub const DSI_FINISH_STOP_STRING: i32 = 4;
pub const DSI_FINISH_CALLBACK: i32 = 5;
pub const DSI_FINISH_CANCELLED: i32 = 6;
pub const DSI_FINISH_CONTEXT_FULL: i32 = 7;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_generate_result {
    pub struct_size: u32,
    pub finish_reason: i32,
    pub n_prompt: u64,
    pub n_reused: u64,
    pub n_generated: u64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// since 0.3, experimental: speculative decoding counters
    pub n_spec_steps: u64,
    pub n_drafted: u64,
    pub n_accepted: u64,
}

// Experimental section (DSI_EXPERIMENTAL): speculative decoding, snapshots, prompt cache.
pub const DSI_SPEC_OFF: u32 = 0;
pub const DSI_SPEC_ON: u32 = 1;
pub const DSI_SPEC_AUTO: u32 = 2;

pub type dsi_write_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, data: *const c_void, size: usize) -> i32>;
pub type dsi_read_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, data: *mut c_void, size: usize) -> i32>;

pub const DSI_PROMPT_CACHE_NO_WRITE: u32 = 1 << 0;
pub const DSI_PROMPT_CACHE_NO_READ: u32 = 1 << 1;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_prompt_cache_options {
    pub struct_size: u32,
    pub chunk_tokens: u32,
    pub dir: *const c_char,
    pub max_bytes: u64,
    pub min_tokens: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_prompt_cache_stats {
    pub struct_size: u32,
    pub reserved: u32,
    pub hits: u64,
    pub misses: u64,
    pub tokens_restored: u64,
    pub writes: u64,
    pub bytes_written: u64,
    pub write_errors: u64,
    pub evictions: u64,
    pub corrupt_removed: u64,
    pub write_ns: u64,
    pub read_ns: u64,
}

/// since 0.3, experimental: memory tiers (docs/placement.md)
pub const DSI_PLACE_AUTO: u32 = 0;
pub const DSI_PLACE_ALL_RESIDENT: u32 = 1;
pub const DSI_PLACE_EXPERTS_HOST: u32 = 2;
pub const DSI_PLACE_EXPERTS_STREAMED: u32 = 3;
pub const DSI_CACHE_LRU: u32 = 0;
pub const DSI_CACHE_LFU: u32 = 1;
pub const DSI_PLACE_FLAG_NO_PREFETCH: u32 = 1 << 0;
pub const DSI_PLACE_FLAG_DIRECT_IO: u32 = 1 << 1;
pub const DSI_TIER_DEVICE: u32 = 0;
pub const DSI_TIER_HOST: u32 = 1;
pub const DSI_TIER_DISK: u32 = 2;
pub const DSI_HYBRID_CPU: u32 = 0;
pub const DSI_HYBRID_UPLOAD: u32 = 1;
pub const DSI_HYBRID_AUTO: u32 = 2;
pub const DSI_DEVICE_EXPERTS_AUTO: u32 = 0xFFFFFFFF;
pub const DSI_PLACE_MAX_CLASSES: u32 = 8;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_place_options {
    pub struct_size: u32,
    pub policy: u32,
    pub device_budget: u64,
    pub host_budget: u64,
    pub overrides: *const c_char,
    pub cache_policy: u32,
    pub flags: u32,
    pub engram_cache_bytes: u64,
    /// since 0.3.1
    pub hybrid: u32,
    pub device_experts: u32,
    pub expert_counts: *const u64,
    pub n_expert_counts: u64,
    pub hybrid_rows: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_place_class {
    pub name: [c_char; 32],
    pub tier: u32,
    pub n_tensors: u32,
    pub bytes: u64,
    pub device_bytes: u64,
    pub host_bytes: u64,
    pub disk_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dsi_place_info {
    pub struct_size: u32,
    pub policy: u32,
    pub device_budget: u64,
    pub host_budget: u64,
    pub device_bytes: u64,
    pub host_bytes: u64,
    pub disk_bytes: u64,
    pub mapped_bytes: u64,
    pub expert_cache_bytes: u64,
    pub expert_cache_slots: u32,
    pub cache_policy: u32,
    pub n_experts_streamed: u32,
    pub n_classes: u32,
    pub classes: [dsi_place_class; 8],
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub prefetches: u64,
    pub prefetch_hits: u64,
    pub bytes_read: u64,
    pub bytes_uploaded: u64,
    pub read_ns: u64,
    pub steps: u64,
    pub cpu_experts: u64,
    pub device_experts: u64,
    pub host_peak: u64,
    pub engram_cache_bytes: u64,
    pub engram_hits: u64,
    pub engram_misses: u64,
    pub engram_bytes_read: u64,
    /// since 0.3.1
    pub hybrid: u32,
    pub expert_cache_tier: u32,
    pub device_weight_bytes: u64,
    pub device_used: u64,
    pub device_experts_per_layer: u32,
    pub reserved: u32,
    pub overlap_cpu_ns: u64,
    pub overlap_wait_ns: u64,
}

extern "C" {
    pub fn dsi_version_string() -> *const c_char;
    pub fn dsi_version(major: *mut u32, minor: *mut u32, patch: *mut u32);
    pub fn dsi_abi_version() -> u32;
    pub fn dsi_status_string(status: dsi_status) -> *const c_char;
    pub fn dsi_last_error() -> *const c_char;

    pub fn dsi_context_options_init(opt: *mut dsi_context_options, abi_version: u32);
    pub fn dsi_context_create(opt: *const dsi_context_options, out: *mut *mut dsi_context) -> dsi_status;
    pub fn dsi_context_free(ctx: *mut dsi_context) -> dsi_status;
    pub fn dsi_context_last_error(ctx: *const dsi_context) -> *const c_char;
    pub fn dsi_context_backend(ctx: *const dsi_context) -> *const c_char;
    pub fn dsi_context_n_threads(ctx: *const dsi_context) -> i32;
    pub fn dsi_device_info_init(info: *mut dsi_device_info);
    pub fn dsi_context_device_count(ctx: *mut dsi_context, count: *mut i32) -> dsi_status;
    pub fn dsi_context_device_info(ctx: *mut dsi_context, i: i32, info: *mut dsi_device_info) -> dsi_status;

    pub fn dsi_model_options_init(opt: *mut dsi_model_options);
    pub fn dsi_reader_init(reader: *mut dsi_reader);
    pub fn dsi_model_load(
        ctx: *mut dsi_context,
        path: *const c_char,
        opt: *const dsi_model_options,
        out: *mut *mut dsi_model,
    ) -> dsi_status;
    pub fn dsi_model_load_from_reader(
        ctx: *mut dsi_context,
        reader: *const dsi_reader,
        opt: *const dsi_model_options,
        out: *mut *mut dsi_model,
    ) -> dsi_status;
    pub fn dsi_model_free(model: *mut dsi_model) -> dsi_status;
    pub fn dsi_model_last_error(model: *const dsi_model) -> *const c_char;
    pub fn dsi_model_info_init(info: *mut dsi_model_info);
    pub fn dsi_model_get_info(model: *const dsi_model, info: *mut dsi_model_info) -> dsi_status;
    pub fn dsi_type_name(type_: i32) -> *const c_char;
    pub fn dsi_model_type_bytes(model: *const dsi_model, type_: i32, bytes: *mut u64) -> dsi_status;
    pub fn dsi_model_meta_count(model: *const dsi_model, count: *mut i32) -> dsi_status;
    pub fn dsi_model_meta_key(
        model: *const dsi_model,
        i: i32,
        buf: *mut c_char,
        cap: usize,
        needed: *mut usize,
    ) -> dsi_status;
    pub fn dsi_model_meta_value(
        model: *const dsi_model,
        i: i32,
        buf: *mut c_char,
        cap: usize,
        needed: *mut usize,
    ) -> dsi_status;
    pub fn dsi_model_meta_find(
        model: *const dsi_model,
        key: *const c_char,
        buf: *mut c_char,
        cap: usize,
        needed: *mut usize,
    ) -> dsi_status;

    pub fn dsi_tokenize(
        model: *const dsi_model,
        text: *const c_char,
        len: usize,
        flags: u32,
        tokens: *mut dsi_token,
        cap: usize,
        n_needed: *mut usize,
    ) -> dsi_status;
    pub fn dsi_token_to_bytes(
        model: *const dsi_model,
        token: dsi_token,
        buf: *mut c_char,
        cap: usize,
        n_needed: *mut usize,
    ) -> dsi_status;
    pub fn dsi_detokenize(
        model: *const dsi_model,
        tokens: *const dsi_token,
        n: usize,
        buf: *mut c_char,
        cap: usize,
        n_needed: *mut usize,
    ) -> dsi_status;
    pub fn dsi_model_special_token(model: *const dsi_model, which: i32, token: *mut dsi_token) -> dsi_status;
    pub fn dsi_detokenizer_create(model: *const dsi_model, out: *mut *mut dsi_detokenizer) -> dsi_status;
    pub fn dsi_detokenizer_feed(
        d: *mut dsi_detokenizer,
        token: dsi_token,
        buf: *mut c_char,
        cap: usize,
        n_needed: *mut usize,
    ) -> dsi_status;
    pub fn dsi_detokenizer_flush(d: *mut dsi_detokenizer, buf: *mut c_char, cap: usize, n_needed: *mut usize)
        -> dsi_status;
    pub fn dsi_detokenizer_free(d: *mut dsi_detokenizer);

    pub fn dsi_chat_message_init(msg: *mut dsi_chat_message);
    pub fn dsi_chat_options_init(opt: *mut dsi_chat_options);
    pub fn dsi_chat_render(
        model: *const dsi_model,
        messages: *const *const dsi_chat_message,
        n: usize,
        opt: *const dsi_chat_options,
        buf: *mut c_char,
        cap: usize,
        n_needed: *mut usize,
    ) -> dsi_status;

    pub fn dsi_chat_tokenize(
        model: *const dsi_model,
        messages: *const *const dsi_chat_message,
        n: usize,
        opt: *const dsi_chat_options,
        tokens: *mut dsi_token,
        cap: usize,
        n_needed: *mut usize,
    ) -> dsi_status;

    pub fn dsi_session_options_init(opt: *mut dsi_session_options);
    pub fn dsi_session_create(
        model: *mut dsi_model,
        opt: *const dsi_session_options,
        out: *mut *mut dsi_session,
    ) -> dsi_status;
    pub fn dsi_session_free(session: *mut dsi_session);
    pub fn dsi_session_last_error(session: *const dsi_session) -> *const c_char;
    pub fn dsi_session_sync(
        session: *mut dsi_session,
        tokens: *const dsi_token,
        n: usize,
        n_reused: *mut usize,
    ) -> dsi_status;
    pub fn dsi_session_append(session: *mut dsi_session, tokens: *const dsi_token, n: usize) -> dsi_status;
    pub fn dsi_session_logits(session: *mut dsi_session, logits: *mut *const f32, n_vocab: *mut i32) -> dsi_status;
    pub fn dsi_session_position(session: *const dsi_session, pos: *mut u32) -> dsi_status;
    pub fn dsi_session_tokens(
        session: *const dsi_session,
        tokens: *mut dsi_token,
        cap: usize,
        n_needed: *mut usize,
    ) -> dsi_status;
    pub fn dsi_session_reset(session: *mut dsi_session) -> dsi_status;
    pub fn dsi_session_cancel(session: *mut dsi_session);
    pub fn dsi_session_cancel_clear(session: *mut dsi_session);

    pub fn dsi_sampler_options_init(opt: *mut dsi_sampler_options);
    pub fn dsi_sampler_create(opt: *const dsi_sampler_options, out: *mut *mut dsi_sampler) -> dsi_status;
    pub fn dsi_sampler_create_with_context(
        ctx: *mut dsi_context,
        opt: *const dsi_sampler_options,
        out: *mut *mut dsi_sampler,
    ) -> dsi_status;
    pub fn dsi_sampler_free(sampler: *mut dsi_sampler);
    pub fn dsi_sampler_last_error(sampler: *const dsi_sampler) -> *const c_char;
    pub fn dsi_sampler_sample(
        sampler: *mut dsi_sampler,
        logits: *const f32,
        n_vocab: i32,
        token: *mut dsi_token,
    ) -> dsi_status;
    pub fn dsi_sampler_accept(sampler: *mut dsi_sampler, token: dsi_token) -> dsi_status;
    pub fn dsi_sampler_reset(sampler: *mut dsi_sampler) -> dsi_status;
    pub fn dsi_sampler_probs(sampler: *mut dsi_sampler, probs: *mut *const f32, n_vocab: *mut i32) -> dsi_status;

    pub fn dsi_generate_options_init(opt: *mut dsi_generate_options);
    pub fn dsi_generate_result_init(result: *mut dsi_generate_result);
    pub fn dsi_session_generate(
        session: *mut dsi_session,
        sampler: *mut dsi_sampler,
        opt: *const dsi_generate_options,
        result: *mut dsi_generate_result,
    ) -> dsi_status;

    /// Experimental (DSI_EXPERIMENTAL, since 0.2); exported by the library either way.
    pub fn dsi_session_append_batch(
        n: usize,
        sessions: *const *mut dsi_session,
        tokens: *const *const dsi_token,
        n_tokens: *const usize,
        status: *mut dsi_status,
    ) -> dsi_status;
    pub fn dsi_session_draft(
        session: *mut dsi_session,
        next: dsi_token,
        ids: *mut dsi_token,
        logits: *mut f32,
        cap: usize,
        n_drafts: *mut usize,
    ) -> dsi_status;
    pub fn dsi_session_save(
        session: *mut dsi_session,
        write: dsi_write_fn,
        user_data: *mut c_void,
        n_written: *mut u64,
    ) -> dsi_status;
    pub fn dsi_session_save_buffer(
        session: *mut dsi_session,
        buf: *mut c_void,
        cap: usize,
        n_needed: *mut usize,
    ) -> dsi_status;
    pub fn dsi_session_save_file(session: *mut dsi_session, path: *const c_char) -> dsi_status;
    pub fn dsi_session_load(session: *mut dsi_session, read: dsi_read_fn, user_data: *mut c_void) -> dsi_status;
    pub fn dsi_session_load_buffer(session: *mut dsi_session, buf: *const c_void, size: usize) -> dsi_status;
    pub fn dsi_session_load_file(session: *mut dsi_session, path: *const c_char) -> dsi_status;
    pub fn dsi_prompt_cache_options_init(opt: *mut dsi_prompt_cache_options);
    pub fn dsi_session_set_prompt_cache(
        session: *mut dsi_session,
        opt: *const dsi_prompt_cache_options,
    ) -> dsi_status;
    pub fn dsi_place_options_init(opt: *mut dsi_place_options);
    pub fn dsi_place_info_init(info: *mut dsi_place_info);
    pub fn dsi_model_place_info(model: *const dsi_model, info: *mut dsi_place_info) -> dsi_status;
    pub fn dsi_model_expert_counts(
        model: *const dsi_model,
        counts: *mut u64,
        cap: u64,
        n_needed: *mut u64,
        n_layers: *mut u32,
        n_experts: *mut u32,
    ) -> dsi_status;
    pub fn dsi_prompt_cache_stats_init(stats: *mut dsi_prompt_cache_stats);
    pub fn dsi_session_prompt_cache_stats(
        session: *const dsi_session,
        stats: *mut dsi_prompt_cache_stats,
    ) -> dsi_status;
}
