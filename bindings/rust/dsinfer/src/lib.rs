//! Safe Rust binding of libdsinfer: DeepSeek V4 / V4.1 Flash inference.
//!
//! ```no_run
//! use dsinfer::*;
//! let ctx = Context::new(&ContextOptions::default())?;
//! let model = ctx.load_model("model.gguf", &ModelOptions::default())?;
//! let mut session = model.session(&SessionOptions::default())?;
//! let mut sampler = Sampler::new(&SamplerOptions::greedy())?;
//! let prompt = model.tokenize("The capital of France is", true, false)?;
//! let opts = GenerateOptions { prompt: Some(prompt), max_tokens: 32, ..Default::default() };
//! for piece in session.stream(&mut sampler, &opts)? {
//!     print!("{}", piece?.text);
//! }
//! # Ok::<(), dsinfer::Error>(())
//! ```
//!
//! Ownership follows the C API's lifetime rules: a [`Model`] keeps its [`Context`] alive,
//! and a [`Session`] or [`Detokenizer`] keeps its [`Model`] alive (reference counted), so
//! nothing can be freed while something built on it still exists. Thread rules follow the
//! header: `Context` and `Model` are `Send + Sync` ([thread-safe] functions); `Session`,
//! `Sampler` and `Detokenizer` are `Send` but not `Sync` ([per-handle]: one thread at a
//! time); a [`CancelHandle`] (`Send + Sync`) cancels a session from any thread
//! ([any-thread] `dsi_session_cancel`).
use std::any::Any;
use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::Arc;

pub use dsinfer_sys as sys;

/// A token id.
pub type Token = i32;

// ---- errors ---------------------------------------------------------------------------------

/// A failed libdsinfer call: the `DSI_ERR_*` status and the library's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: i32,
    message: String,
}

impl Error {
    pub fn new(status: i32, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
    /// The `DSI_ERR_*` code (negative).
    pub fn status(&self) -> i32 {
        self.status
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    /// The library's short name of the status ("invalid argument", ...).
    pub fn status_name(&self) -> String {
        status_string(self.status)
    }
    pub fn is_cancelled(&self) -> bool {
        self.status == sys::DSI_ERR_CANCELLED
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.message, self.status_name())
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn text_of(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn fixed_str(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Turns a status into a Result. The message is this thread's last error: every failing
/// call records it there (ABI 2), so it is the failure of this very call even on a handle
/// other threads use at the same time.
fn check_thread(st: i32) -> Result<()> {
    if st == sys::DSI_OK {
        Ok(())
    } else {
        Err(Error::new(st, text_of(unsafe { sys::dsi_last_error() })))
    }
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(sys::DSI_ERR_INVALID_ARGUMENT, format!("{} contains a NUL byte", what)))
}

/// The library version ("MAJOR.MINOR.PATCH").
pub fn version() -> String {
    text_of(unsafe { sys::dsi_version_string() })
}

/// The ABI version the loaded library implements.
pub fn abi_version() -> u32 {
    unsafe { sys::dsi_abi_version() }
}

/// The library's description of a status code.
pub fn status_string(status: i32) -> String {
    text_of(unsafe { sys::dsi_status_string(status) })
}

/// Name of a tensor type ("f32", "q4_k", ...).
pub fn type_name(type_id: i32) -> Option<String> {
    let p = unsafe { sys::dsi_type_name(type_id) };
    if p.is_null() {
        None
    } else {
        Some(text_of(p))
    }
}

/// A struct filled by the library's `*_init()`, declaring this binding's size.
///
/// `init` writes the library's own `sizeof`, which exceeds ours when the library is newer:
/// it runs on a padded scratch buffer, and only our prefix is kept with `struct_size` set
/// to our size, so the library uses its defaults for fields this binding does not know.
/// Every struct passed here starts with `uint32_t struct_size`.
unsafe fn init_struct<T: Copy>(init: impl FnOnce(*mut T)) -> T {
    let mut scratch = vec![0u64; (size_of::<T>() + 4096) / 8 + 1];
    init(scratch.as_mut_ptr() as *mut T);
    let mut out: T = ptr::read(scratch.as_ptr() as *const T);
    *(&mut out as *mut T as *mut u32) = size_of::<T>() as u32;
    out
}

/// Runs a two-call function `f(buf, cap, needed)` and returns the bytes.
fn two_call(mut f: impl FnMut(*mut c_char, usize, *mut usize) -> i32, fail: impl Fn(i32) -> Result<()>) -> Result<Vec<u8>> {
    let mut need = 0usize;
    let st = f(ptr::null_mut(), 0, &mut need);
    if st != sys::DSI_OK && need == 0 {
        fail(st)?;
    }
    let mut buf = vec![0u8; need + 1];
    let st = f(buf.as_mut_ptr() as *mut c_char, need + 1, &mut need);
    fail(st)?;
    buf.truncate(need);
    Ok(buf)
}

// ---- context --------------------------------------------------------------------------------

/// Log levels of the context's log sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug = 0,
    Info = 1,
    Warn = 2,
    Error = 3,
    None = 4,
}

impl LogLevel {
    fn from_i32(v: i32) -> LogLevel {
        match v {
            0 => LogLevel::Debug,
            1 => LogLevel::Info,
            2 => LogLevel::Warn,
            3 => LogLevel::Error,
            _ => LogLevel::None,
        }
    }
}

/// A log sink: called on the thread that called into the library.
pub type LogFn = Arc<dyn Fn(LogLevel, &str) + Send + Sync>;

/// Options of [`Context::new`].
#[derive(Clone)]
pub struct ContextOptions {
    /// CPU worker threads; 0 = all online CPUs.
    pub n_threads: i32,
    /// "cpu" (default), "vulkan", "cuda" or "auto".
    pub backend: Option<String>,
    pub backend_dir: Option<String>,
    /// -1 = best device of the backend.
    pub device_index: i32,
    /// The devices to open, "backend[:index],..." (since ABI 2); None = backend + device_index.
    pub devices: Option<String>,
    /// Without a sink nothing is logged anywhere.
    pub log: Option<LogFn>,
    pub log_level: LogLevel,
    /// Route the library's host allocations through counting hooks ([`Context::alloc_stats`]).
    pub track_allocations: bool,
}

impl Default for ContextOptions {
    fn default() -> Self {
        ContextOptions {
            n_threads: 0,
            backend: None,
            backend_dir: None,
            device_index: -1,
            devices: None,
            log: None,
            log_level: LogLevel::Info,
            track_allocations: false,
        }
    }
}

/// Live and total host allocations the library made through a context's hooks.
#[derive(Debug, Default)]
pub struct AllocStats {
    live: AtomicIsize,
    total: AtomicUsize,
}

impl AllocStats {
    /// Allocations not freed yet (0 once the context and everything on it is dropped).
    pub fn live(&self) -> isize {
        self.live.load(Ordering::SeqCst)
    }
    /// Allocations made so far.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }
}

extern "C" {
    fn malloc(size: usize) -> *mut c_void;
    fn realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn free(p: *mut c_void);
}

unsafe extern "C" fn hook_malloc(size: usize, ud: *mut c_void) -> *mut c_void {
    let p = malloc(size);
    if !p.is_null() {
        let s = &*(ud as *const AllocStats);
        s.live.fetch_add(1, Ordering::SeqCst);
        s.total.fetch_add(1, Ordering::SeqCst);
    }
    p
}

unsafe extern "C" fn hook_realloc(old: *mut c_void, size: usize, ud: *mut c_void) -> *mut c_void {
    let p = realloc(old, size);
    if !p.is_null() && old.is_null() {
        let s = &*(ud as *const AllocStats);
        s.live.fetch_add(1, Ordering::SeqCst);
        s.total.fetch_add(1, Ordering::SeqCst);
    }
    p
}

unsafe extern "C" fn hook_free(p: *mut c_void, ud: *mut c_void) {
    if !p.is_null() {
        free(p);
        (*(ud as *const AllocStats)).live.fetch_sub(1, Ordering::SeqCst);
    }
}

unsafe extern "C" fn log_trampoline(level: i32, message: *const c_char, ud: *mut c_void) {
    let sink = &*(ud as *const LogFn);
    let m = text_of(message);
    // a panic must not unwind into C
    let _ = catch_unwind(AssertUnwindSafe(|| sink(LogLevel::from_i32(level), &m)));
}

struct ContextInner {
    ptr: *mut sys::dsi_context,
    _log: Option<Box<LogFn>>,
    alloc: Option<Arc<AllocStats>>,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // Models hold an Arc of this: none is left, so BUSY cannot happen.
        unsafe { sys::dsi_context_free(self.ptr) };
    }
}

// SAFETY: every dsi_context function used through a shared reference is [thread-safe];
// dsi_context_free runs only in Drop, with unique ownership.
unsafe impl Send for ContextInner {}
unsafe impl Sync for ContextInner {}

/// Runtime root: backend, CPU threads, log sink, allocator hooks. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

/// One device visible to a context.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub index: i32,
    pub backend: String,
    pub kind: i32,
    pub name: String,
    pub memory_total: u64,
    pub memory_free: u64,
    pub max_buffer_size: u64,
    pub features: u32,
    pub subgroup_size: u32,
}

/// How a model file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Mmap,
    Pread,
}

/// Options of [`Context::load_model`].
#[derive(Clone, Debug)]
pub struct ModelOptions {
    pub access: Access,
    /// `DSI_MODEL_FLAG_VERIFY_FILE` (docs/api.md, "Model files").
    pub verify_file: bool,
    /// `DSI_MODEL_FLAG_RESIDENT`: copy the weights into library memory.
    pub resident: bool,
    /// Experimental (DSI_MODEL_FLAG_COALESCE, since 0.2): generations running at once on
    /// sessions of this model, from different threads, share batched steps.
    pub coalesce: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions { access: Access::Mmap, verify_file: false, resident: false, coalesce: false }
    }
}

impl Context {
    pub fn new(opts: &ContextOptions) -> Result<Context> {
        let mut o: sys::dsi_context_options =
            unsafe { init_struct(|p| sys::dsi_context_options_init(p, sys::DSI_ABI_VERSION)) };
        o.n_threads = opts.n_threads;
        o.device_index = opts.device_index;
        o.log_level = opts.log_level as i32;
        let backend = opts.backend.as_deref().map(|s| cstring(s, "backend")).transpose()?;
        let backend_dir = opts.backend_dir.as_deref().map(|s| cstring(s, "backend_dir")).transpose()?;
        o.backend = backend.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        o.backend_dir = backend_dir.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        let devices = opts.devices.as_deref().map(|s| cstring(s, "devices")).transpose()?;
        o.devices = devices.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        let log = opts.log.clone().map(Box::new);
        if let Some(l) = &log {
            o.log_fn = Some(log_trampoline);
            o.log_user_data = &**l as *const LogFn as *mut c_void;
        }
        let alloc = if opts.track_allocations { Some(Arc::new(AllocStats::default())) } else { None };
        if let Some(a) = &alloc {
            o.malloc_fn = Some(hook_malloc);
            o.realloc_fn = Some(hook_realloc);
            o.free_fn = Some(hook_free);
            o.alloc_user_data = Arc::as_ptr(a) as *mut c_void;
        }
        let mut p = ptr::null_mut();
        check_thread(unsafe { sys::dsi_context_create(&o, &mut p) })?;
        Ok(Context { inner: Arc::new(ContextInner { ptr: p, _log: log, alloc }) })
    }

    /// The counters of `track_allocations` (they outlive the context).
    pub fn alloc_stats(&self) -> Option<Arc<AllocStats>> {
        self.inner.alloc.clone()
    }

    pub fn backend(&self) -> String {
        text_of(unsafe { sys::dsi_context_backend(self.inner.ptr) })
    }

    pub fn n_threads(&self) -> i32 {
        unsafe { sys::dsi_context_n_threads(self.inner.ptr) }
    }

    pub fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let mut n = 0i32;
        check_thread(unsafe { sys::dsi_context_device_count(self.inner.ptr, &mut n) })?;
        let mut out = Vec::new();
        for i in 0..n {
            let mut d: sys::dsi_device_info = unsafe { init_struct(|p| sys::dsi_device_info_init(p)) };
            check_thread(unsafe { sys::dsi_context_device_info(self.inner.ptr, i, &mut d) })?;
            out.push(DeviceInfo {
                index: d.index,
                backend: fixed_str(&d.backend),
                kind: d.type_,
                name: fixed_str(&d.name),
                memory_total: d.memory_total,
                memory_free: d.memory_free,
                max_buffer_size: d.max_buffer_size,
                features: d.features,
                subgroup_size: d.subgroup_size,
            });
        }
        Ok(out)
    }

    /// Loads a GGUF model.
    pub fn load_model<P: AsRef<Path>>(&self, path: P, opts: &ModelOptions) -> Result<Model> {
        self.load_model_with_progress(path, opts, None)
    }

    /// Loads a GGUF model; `progress(stage, done, total)` returning false aborts the load
    /// (a CANCELLED error).
    pub fn load_model_with_progress<P: AsRef<Path>>(
        &self,
        path: P,
        opts: &ModelOptions,
        progress: Option<&mut dyn FnMut(i32, u64, u64) -> bool>,
    ) -> Result<Model> {
        struct Prog<'a> {
            f: &'a mut dyn FnMut(i32, u64, u64) -> bool,
            panic: Option<Box<dyn Any + Send>>,
        }
        unsafe extern "C" fn tramp(stage: i32, done: u64, total: u64, ud: *mut c_void) -> i32 {
            let p = &mut *(ud as *mut Prog);
            if p.panic.is_some() {
                return 0;
            }
            match catch_unwind(AssertUnwindSafe(|| (p.f)(stage, done, total))) {
                Ok(go) => go as i32,
                Err(e) => {
                    p.panic = Some(e);
                    0
                }
            }
        }
        let path = path.as_ref().to_str().ok_or_else(|| Error::new(sys::DSI_ERR_INVALID_ARGUMENT, "path is not UTF-8"))?;
        let cpath = cstring(path, "path")?;
        let mut o: sys::dsi_model_options = unsafe { init_struct(|p| sys::dsi_model_options_init(p)) };
        o.access = match opts.access {
            Access::Mmap => sys::DSI_ACCESS_MMAP,
            Access::Pread => sys::DSI_ACCESS_PREAD,
        };
        o.flags = if opts.verify_file { sys::DSI_MODEL_FLAG_VERIFY_FILE } else { 0 }
            | if opts.resident { sys::DSI_MODEL_FLAG_RESIDENT } else { 0 };
        if opts.coalesce {
            o.flags |= sys::DSI_MODEL_FLAG_COALESCE;
        }
        let mut prog = progress.map(|f| Prog { f, panic: None });
        if let Some(p) = prog.as_mut() {
            o.progress_fn = Some(tramp);
            o.progress_user_data = p as *mut Prog as *mut c_void;
        }
        let mut m = ptr::null_mut();
        let st = unsafe { sys::dsi_model_load(self.inner.ptr, cpath.as_ptr(), &o, &mut m) };
        if let Some(e) = prog.and_then(|p| p.panic) {
            resume_unwind(e);
        }
        check_thread(st)?;
        Ok(Model { inner: Arc::new(ModelInner { ptr: m, _ctx: self.inner.clone() }) })
    }
}

// ---- model ------------------------------------------------------------------------------------

struct ModelInner {
    ptr: *mut sys::dsi_model,
    _ctx: Arc<ContextInner>,
}

impl Drop for ModelInner {
    fn drop(&mut self) {
        // Sessions and detokenizers hold an Arc of this: BUSY cannot happen.
        unsafe { sys::dsi_model_free(self.ptr) };
    }
}

// SAFETY: a model is immutable after loading; the functions used through shared references
// are [thread-safe]; dsi_model_free runs only in Drop, with unique ownership.
unsafe impl Send for ModelInner {}
unsafe impl Sync for ModelInner {}

/// Immutable weights and tokenizer, shared by sessions. Cheap to clone.
#[derive(Clone)]
pub struct Model {
    inner: Arc<ModelInner>,
}

/// What [`Model::info`] reports.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub arch: i32,
    pub arch_name: String,
    pub name: String,
    pub n_layers: i32,
    pub n_embd: i32,
    pub n_vocab: i32,
    pub n_heads: i32,
    pub n_ctx_train: i32,
    pub n_experts: i32,
    pub n_experts_used: i32,
    pub n_draft_layers: i32,
    pub has_mtp: bool,
    pub has_dspark: bool,
    pub has_engram: bool,
    pub n_params: u64,
    pub weight_bytes: u64,
    pub fingerprint: [u8; 32],
}

/// Special tokens of the vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    Bos = 0,
    Eos = 1,
    Pad = 2,
    User = 3,
    Assistant = 4,
    ThinkBegin = 5,
    ThinkEnd = 6,
}

/// Chat roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System = 0,
    User = 1,
    Assistant = 2,
    Tool = 3,
}

/// One message of a conversation.
#[derive(Clone, Debug)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// An assistant's thinking text.
    pub reasoning: Option<String>,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role, content: content.into(), reasoning: None }
    }
}

/// Thinking mode of the chat format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thinking {
    Off = 0,
    On = 1,
    Max = 2,
}

/// Options of [`Model::render_chat`].
#[derive(Clone, Debug)]
pub struct ChatOptions {
    pub thinking: Thinking,
    pub add_generation_prompt: bool,
    pub add_bos: bool,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions { thinking: Thinking::Off, add_generation_prompt: true, add_bos: true }
    }
}

/// dsi_chat_message structs, their pointer array, options, and the strings they point to.
struct ChatArgs {
    _keep: Vec<CString>,
    _msgs: Vec<sys::dsi_chat_message>,
    ptrs: Vec<*const sys::dsi_chat_message>,
    opt: sys::dsi_chat_options,
}

impl ChatArgs {
    fn new(messages: &[ChatMessage], opts: &ChatOptions) -> Result<ChatArgs> {
        let mut keep = Vec::new();
        let mut msgs = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let mut cm: sys::dsi_chat_message = unsafe { init_struct(|p| sys::dsi_chat_message_init(p)) };
            cm.role = m.role as i32;
            let c = cstring(&m.content, &format!("messages[{}].content", i))?;
            cm.content = c.as_ptr();
            keep.push(c);
            if let Some(r) = &m.reasoning {
                let r = cstring(r, &format!("messages[{}].reasoning", i))?;
                cm.reasoning = r.as_ptr();
                keep.push(r);
            }
            msgs.push(cm);
        }
        let ptrs: Vec<*const sys::dsi_chat_message> = msgs.iter().map(|m| m as *const _).collect();
        let mut o: sys::dsi_chat_options = unsafe { init_struct(|p| sys::dsi_chat_options_init(p)) };
        o.thinking = opts.thinking as i32;
        o.add_generation_prompt = opts.add_generation_prompt as i32;
        o.add_bos = opts.add_bos as i32;
        Ok(ChatArgs { _keep: keep, _msgs: msgs, ptrs, opt: o })
    }
}

impl Model {
    fn fail(&self, st: i32) -> Result<()> {
        check_thread(st)
    }

    pub fn info(&self) -> Result<ModelInfo> {
        let mut i: sys::dsi_model_info = unsafe { init_struct(|p| sys::dsi_model_info_init(p)) };
        self.fail(unsafe { sys::dsi_model_get_info(self.inner.ptr, &mut i) })?;
        Ok(ModelInfo {
            arch: i.arch,
            arch_name: fixed_str(&i.arch_name),
            name: fixed_str(&i.name),
            n_layers: i.n_layers,
            n_embd: i.n_embd,
            n_vocab: i.n_vocab,
            n_heads: i.n_heads,
            n_ctx_train: i.n_ctx_train,
            n_experts: i.n_experts,
            n_experts_used: i.n_experts_used,
            n_draft_layers: i.n_draft_layers,
            has_mtp: i.has_mtp != 0,
            has_dspark: i.has_dspark != 0,
            has_engram: i.has_engram != 0,
            n_params: i.n_params,
            weight_bytes: i.weight_bytes,
            fingerprint: i.fingerprint,
        })
    }

    pub fn n_vocab(&self) -> i32 {
        self.info().map(|i| i.n_vocab).unwrap_or(0)
    }

    /// Token ids of `text` (any bytes). `parse_special` matches special-token text: never
    /// use it on text from users (docs/bindings.md).
    pub fn tokenize(&self, text: impl AsRef<[u8]>, add_bos: bool, parse_special: bool) -> Result<Vec<Token>> {
        let t = text.as_ref();
        let flags = if add_bos { sys::DSI_TOKENIZE_ADD_BOS } else { 0 }
            | if parse_special { sys::DSI_TOKENIZE_PARSE_SPECIAL } else { 0 };
        let mut need = 0usize;
        let tp = t.as_ptr() as *const c_char;
        let st = unsafe { sys::dsi_tokenize(self.inner.ptr, tp, t.len(), flags, ptr::null_mut(), 0, &mut need) };
        if st != sys::DSI_OK && need == 0 {
            self.fail(st)?;
        }
        let mut out = vec![0; need.max(1)];
        self.fail(unsafe { sys::dsi_tokenize(self.inner.ptr, tp, t.len(), flags, out.as_mut_ptr(), need, &mut need) })?;
        out.truncate(need);
        Ok(out)
    }

    /// Raw bytes of one token (may be part of a UTF-8 character).
    pub fn token_bytes(&self, token: Token) -> Result<Vec<u8>> {
        two_call(|b, c, n| unsafe { sys::dsi_token_to_bytes(self.inner.ptr, token, b, c, n) }, |st| self.fail(st))
    }

    /// Concatenated raw bytes of `tokens`.
    pub fn detokenize(&self, tokens: &[Token]) -> Result<Vec<u8>> {
        two_call(
            |b, c, n| unsafe { sys::dsi_detokenize(self.inner.ptr, tokens.as_ptr(), tokens.len(), b, c, n) },
            |st| self.fail(st),
        )
    }

    /// Id of a special token, or None when the vocabulary lacks it.
    pub fn special_token(&self, which: Special) -> Option<Token> {
        let mut t = 0;
        if unsafe { sys::dsi_model_special_token(self.inner.ptr, which as i32, &mut t) } == sys::DSI_OK {
            Some(t)
        } else {
            None
        }
    }

    /// The DeepSeek V4 chat text of a conversation (special tokens appear as text): for
    /// display and logs. To run a conversation use [`Model::chat_tokens`].
    pub fn render_chat(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<String> {
        let args = ChatArgs::new(messages, opts)?;
        let bytes = two_call(
            |b, c, n| unsafe {
                sys::dsi_chat_render(self.inner.ptr, args.ptrs.as_ptr(), args.ptrs.len(), &args.opt, b, c, n)
            },
            |st| self.fail(st),
        )?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Token ids of a conversation, ready as a generation prompt (dsi_chat_tokenize): the
    /// template's structure becomes special tokens and every message's content is
    /// tokenized as plain text, so special-token text inside a message stays text.
    pub fn chat_tokens(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<Vec<Token>> {
        let args = ChatArgs::new(messages, opts)?;
        let (p, n) = (args.ptrs.as_ptr(), args.ptrs.len());
        let mut need = 0usize;
        let st = unsafe { sys::dsi_chat_tokenize(self.inner.ptr, p, n, &args.opt, ptr::null_mut(), 0, &mut need) };
        if st != sys::DSI_OK && need == 0 {
            self.fail(st)?;
        }
        let mut out = vec![0; need.max(1)];
        self.fail(unsafe { sys::dsi_chat_tokenize(self.inner.ptr, p, n, &args.opt, out.as_mut_ptr(), need, &mut need) })?;
        out.truncate(need);
        Ok(out)
    }

    /// All GGUF metadata as (key, value-as-text) pairs.
    pub fn metadata(&self) -> Result<Vec<(String, String)>> {
        let mut n = 0i32;
        self.fail(unsafe { sys::dsi_model_meta_count(self.inner.ptr, &mut n) })?;
        let mut out = Vec::new();
        for i in 0..n {
            let k = two_call(|b, c, nd| unsafe { sys::dsi_model_meta_key(self.inner.ptr, i, b, c, nd) }, |st| self.fail(st))?;
            let v = two_call(|b, c, nd| unsafe { sys::dsi_model_meta_value(self.inner.ptr, i, b, c, nd) }, |st| self.fail(st))?;
            out.push((String::from_utf8_lossy(&k).into_owned(), String::from_utf8_lossy(&v).into_owned()));
        }
        Ok(out)
    }

    /// One metadata value as text; None when the key is absent.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        let k = cstring(key, "key")?;
        match two_call(
            |b, c, nd| unsafe { sys::dsi_model_meta_find(self.inner.ptr, k.as_ptr(), b, c, nd) },
            |st| self.fail(st),
        ) {
            Ok(v) => Ok(Some(String::from_utf8_lossy(&v).into_owned())),
            Err(e) if e.status() == sys::DSI_ERR_NOT_FOUND => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Bytes of bound tensors stored as `type_id`.
    pub fn type_bytes(&self, type_id: i32) -> Result<u64> {
        let mut b = 0u64;
        self.fail(unsafe { sys::dsi_model_type_bytes(self.inner.ptr, type_id, &mut b) })?;
        Ok(b)
    }

    /// A new session (timeline) on this model.
    pub fn session(&self, opts: &SessionOptions) -> Result<Session> {
        let mut o: sys::dsi_session_options = unsafe { init_struct(|p| sys::dsi_session_options_init(p)) };
        o.n_ctx = opts.n_ctx;
        o.n_batch = opts.n_batch;
        o.flags = opts.flags;
        let mut s = ptr::null_mut();
        check_thread(unsafe { sys::dsi_session_create(self.inner.ptr, &o, &mut s) })?;
        Ok(Session {
            raw: Arc::new(SessionRaw { ptr: s, model: self.inner.clone() }),
            _not_sync: PhantomData,
        })
    }

    /// An incremental token → UTF-8 decoder.
    pub fn detokenizer(&self) -> Result<Detokenizer> {
        let mut d = ptr::null_mut();
        check_thread(unsafe { sys::dsi_detokenizer_create(self.inner.ptr, &mut d) })?;
        Ok(Detokenizer { ptr: d, _model: self.inner.clone(), _not_sync: PhantomData })
    }
}

// ---- detokenizer ------------------------------------------------------------------------------

/// Incremental token → UTF-8 decoder: holds back the bytes of an unfinished character.
pub struct Detokenizer {
    ptr: *mut sys::dsi_detokenizer,
    _model: Arc<ModelInner>, // the model must outlive the detokenizer
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: [per-handle]: usable from any one thread at a time (not Sync).
unsafe impl Send for Detokenizer {}

impl Drop for Detokenizer {
    fn drop(&mut self) {
        unsafe { sys::dsi_detokenizer_free(self.ptr) };
    }
}

impl Detokenizer {
    fn call(&mut self, mut f: impl FnMut(*mut c_char, usize, *mut usize) -> i32) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 64];
        let mut need = 0usize;
        let mut st = f(buf.as_mut_ptr() as *mut c_char, buf.len(), &mut need);
        if st != sys::DSI_OK && need > buf.len() {
            buf.resize(need, 0);
            st = f(buf.as_mut_ptr() as *mut c_char, buf.len(), &mut need);
        }
        check_thread(st)?;
        buf.truncate(need);
        Ok(buf)
    }

    /// Bytes of the complete UTF-8 characters `token` finished.
    pub fn feed_bytes(&mut self, token: Token) -> Result<Vec<u8>> {
        let d = self.ptr;
        self.call(|b, c, n| unsafe { sys::dsi_detokenizer_feed(d, token, b, c, n) })
    }

    pub fn feed(&mut self, token: Token) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.feed_bytes(token)?).into_owned())
    }

    /// Whatever is held back (an unfinished character becomes U+FFFD).
    pub fn flush_bytes(&mut self) -> Result<Vec<u8>> {
        let d = self.ptr;
        self.call(|b, c, n| unsafe { sys::dsi_detokenizer_flush(d, b, c, n) })
    }

    pub fn flush(&mut self) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.flush_bytes()?).into_owned())
    }
}

// ---- sampler ------------------------------------------------------------------------------------

/// Options of [`Sampler::new`]; `Default` gives the library's defaults.
#[derive(Clone, Debug)]
pub struct SamplerOptions {
    /// 0 = greedy.
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub penalty_last_n: i32,
    pub seed: u64,
    pub logit_bias: Vec<(Token, f32)>,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        let o: sys::dsi_sampler_options = unsafe { init_struct(|p| sys::dsi_sampler_options_init(p)) };
        SamplerOptions {
            temperature: o.temperature,
            top_k: o.top_k,
            top_p: o.top_p,
            min_p: o.min_p,
            repetition_penalty: o.repetition_penalty,
            frequency_penalty: o.frequency_penalty,
            presence_penalty: o.presence_penalty,
            penalty_last_n: o.penalty_last_n,
            seed: o.seed,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplerOptions {
    /// Greedy sampling (temperature 0).
    pub fn greedy() -> SamplerOptions {
        SamplerOptions { temperature: 0.0, ..Default::default() }
    }
}

/// Sampling settings and RNG; one thread at a time.
pub struct Sampler {
    ptr: *mut sys::dsi_sampler,
    _ctx: Option<Arc<ContextInner>>, // with_context: the context must outlive the sampler
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: [per-handle]: usable from any one thread at a time (not Sync).
unsafe impl Send for Sampler {}

impl Drop for Sampler {
    fn drop(&mut self) {
        unsafe { sys::dsi_sampler_free(self.ptr) };
    }
}

impl Sampler {
    /// A sampler that allocates with the C library's malloc.
    pub fn new(opts: &SamplerOptions) -> Result<Sampler> {
        Sampler::create(None, opts)
    }

    /// A sampler whose allocations go through `ctx`'s allocator hooks
    /// (dsi_sampler_create_with_context); it keeps the context alive.
    pub fn with_context(ctx: &Context, opts: &SamplerOptions) -> Result<Sampler> {
        Sampler::create(Some(ctx.inner.clone()), opts)
    }

    fn create(ctx: Option<Arc<ContextInner>>, opts: &SamplerOptions) -> Result<Sampler> {
        let mut o: sys::dsi_sampler_options = unsafe { init_struct(|p| sys::dsi_sampler_options_init(p)) };
        o.temperature = opts.temperature;
        o.top_k = opts.top_k;
        o.top_p = opts.top_p;
        o.min_p = opts.min_p;
        o.repetition_penalty = opts.repetition_penalty;
        o.frequency_penalty = opts.frequency_penalty;
        o.presence_penalty = opts.presence_penalty;
        o.penalty_last_n = opts.penalty_last_n;
        o.seed = opts.seed;
        let bias: Vec<sys::dsi_logit_bias> =
            opts.logit_bias.iter().map(|&(token, bias)| sys::dsi_logit_bias { token, bias }).collect();
        if !bias.is_empty() {
            o.logit_bias = bias.as_ptr();
            o.n_logit_bias = bias.len();
        }
        let mut p = ptr::null_mut();
        check_thread(match &ctx {
            Some(c) => unsafe { sys::dsi_sampler_create_with_context(c.ptr, &o, &mut p) },
            None => unsafe { sys::dsi_sampler_create(&o, &mut p) },
        })?;
        Ok(Sampler { ptr: p, _ctx: ctx, _not_sync: PhantomData })
    }

    fn fail(&self, st: i32) -> Result<()> {
        check_thread(st)
    }

    /// Samples a token from `logits` (n_vocab values) and records it in the history.
    pub fn sample(&mut self, logits: &[f32]) -> Result<Token> {
        let mut t = 0;
        let n = i32::try_from(logits.len()).map_err(|_| Error::new(sys::DSI_ERR_INVALID_ARGUMENT, "too many logits"))?;
        self.fail(unsafe { sys::dsi_sampler_sample(self.ptr, logits.as_ptr(), n, &mut t) })?;
        Ok(t)
    }

    /// Adds a token to the penalty history without sampling.
    pub fn accept(&mut self, token: Token) -> Result<()> {
        self.fail(unsafe { sys::dsi_sampler_accept(self.ptr, token) })
    }

    /// Clears the history and re-seeds the RNG.
    pub fn reset(&mut self) -> Result<()> {
        self.fail(unsafe { sys::dsi_sampler_reset(self.ptr) })
    }

    /// The distribution the last sample() drew from (borrowed until the next call).
    pub fn probs(&mut self) -> Result<&[f32]> {
        let mut p = ptr::null();
        let mut n = 0i32;
        self.fail(unsafe { sys::dsi_sampler_probs(self.ptr, &mut p, &mut n) })?;
        Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
    }
}

// ---- session ------------------------------------------------------------------------------------

/// Options of [`Model::session`].
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// Maximum timeline length; 0 = min(4096, trained context).
    pub n_ctx: u32,
    /// Prefill chunk; 0 = 256.
    pub n_batch: u32,
    /// `DSI_SESSION_FLAG_*`.
    pub flags: u32,
}

struct SessionRaw {
    ptr: *mut sys::dsi_session,
    model: Arc<ModelInner>,
}

impl Drop for SessionRaw {
    fn drop(&mut self) {
        unsafe { sys::dsi_session_free(self.ptr) };
    }
}

// SAFETY: shared between a Session and its CancelHandles only to call dsi_session_cancel,
// which is [any-thread]; every other call goes through Session, which is not Sync. The
// session is freed when the last of them is dropped, so a cancel never meets a freed one.
unsafe impl Send for SessionRaw {}
unsafe impl Sync for SessionRaw {}

/// One timeline: KV cache and logits. `Send`, not `Sync`: one thread at a time.
pub struct Session {
    raw: Arc<SessionRaw>,
    _not_sync: PhantomData<Cell<()>>,
}

/// Cancels a session's running call from any thread (`Send + Sync`, cloneable).
#[derive(Clone)]
pub struct CancelHandle {
    raw: Arc<SessionRaw>,
}

impl CancelHandle {
    /// Stops the session's running generate / sync / append (or stream step) at the next
    /// token or prefill chunk: it returns a CANCELLED error. Made while nothing runs, the
    /// request is sticky: the next such call is cancelled before it changes the session.
    pub fn cancel(&self) {
        unsafe { sys::dsi_session_cancel(self.raw.ptr) };
    }

    /// Drops a pending request (dsi_session_cancel_clear): one that arrived after the call
    /// it was meant for had finished.
    pub fn clear(&self) {
        unsafe { sys::dsi_session_cancel_clear(self.raw.ptr) };
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    None,
    Length,
    Eos,
    StopToken,
    StopString,
    Callback,
    Cancelled,
    ContextFull,
}

impl FinishReason {
    fn from_i32(v: i32) -> FinishReason {
        match v {
            sys::DSI_FINISH_LENGTH => FinishReason::Length,
            sys::DSI_FINISH_EOS => FinishReason::Eos,
            sys::DSI_FINISH_STOP_TOKEN => FinishReason::StopToken,
            sys::DSI_FINISH_STOP_STRING => FinishReason::StopString,
            sys::DSI_FINISH_CALLBACK => FinishReason::Callback,
            sys::DSI_FINISH_CANCELLED => FinishReason::Cancelled,
            sys::DSI_FINISH_CONTEXT_FULL => FinishReason::ContextFull,
            _ => FinishReason::None,
        }
    }
}

/// Options of [`Session::generate`] and [`Session::stream`].
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Synced first (prefix reused); without it the session must already hold logits.
    pub prompt: Option<Vec<Token>>,
    pub max_tokens: i32,
    /// Strings that end generation; never delivered.
    pub stop: Vec<String>,
    /// Token ids that end generation besides EOS.
    pub stop_tokens: Vec<Token>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions { prompt: None, max_tokens: 256, stop: Vec::new(), stop_tokens: Vec::new() }
    }
}

/// What a generation produced.
#[derive(Clone, Debug)]
pub struct GenerationResult {
    pub text: String,
    /// The delivered token ids (EOS / stop tokens are not delivered).
    pub tokens: Vec<Token>,
    pub finish_reason: FinishReason,
    pub n_prompt: u64,
    pub n_reused: u64,
    pub n_generated: u64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
}

impl GenerationResult {
    fn new() -> Self {
        GenerationResult {
            text: String::new(),
            tokens: Vec::new(),
            finish_reason: FinishReason::None,
            n_prompt: 0,
            n_reused: 0,
            n_generated: 0,
            prefill_ms: 0.0,
            decode_ms: 0.0,
        }
    }
}

/// One streamed step: a token (-1 for text flushed at the end) and the text that became
/// final with it ("" while held back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub token: Token,
    pub text: String,
}

/// dsi_generate_options plus the memory its pointers refer to.
struct RawGenOptions {
    o: sys::dsi_generate_options,
    _stops: Vec<CString>,
    _stop_ptrs: Vec<*const c_char>,
}

impl RawGenOptions {
    fn new(opts: &GenerateOptions, with_stop_strings: bool) -> Result<RawGenOptions> {
        let mut o: sys::dsi_generate_options = unsafe { init_struct(|p| sys::dsi_generate_options_init(p)) };
        o.max_tokens = opts.max_tokens;
        if let Some(p) = &opts.prompt {
            o.prompt = if p.is_empty() { ptr::null() } else { p.as_ptr() };
            o.n_prompt = p.len();
            if p.is_empty() {
                return Err(Error::new(sys::DSI_ERR_INVALID_ARGUMENT, "the prompt is empty"));
            }
        }
        if !opts.stop_tokens.is_empty() {
            o.stop_tokens = opts.stop_tokens.as_ptr();
            o.n_stop_tokens = opts.stop_tokens.len();
        }
        let mut stops = Vec::new();
        if with_stop_strings {
            for (i, s) in opts.stop.iter().enumerate() {
                stops.push(cstring(s, &format!("stop[{}]", i))?);
            }
        }
        let stop_ptrs: Vec<*const c_char> = stops.iter().map(|s| s.as_ptr()).collect();
        if !stop_ptrs.is_empty() {
            o.stop_strings = stop_ptrs.as_ptr();
            o.n_stop_strings = stop_ptrs.len();
        }
        Ok(RawGenOptions { o, _stops: stops, _stop_ptrs: stop_ptrs })
    }
}

struct GenState<'f> {
    on_token: &'f mut dyn FnMut(Token, &str) -> bool,
    result: GenerationResult,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn token_trampoline(token: Token, text: *const c_char, len: usize, ud: *mut c_void) -> i32 {
    let st = &mut *(ud as *mut GenState);
    let bytes = if len == 0 { &[][..] } else { std::slice::from_raw_parts(text as *const u8, len) };
    let s = String::from_utf8_lossy(bytes);
    st.result.text.push_str(&s);
    if token >= 0 {
        st.result.tokens.push(token);
    }
    if st.panic.is_some() {
        return 0;
    }
    let f = &mut st.on_token;
    match catch_unwind(AssertUnwindSafe(|| f(token, &s))) {
        Ok(go) => go as i32,
        Err(e) => {
            st.panic = Some(e);
            0
        }
    }
}

impl Session {
    fn ptr(&self) -> *mut sys::dsi_session {
        self.raw.ptr
    }

    fn fail(&self, st: i32) -> Result<()> {
        check_thread(st)
    }

    /// The model this session runs on.
    pub fn model(&self) -> Model {
        Model { inner: self.raw.model.clone() }
    }

    /// Makes the timeline equal `tokens` (longest common prefix kept); returns how many
    /// tokens were reused.
    pub fn sync(&mut self, tokens: &[Token]) -> Result<usize> {
        let mut reused = 0usize;
        self.fail(unsafe { sys::dsi_session_sync(self.ptr(), tokens.as_ptr(), tokens.len(), &mut reused) })?;
        Ok(reused)
    }

    /// Evaluates more tokens at the end of the timeline.
    pub fn append(&mut self, tokens: &[Token]) -> Result<()> {
        self.fail(unsafe { sys::dsi_session_append(self.ptr(), tokens.as_ptr(), tokens.len()) })
    }

    /// Logits of the last evaluated token, borrowed from the session (no copy) until the
    /// next mutating call.
    pub fn logits(&self) -> Result<&[f32]> {
        let mut p = ptr::null();
        let mut n = 0i32;
        self.fail(unsafe { sys::dsi_session_logits(self.ptr(), &mut p, &mut n) })?;
        Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
    }

    /// Number of tokens in the timeline.
    pub fn position(&self) -> Result<u32> {
        let mut pos = 0u32;
        self.fail(unsafe { sys::dsi_session_position(self.ptr(), &mut pos) })?;
        Ok(pos)
    }

    /// The timeline's tokens.
    pub fn tokens(&self) -> Result<Vec<Token>> {
        let mut need = 0usize;
        let st = unsafe { sys::dsi_session_tokens(self.ptr(), ptr::null_mut(), 0, &mut need) };
        if st != sys::DSI_OK && need == 0 {
            self.fail(st)?;
        }
        let mut v = vec![0; need.max(1)];
        self.fail(unsafe { sys::dsi_session_tokens(self.ptr(), v.as_mut_ptr(), need, &mut need) })?;
        v.truncate(need);
        Ok(v)
    }

    /// Empties the timeline.
    pub fn reset(&mut self) -> Result<()> {
        self.fail(unsafe { sys::dsi_session_reset(self.ptr()) })
    }

    /// Drops a pending cancel request (dsi_session_cancel_clear).
    pub fn cancel_clear(&self) {
        unsafe { sys::dsi_session_cancel_clear(self.raw.ptr) };
    }

    /// A handle that cancels this session's running call from any thread.
    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle { raw: self.raw.clone() }
    }

    /// Generates with one dsi_session_generate call. `on_token(token, text)` runs on this
    /// thread for each delivered token (token -1: text flushed at the end); returning false
    /// stops (FinishReason::Callback). A cancel returns a CANCELLED error (the session
    /// keeps the prompt and the delivered tokens).
    pub fn generate(
        &mut self,
        sampler: &mut Sampler,
        opts: &GenerateOptions,
        mut on_token: impl FnMut(Token, &str) -> bool,
    ) -> Result<GenerationResult> {
        let mut raw = RawGenOptions::new(opts, true)?;
        let mut state = GenState { on_token: &mut on_token, result: GenerationResult::new(), panic: None };
        raw.o.on_token = Some(token_trampoline);
        raw.o.user_data = &mut state as *mut GenState as *mut c_void;
        let mut r: sys::dsi_generate_result = unsafe { init_struct(|p| sys::dsi_generate_result_init(p)) };
        let st = unsafe { sys::dsi_session_generate(self.ptr(), sampler.ptr, &raw.o, &mut r) };
        if let Some(p) = state.panic.take() {
            resume_unwind(p);
        }
        self.fail(st)?;
        let mut res = state.result;
        res.finish_reason = FinishReason::from_i32(r.finish_reason);
        res.n_prompt = r.n_prompt;
        res.n_reused = r.n_reused;
        res.n_generated = r.n_generated;
        res.prefill_ms = r.prefill_ms;
        res.decode_ms = r.decode_ms;
        Ok(res)
    }

    /// Generation as an iterator of [`Piece`]s, one per generated token, plus a final
    /// `Piece { token: -1, .. }` for text flushed at the end; the pieces concatenate to
    /// generate()'s text. Each step is one dsi_session_generate call with max_tokens = 1
    /// (the first also syncs the prompt), so the sampler and session behave exactly as in
    /// one long call; the text goes through a [`Detokenizer`] and the stop-string rule of
    /// dsi_session_generate (docs/tokenizer.md §6). No thread is involved; a cancel between
    /// steps is sticky in the library and cancels the next step.
    pub fn stream<'a>(&'a mut self, sampler: &'a mut Sampler, opts: &GenerateOptions) -> Result<TokenStream<'a>> {
        if opts.max_tokens < 0 {
            return Err(Error::new(sys::DSI_ERR_INVALID_ARGUMENT, format!("max_tokens = {}: must be >= 0", opts.max_tokens)));
        }
        if let Some(i) = opts.stop.iter().position(|s| s.is_empty()) {
            return Err(Error::new(sys::DSI_ERR_INVALID_ARGUMENT, format!("stop[{}] is empty", i)));
        }
        if opts.prompt.as_ref().map_or(false, |p| p.is_empty()) {
            return Err(Error::new(sys::DSI_ERR_INVALID_ARGUMENT, "the prompt is empty"));
        }
        let detok = self.model().detokenizer()?;
        Ok(TokenStream {
            session: self,
            sampler,
            prompt: opts.prompt.clone(),
            max_tokens: opts.max_tokens,
            stops: opts.stop.iter().map(|s| s.as_bytes().to_vec()).collect(),
            step_opts: GenerateOptions { prompt: None, max_tokens: 1, stop: Vec::new(), stop_tokens: opts.stop_tokens.clone() },
            detok: Some(detok),
            held: Vec::new(),
            result: GenerationResult::new(),
        })
    }
}

/// Iterator of [`Session::stream`]. After the last item, [`TokenStream::result`] holds
/// the counts and the finish reason.
pub struct TokenStream<'a> {
    session: &'a mut Session,
    sampler: &'a mut Sampler,
    prompt: Option<Vec<Token>>,
    max_tokens: i32,
    stops: Vec<Vec<u8>>,
    step_opts: GenerateOptions,
    detok: Option<Detokenizer>,
    held: Vec<u8>,
    result: GenerationResult,
}

impl<'a> TokenStream<'a> {
    pub fn result(&self) -> &GenerationResult {
        &self.result
    }

    fn finish(&mut self, reason: FinishReason, flush: bool) -> Option<Result<Piece>> {
        self.result.finish_reason = reason;
        let mut d = self.detok.take()?;
        if !flush {
            return None;
        }
        let mut rest = std::mem::take(&mut self.held);
        match d.flush_bytes() {
            Ok(b) => rest.extend_from_slice(&b),
            Err(e) => return Some(Err(e)),
        }
        if rest.is_empty() {
            return None;
        }
        let s = String::from_utf8_lossy(&rest).into_owned();
        self.result.text.push_str(&s);
        Some(Ok(Piece { token: -1, text: s }))
    }

    /// Adds a token's bytes; applies the stop strings. Returns the piece and whether a stop
    /// string was found.
    fn emit(&mut self, token: Token, new: Vec<u8>) -> (Piece, bool) {
        let mut t = std::mem::take(&mut self.held);
        t.extend_from_slice(&new);
        let found = self.stops.iter().filter_map(|s| find(&t, s)).min();
        let out = match found {
            Some(at) => t[..at].to_vec(),
            None => {
                let mut hold = 0;
                for s in &self.stops {
                    for h in (hold + 1..=(s.len() - 1).min(t.len())).rev() {
                        if t.ends_with(&s[..h]) {
                            hold = h;
                            break;
                        }
                    }
                }
                self.held = t[t.len() - hold..].to_vec();
                t[..t.len() - hold].to_vec()
            }
        };
        let s = String::from_utf8_lossy(&out).into_owned();
        self.result.text.push_str(&s);
        self.result.tokens.push(token);
        (Piece { token, text: s }, found.is_some())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

unsafe extern "C" fn capture_token(token: Token, _text: *const c_char, _len: usize, ud: *mut c_void) -> i32 {
    if token >= 0 {
        (*(ud as *mut Vec<Token>)).push(token);
    }
    1
}

impl<'a> Iterator for TokenStream<'a> {
    type Item = Result<Piece>;

    fn next(&mut self) -> Option<Result<Piece>> {
        self.detok.as_ref()?;
        let first = self.prompt.take();
        if first.is_none() && self.result.n_generated >= self.max_tokens as u64 {
            return self.finish(FinishReason::Length, true);
        }
        let mut step = self.step_opts.clone();
        if first.is_some() {
            step.prompt = first;
            step.max_tokens = self.max_tokens.min(1);
        }
        let mut raw = match RawGenOptions::new(&step, false) {
            Ok(r) => r,
            Err(e) => {
                self.finish(FinishReason::None, false);
                return Some(Err(e));
            }
        };
        let mut got: Vec<Token> = Vec::new();
        raw.o.on_token = Some(capture_token);
        raw.o.user_data = &mut got as *mut Vec<Token> as *mut c_void;
        let mut r: sys::dsi_generate_result = unsafe { init_struct(|p| sys::dsi_generate_result_init(p)) };
        let st = unsafe { sys::dsi_session_generate(self.session.ptr(), self.sampler.ptr, &raw.o, &mut r) };
        if step.prompt.is_some() {
            self.result.n_prompt = r.n_prompt;
            self.result.n_reused = r.n_reused;
            self.result.prefill_ms = r.prefill_ms;
        }
        self.result.n_generated += r.n_generated;
        self.result.decode_ms += r.decode_ms;
        if st != sys::DSI_OK {
            let e = self.session.fail(st).unwrap_err();
            if e.is_cancelled() {
                self.finish(FinishReason::Cancelled, false);
            } else {
                self.finish(FinishReason::None, false);
            }
            return Some(Err(e));
        }
        if let Some(&tok) = got.first() {
            let bytes = match self.detok.as_mut().unwrap().feed_bytes(tok) {
                Ok(b) => b,
                Err(e) => {
                    self.finish(FinishReason::None, false);
                    return Some(Err(e));
                }
            };
            let (piece, stopped) = self.emit(tok, bytes);
            if stopped {
                self.finish(FinishReason::StopString, false);
            }
            return Some(Ok(piece));
        }
        // no token: EOS, a stop token, a full context, or max_tokens = 0
        self.finish(FinishReason::from_i32(r.finish_reason), true)
    }
}

// ---- thread rules, checked at compile time ------------------------------------------------------

#[allow(dead_code)]
fn _thread_rules() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Context>();
    sync::<Context>();
    send::<Model>();
    sync::<Model>();
    send::<Session>();
    send::<Sampler>();
    send::<Detokenizer>();
    send::<CancelHandle>();
    sync::<CancelHandle>();
}

// `<T as NotSync<_>>::check` is ambiguous (a compile error) exactly when T is Sync: the
// per-handle types must stay !Sync.
trait NotSync<A> {
    fn check() {}
}
impl<T: ?Sized> NotSync<()> for T {}
impl<T: ?Sized + Sync> NotSync<u8> for T {}

#[allow(dead_code)]
fn _not_sync() {
    let _ = <Session as NotSync<_>>::check;
    let _ = <Sampler as NotSync<_>>::check;
    let _ = <Detokenizer as NotSync<_>>::check;
}
