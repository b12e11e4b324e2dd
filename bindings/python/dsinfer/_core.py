"""The Pythonic layer over _ffi: Context, Model, Session, Sampler, Detokenizer, errors."""

import ctypes
import threading
import weakref
from collections import namedtuple

from . import _ffi

try:  # logits / probabilities come back as NumPy arrays when NumPy is importable
    import numpy as _np
except ImportError:  # pragma: no cover - exercised by test_logits_without_numpy
    _np = None

_lib, library_path = _ffi.load_library()
_ffi.bind(_lib)

# ---- errors -----------------------------------------------------------------------------


class Error(Exception):
    """A failed libdsinfer call: ``status`` (the DSI_ERR_* code, negative) and ``message``
    (the library's message for this failure)."""

    def __init__(self, status, message):
        self.status = int(status)
        self.message = message
        super().__init__(message)

    @property
    def status_name(self):
        return status_string(self.status)

    def __str__(self):
        return "%s [%s]" % (self.message, self.status_name)


class InvalidArgumentError(Error): pass        # noqa: E701
class OutOfHostMemoryError(Error): pass        # noqa: E701
class OutOfDeviceMemoryError(Error): pass      # noqa: E701
class IoError(Error): pass                     # noqa: E701
class BadFormatError(Error): pass              # noqa: E701
class UnsupportedError(Error): pass            # noqa: E701
class BackendError(Error): pass                # noqa: E701


class CancelledError(Error):
    """The call was cancelled (Session.cancel); ``result`` holds what was generated."""
    result = None


class ContextFullError(Error): pass            # noqa: E701
class StateMismatchError(Error): pass          # noqa: E701
class AbiMismatchError(Error): pass            # noqa: E701
class BusyError(Error): pass                   # noqa: E701
class NotFoundError(Error): pass               # noqa: E701
class InternalError(Error): pass               # noqa: E701


_ERRORS = {
    _ffi.ERR_INVALID_ARGUMENT: InvalidArgumentError,
    _ffi.ERR_OUT_OF_HOST_MEMORY: OutOfHostMemoryError,
    _ffi.ERR_OUT_OF_DEVICE_MEMORY: OutOfDeviceMemoryError,
    _ffi.ERR_IO: IoError,
    _ffi.ERR_BAD_FORMAT: BadFormatError,
    _ffi.ERR_UNSUPPORTED: UnsupportedError,
    _ffi.ERR_BACKEND: BackendError,
    _ffi.ERR_CANCELLED: CancelledError,
    _ffi.ERR_CONTEXT_FULL: ContextFullError,
    _ffi.ERR_STATE_MISMATCH: StateMismatchError,
    _ffi.ERR_ABI_MISMATCH: AbiMismatchError,
    _ffi.ERR_BUSY: BusyError,
    _ffi.ERR_NOT_FOUND: NotFoundError,
    _ffi.ERR_INTERNAL: InternalError,
}


def _dec(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def status_string(status):
    """The library's short description of a status code."""
    return _dec(_lib.dsi_status_string(status))


def _error(status, message):
    return _ERRORS.get(status, Error)(status, message)


def _check(status, message_fn=None):
    """Raises the Error of a failed call. The message is this thread's last error: every
    failing call records it there (ABI 2), so it is the failure of this very call even on
    a handle that other threads use at the same time."""
    if status != _ffi.OK:
        raise _error(status, _dec(_lib.dsi_last_error()))


_check_thread = _check


def version():
    """The library version string ("MAJOR.MINOR.PATCH")."""
    return _dec(_lib.dsi_version_string())


def abi_version():
    """The ABI version the loaded library implements."""
    return int(_lib.dsi_abi_version())


# ---- handle bookkeeping (for leak checks) -------------------------------------------------

_live_lock = threading.Lock()
_live = {}


def _track(kind, delta):
    with _live_lock:
        _live[kind] = _live.get(kind, 0) + delta


def open_handles():
    """Native handles this binding holds open, by kind ({"session": 1, ...}); all zero
    once every object was closed."""
    with _live_lock:
        return {k: v for k, v in _live.items() if v}


class _Handle:
    """An owned native handle: close() frees it once; context manager; __del__ fallback."""

    _kind = "handle"
    _h = None

    def _fail(self, st):
        """Raises the Error of a failed call on this handle (a no-op for DSI_OK)."""
        _check(st)

    def _adopt(self, h):
        self._h = h
        _track(self._kind, +1)

    @property
    def closed(self):
        return not self._h

    def _handle(self):
        if not self._h:
            raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT,
                                       "%s is closed" % type(self).__name__)
        return self._h

    def close(self):
        h, self._h = self._h, None
        if h:
            try:
                self._free(h)
            except BaseException:
                self._h = h  # not freed (e.g. BUSY): still ours
                raise
            _track(self._kind, -1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._h:
                self.close()
        except Exception:
            pass


# ---- allocation tracking ------------------------------------------------------------------

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.realloc.restype = ctypes.c_void_p
_libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.free.restype = None
_libc.free.argtypes = [ctypes.c_void_p]


class _AllocCounter:
    """Allocator hooks that count the library's live host allocations (slow; for leak
    checks and memory accounting)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live = 0
        self.total = 0
        self.malloc_fn = _ffi.MALLOC_FN(self._malloc)
        self.realloc_fn = _ffi.REALLOC_FN(self._realloc)
        self.free_fn = _ffi.FREE_FN(self._free)

    def _malloc(self, size, _ud):
        p = _libc.malloc(size)
        if p:
            with self.lock:
                self.live += 1
                self.total += 1
        return p

    def _realloc(self, ptr, size, _ud):
        p = _libc.realloc(ptr, size)
        if p and not ptr:
            with self.lock:
                self.live += 1
                self.total += 1
        return p

    def _free(self, ptr, _ud):
        if ptr:
            _libc.free(ptr)
            with self.lock:
                self.live -= 1


# ---- context ------------------------------------------------------------------------------

DeviceInfo = namedtuple("DeviceInfo", "index backend type name memory_total memory_free "
                                      "max_buffer_size features subgroup_size")

_LOG_LEVELS = {"debug": _ffi.LOG_DEBUG, "info": _ffi.LOG_INFO, "warn": _ffi.LOG_WARN,
               "error": _ffi.LOG_ERROR, "none": _ffi.LOG_NONE}


class Context(_Handle):
    """Runtime root (dsi_context): backend, CPU threads, log sink, allocator hooks.

    ``log`` is called as ``log(level, message)`` on the thread that called into the
    library; without it nothing is logged. ``track_allocations=True`` routes the
    library's host allocations through counting hooks (see ``live_allocations``).
    Thread-safe: a Context may be shared by threads.
    """

    _kind = "context"

    def __init__(self, *, n_threads=0, backend=None, backend_dir=None, device_index=-1,
                 devices=None, log=None, log_level="info", track_allocations=False):
        opt = _ffi.init_struct(_ffi.context_options, _lib.dsi_context_options_init,
                               _ffi.ABI_VERSION)
        opt.n_threads = n_threads
        opt.device_index = device_index
        opt.log_level = _LOG_LEVELS[log_level] if isinstance(log_level, str) else log_level
        self._keep = []
        if backend is not None:
            opt.backend = backend.encode()
        if backend_dir is not None:
            opt.backend_dir = backend_dir.encode()
        if devices is not None:  # "backend[:index],..." (since ABI 2)
            opt.devices = devices.encode()
        if log is not None:
            def _log(level, msg, _ud):
                try:
                    log(int(level), _dec(msg))
                except Exception:  # a log sink must not unwind into C
                    pass
            opt.log_fn = _ffi.LOG_FN(_log)
            self._keep.append(opt.log_fn)
        self._alloc = _AllocCounter() if track_allocations else None
        if self._alloc:
            opt.malloc_fn = self._alloc.malloc_fn
            opt.realloc_fn = self._alloc.realloc_fn
            opt.free_fn = self._alloc.free_fn
        h = ctypes.c_void_p()
        _check_thread(_lib.dsi_context_create(ctypes.byref(opt), ctypes.byref(h)))
        self._adopt(h.value)

    def _free(self, h):
        _check(_lib.dsi_context_free(h), lambda: _lib.dsi_context_last_error(h))

    @property
    def live_allocations(self):
        """Host allocations of the library that are not freed yet (needs
        track_allocations=True)."""
        if not self._alloc:
            raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT,
                                       "Context was created without track_allocations")
        with self._alloc.lock:
            return self._alloc.live

    @property
    def backend(self):
        return _dec(_lib.dsi_context_backend(self._handle()))

    @property
    def n_threads(self):
        return int(_lib.dsi_context_n_threads(self._handle()))

    def devices(self):
        h = self._handle()
        n = ctypes.c_int32()
        _check(_lib.dsi_context_device_count(h, ctypes.byref(n)),
               lambda: _lib.dsi_context_last_error(h))
        out = []
        for i in range(n.value):
            info = _ffi.device_info()
            info.struct_size = ctypes.sizeof(info)
            _check(_lib.dsi_context_device_info(h, i, ctypes.byref(info)),
                   lambda: _lib.dsi_context_last_error(h))
            out.append(DeviceInfo(info.index, _dec(info.backend), info.type, _dec(info.name),
                                  info.memory_total, info.memory_free, info.max_buffer_size,
                                  info.features, info.subgroup_size))
        return out

    def load_model(self, path, **kw):
        """Loads a GGUF model: see Model."""
        return Model(self, path, **kw)


# ---- model --------------------------------------------------------------------------------

ModelInfo = namedtuple("ModelInfo", "arch arch_name name n_layers n_embd n_vocab n_heads "
                                    "n_ctx_train n_experts n_experts_used n_draft_layers "
                                    "has_mtp has_dspark has_engram n_params weight_bytes "
                                    "fingerprint")

_SPECIAL = {"bos": _ffi.SPECIAL_BOS, "eos": _ffi.SPECIAL_EOS, "pad": _ffi.SPECIAL_PAD,
            "user": _ffi.SPECIAL_USER, "assistant": _ffi.SPECIAL_ASSISTANT,
            "think_begin": _ffi.SPECIAL_THINK_BEGIN, "think_end": _ffi.SPECIAL_THINK_END}
_ROLES = {"system": _ffi.ROLE_SYSTEM, "developer": _ffi.ROLE_SYSTEM, "user": _ffi.ROLE_USER,
          "assistant": _ffi.ROLE_ASSISTANT, "tool": _ffi.ROLE_TOOL}
_THINKING = {False: _ffi.THINKING_OFF, None: _ffi.THINKING_OFF, "off": _ffi.THINKING_OFF,
             True: _ffi.THINKING_ON, "on": _ffi.THINKING_ON, "max": _ffi.THINKING_MAX}


def _tokens_array(tokens):
    tokens = list(tokens)
    arr = (_ffi.c_token * max(len(tokens), 1))(*tokens)
    return arr, len(tokens)


class Model(_Handle):
    """Immutable weights and tokenizer (dsi_model). Thread-safe: tokenize, render and
    create sessions from any thread. ``access``: "mmap" (default) or "pread";
    ``verify_file`` / ``resident``: DSI_MODEL_FLAG_VERIFY_FILE / _RESIDENT (docs/api.md,
    "Model files"); ``progress(stage, done, total)`` may return False to abort loading
    (CancelledError);
    ``coalesce=True`` (experimental, DSI_MODEL_FLAG_COALESCE): generations running at once
    on sessions of this model, from different threads, share batched steps.
    """

    _kind = "model"

    def __init__(self, context, path, *, access="mmap", progress=None, verify_file=False,
                 resident=False, coalesce=False):
        self.context = context
        opt = _ffi.init_struct(_ffi.model_options, _lib.dsi_model_options_init)
        opt.access = {"mmap": _ffi.ACCESS_MMAP, "pread": _ffi.ACCESS_PREAD}[access]
        opt.flags = (_ffi.MODEL_FLAG_VERIFY_FILE if verify_file else 0) | \
            (_ffi.MODEL_FLAG_RESIDENT if resident else 0)
        if coalesce:  # experimental (DSI_MODEL_FLAG_COALESCE, since 0.2)
            opt.flags |= _ffi.MODEL_FLAG_COALESCE
        exc = []
        if progress is not None:
            def _progress(stage, done, total, _ud):
                try:
                    return 0 if progress(int(stage), int(done), int(total)) is False else 1
                except BaseException as e:  # stop loading and re-raise after the call
                    exc.append(e)
                    return 0
            opt.progress_fn = _ffi.PROGRESS_FN(_progress)
        h = ctypes.c_void_p()
        st = _lib.dsi_model_load(context._handle(), str(path).encode(), ctypes.byref(opt),
                                 ctypes.byref(h))
        if exc:
            raise exc[0]
        _check_thread(st)
        self._adopt(h.value)
        self._info = None
        self._children = weakref.WeakSet()

    def _free(self, h):
        # A detokenizer must not outlive its model (the library does not count them):
        # refuse like the library does for sessions.
        alive = [c for c in list(self._children) if not c.closed]
        if alive:
            raise BusyError(_ffi.ERR_BUSY, "Model.close: %d %s of this model still open"
                            % (len(alive), type(alive[0]).__name__))
        _check(_lib.dsi_model_free(h), lambda: _lib.dsi_model_last_error(h))


    @property
    def info(self):
        if self._info is None:
            i = _ffi.model_info()
            i.struct_size = ctypes.sizeof(i)
            self._fail(_lib.dsi_model_get_info(self._handle(), ctypes.byref(i)))
            self._info = ModelInfo(i.arch, _dec(i.arch_name), _dec(i.name), i.n_layers,
                                   i.n_embd, i.n_vocab, i.n_heads, i.n_ctx_train, i.n_experts,
                                   i.n_experts_used, i.n_draft_layers, bool(i.has_mtp),
                                   bool(i.has_dspark), bool(i.has_engram), i.n_params,
                                   i.weight_bytes, bytes(i.fingerprint))
        return self._info

    @property
    def n_vocab(self):
        return self.info.n_vocab

    def metadata(self):
        """All GGUF metadata as {key: value-as-text}."""
        h = self._handle()
        n = ctypes.c_int32()
        self._fail(_lib.dsi_model_meta_count(h, ctypes.byref(n)))
        out = {}
        for i in range(n.value):
            k = self._meta_text(lambda b, c, nd: _lib.dsi_model_meta_key(h, i, b, c, nd))
            out[k] = self._meta_text(lambda b, c, nd: _lib.dsi_model_meta_value(h, i, b, c, nd))
        return out

    def meta(self, key):
        """One metadata value as text, or None when the key is absent."""
        h = self._handle()
        try:
            return self._meta_text(lambda b, c, nd: _lib.dsi_model_meta_find(h, key.encode(), b, c, nd))
        except NotFoundError:
            return None

    def _meta_text(self, call):
        need = ctypes.c_size_t()
        self._fail(call(None, 0, ctypes.byref(need)))
        buf = ctypes.create_string_buffer(need.value + 1)
        self._fail(call(buf, need.value + 1, ctypes.byref(need)))
        return _dec(buf.raw[:need.value])

    def tokenize(self, text, *, add_bos=False, parse_special=False):
        """Token ids of ``text`` (str or bytes). ``parse_special`` matches special-token
        text; never use it on text from users (docs/bindings.md)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        flags = (_ffi.TOKENIZE_ADD_BOS if add_bos else 0) | \
            (_ffi.TOKENIZE_PARSE_SPECIAL if parse_special else 0)
        h = self._handle()
        need = ctypes.c_size_t()
        st = _lib.dsi_tokenize(h, data, len(data), flags, None, 0, ctypes.byref(need))
        if st != _ffi.OK and not (st == _ffi.ERR_INVALID_ARGUMENT and need.value > 0):
            self._fail(st)
        arr = (_ffi.c_token * max(need.value, 1))()
        self._fail(_lib.dsi_tokenize(h, data, len(data), flags, arr, need.value,
                                     ctypes.byref(need)))
        return list(arr[:need.value])

    def token_bytes(self, token):
        """Raw bytes of one token (may be part of a UTF-8 character)."""
        h = self._handle()
        need = ctypes.c_size_t()
        st = _lib.dsi_token_to_bytes(h, token, None, 0, ctypes.byref(need))
        if st != _ffi.OK and need.value == 0:
            self._fail(st)
        buf = ctypes.create_string_buffer(max(need.value, 1))
        self._fail(_lib.dsi_token_to_bytes(h, token, buf, need.value, ctypes.byref(need)))
        return buf.raw[:need.value]

    def detokenize_bytes(self, tokens):
        """Concatenated raw bytes of ``tokens``."""
        h = self._handle()
        arr, n = _tokens_array(tokens)
        need = ctypes.c_size_t()
        st = _lib.dsi_detokenize(h, arr, n, None, 0, ctypes.byref(need))
        if st != _ffi.OK and need.value == 0:
            self._fail(st)
        buf = ctypes.create_string_buffer(max(need.value, 1))
        self._fail(_lib.dsi_detokenize(h, arr, n, buf, need.value, ctypes.byref(need)))
        return buf.raw[:need.value]

    def detokenize(self, tokens):
        """Text of ``tokens`` (invalid UTF-8 replaced by U+FFFD)."""
        return self.detokenize_bytes(tokens).decode("utf-8", "replace")

    def special_token(self, which):
        """Id of a special token ("bos", "eos", "pad", "user", "assistant", "think_begin",
        "think_end" or a DSI_SPECIAL_* value), or None if the vocabulary lacks it."""
        w = _SPECIAL[which] if isinstance(which, str) else which
        t = _ffi.c_token()
        try:
            self._fail(_lib.dsi_model_special_token(self._handle(), w, ctypes.byref(t)))
        except NotFoundError:
            return None
        return t.value

    @property
    def bos(self):
        return self.special_token("bos")

    @property
    def eos(self):
        return self.special_token("eos")

    @staticmethod
    def _chat_args(messages, thinking, add_generation_prompt, add_bos):
        """(message pointer array, count, options, memory to keep alive)."""
        keep = []
        structs = []
        for i, m in enumerate(messages):
            msg = _ffi.chat_message()
            msg.struct_size = ctypes.sizeof(msg)
            role = m["role"]
            if role not in _ROLES:
                raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT,
                                           "messages[%d].role %r is not one of %s"
                                           % (i, role, ", ".join(sorted(_ROLES))))
            msg.role = _ROLES[role]
            for field in ("content", "reasoning"):
                v = m.get(field)
                if v is not None:
                    b = v.encode("utf-8")
                    keep.append(b)
                    setattr(msg, field, b)
            structs.append(msg)
        ptrs = (ctypes.POINTER(_ffi.chat_message) * max(len(structs), 1))(
            *[ctypes.pointer(s) for s in structs])
        opt = _ffi.init_struct(_ffi.chat_options, _lib.dsi_chat_options_init)
        opt.thinking = _THINKING[thinking]
        opt.add_generation_prompt = 1 if add_generation_prompt else 0
        opt.add_bos = 1 if add_bos else 0
        keep.append(structs)
        return ptrs, len(structs), opt, keep

    def render_chat(self, messages, *, thinking=False, add_generation_prompt=True,
                    add_bos=True):
        """The DeepSeek V4 chat text of ``messages`` (dicts with "role", "content" and an
        optional "reasoning"); it contains special tokens as text — for display and logs.
        To run a conversation use chat_tokens(), which message content cannot forge."""
        h = self._handle()
        ptrs, n, opt, _keep = self._chat_args(messages, thinking, add_generation_prompt, add_bos)
        need = ctypes.c_size_t()
        st = _lib.dsi_chat_render(h, ptrs, n, ctypes.byref(opt), None, 0, ctypes.byref(need))
        if st != _ffi.OK and need.value == 0:
            self._fail(st)
        buf = ctypes.create_string_buffer(need.value + 1)
        self._fail(_lib.dsi_chat_render(h, ptrs, n, ctypes.byref(opt), buf, need.value + 1,
                                        ctypes.byref(need)))
        return buf.raw[:need.value].decode("utf-8", "replace")

    def chat_tokens(self, messages, *, thinking=False, add_generation_prompt=True,
                    add_bos=True):
        """Token ids of a conversation, ready as a generation prompt (dsi_chat_tokenize):
        the template's structure becomes special tokens and every message's content is
        tokenized as plain text, so special-token text inside a message stays text."""
        h = self._handle()
        ptrs, n, opt, _keep = self._chat_args(messages, thinking, add_generation_prompt, add_bos)
        need = ctypes.c_size_t()
        st = _lib.dsi_chat_tokenize(h, ptrs, n, ctypes.byref(opt), None, 0, ctypes.byref(need))
        if st != _ffi.OK and need.value == 0:
            self._fail(st)
        arr = (_ffi.c_token * max(need.value, 1))()
        self._fail(_lib.dsi_chat_tokenize(h, ptrs, n, ctypes.byref(opt), arr, need.value,
                                          ctypes.byref(need)))
        return list(arr[:need.value])

    def type_bytes(self, type_id):
        b = ctypes.c_uint64()
        self._fail(_lib.dsi_model_type_bytes(self._handle(), type_id, ctypes.byref(b)))
        return b.value

    def session(self, **kw):
        """A new Session on this model (see Session)."""
        return Session(self, **kw)

    def detokenizer(self):
        return Detokenizer(self)


def type_name(type_id):
    """Name of a tensor type ("f32", "q4_k", ...) or None."""
    n = _lib.dsi_type_name(type_id)
    return _dec(n) if n is not None else None


# ---- detokenizer --------------------------------------------------------------------------

class Detokenizer(_Handle):
    """Incremental token -> UTF-8 text decoder (one thread at a time)."""

    _kind = "detokenizer"

    def __init__(self, model):
        self.model = model
        h = ctypes.c_void_p()
        _check_thread(_lib.dsi_detokenizer_create(model._handle(), ctypes.byref(h)))
        self._adopt(h.value)
        model._children.add(self)

    def _free(self, h):
        _lib.dsi_detokenizer_free(h)

    def _call(self, fn):
        need = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(64)
        st = fn(buf, 64, ctypes.byref(need))
        if st != _ffi.OK and need.value > 64:
            buf = ctypes.create_string_buffer(need.value)
            st = fn(buf, need.value, ctypes.byref(need))
        mh = self.model._h
        _check(st, lambda: _lib.dsi_model_last_error(mh))
        return buf.raw[:need.value]

    def feed_bytes(self, token):
        """Bytes of complete UTF-8 characters that ``token`` finished."""
        h = self._handle()
        return self._call(lambda b, c, n: _lib.dsi_detokenizer_feed(h, token, b, c, n))

    def flush_bytes(self):
        h = self._handle()
        return self._call(lambda b, c, n: _lib.dsi_detokenizer_flush(h, b, c, n))

    def feed(self, token):
        return self.feed_bytes(token).decode("utf-8", "replace")

    def flush(self):
        return self.flush_bytes().decode("utf-8", "replace")


# ---- sampler ------------------------------------------------------------------------------

class Sampler(_Handle):
    """Sampling settings and RNG (dsi_sampler); one thread at a time. temperature=0 is
    greedy. ``logit_bias`` is {token: bias}. With ``context`` the sampler allocates through
    that context's hooks (dsi_sampler_create_with_context) and the context cannot be
    closed before the sampler."""

    _kind = "sampler"

    def __init__(self, *, context=None, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                 repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0,
                 penalty_last_n=64, seed=0, logit_bias=None):
        opt = _ffi.init_struct(_ffi.sampler_options, _lib.dsi_sampler_options_init)
        opt.temperature = temperature
        opt.top_k = top_k
        opt.top_p = top_p
        opt.min_p = min_p
        opt.repetition_penalty = repetition_penalty
        opt.frequency_penalty = frequency_penalty
        opt.presence_penalty = presence_penalty
        opt.penalty_last_n = penalty_last_n
        opt.seed = seed
        if logit_bias:
            items = list(logit_bias.items())
            arr = (_ffi.logit_bias * len(items))(*[_ffi.logit_bias(t, b) for t, b in items])
            opt.logit_bias = arr
            opt.n_logit_bias = len(items)
        h = ctypes.c_void_p()
        self.context = context
        if context is not None:
            _check(_lib.dsi_sampler_create_with_context(context._handle(), ctypes.byref(opt),
                                                        ctypes.byref(h)))
        else:
            _check(_lib.dsi_sampler_create(ctypes.byref(opt), ctypes.byref(h)))
        self._adopt(h.value)

    def _free(self, h):
        _lib.dsi_sampler_free(h)


    def sample(self, logits):
        """Samples a token from a sequence of n_vocab floats (NumPy array, memoryview,
        list) and records it in the penalty history."""
        if _np is not None and isinstance(logits, _np.ndarray):
            arr = _np.ascontiguousarray(logits, dtype=_np.float32)
            ptr = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            n = arr.size
        else:
            vals = list(logits)
            arr = (ctypes.c_float * max(len(vals), 1))(*vals)
            ptr, n = arr, len(vals)
        t = _ffi.c_token()
        self._fail(_lib.dsi_sampler_sample(self._handle(), ptr, n, ctypes.byref(t)))
        return t.value

    def accept(self, token):
        self._fail(_lib.dsi_sampler_accept(self._handle(), token))

    def reset(self):
        self._fail(_lib.dsi_sampler_reset(self._handle()))

    def probs(self):
        """The distribution the last sample() drew from (a copy; see Session.logits)."""
        p = ctypes.POINTER(ctypes.c_float)()
        n = ctypes.c_int32()
        self._fail(_lib.dsi_sampler_probs(self._handle(), ctypes.byref(p), ctypes.byref(n)))
        return _float_copy(p, n.value)


def _float_copy(ptr, n):
    """A copy of n floats at ptr: a NumPy float32 array, or a memoryview (format 'f')."""
    if _np is not None:
        return _np.ctypeslib.as_array(ptr, (n,)).copy()
    arr = (ctypes.c_float * n)()
    ctypes.memmove(arr, ptr, n * ctypes.sizeof(ctypes.c_float))
    return memoryview(arr).cast("B").cast("f")


# ---- session ------------------------------------------------------------------------------

_FINISH = {_ffi.FINISH_NONE: "none", _ffi.FINISH_LENGTH: "length", _ffi.FINISH_EOS: "eos",
           _ffi.FINISH_STOP_TOKEN: "stop_token", _ffi.FINISH_STOP_STRING: "stop_string",
           _ffi.FINISH_CALLBACK: "callback", _ffi.FINISH_CANCELLED: "cancelled",
           _ffi.FINISH_CONTEXT_FULL: "context_full"}


class GenerationResult:
    """What a generation produced: ``text``, ``tokens`` (the delivered ids),
    ``finish_reason`` ("length", "eos", "stop_token", "stop_string", "callback",
    "cancelled", "context_full") and the library's counts and timings."""

    def __init__(self):
        self.text = ""
        self.tokens = []
        self.finish_reason = "none"
        self.n_prompt = 0
        self.n_reused = 0
        self.n_generated = 0
        self.prefill_ms = 0.0
        self.decode_ms = 0.0

    def __repr__(self):
        return ("GenerationResult(finish_reason=%r, n_prompt=%d, n_reused=%d, "
                "n_generated=%d, text=%r)" % (self.finish_reason, self.n_prompt,
                                              self.n_reused, self.n_generated, self.text))


Piece = namedtuple("Piece", "token text")
Piece.__doc__ = """One streamed step: the token id (-1 for text flushed at the end) and the
text that became final with it (may be "" while held back)."""


class _GenOptions:
    """A dsi_generate_options and the memory its pointers refer to."""

    def __init__(self, prompt, max_tokens, stop, stop_tokens, on_token):
        o = _ffi.init_struct(_ffi.generate_options, _lib.dsi_generate_options_init)
        o.max_tokens = max_tokens
        self.keep = []
        if prompt is not None:
            arr, n = _tokens_array(prompt)
            if n:
                o.prompt = ctypes.cast(arr, ctypes.POINTER(_ffi.c_token))
                o.n_prompt = n
                self.keep.append(arr)
            else:
                raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT, "prompt is empty")
        if stop_tokens:
            arr, n = _tokens_array(stop_tokens)
            o.stop_tokens = ctypes.cast(arr, ctypes.POINTER(_ffi.c_token))
            o.n_stop_tokens = n
            self.keep.append(arr)
        if stop:
            bs = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in stop]
            arr = (ctypes.c_char_p * len(bs))(*bs)
            o.stop_strings = arr
            o.n_stop_strings = len(bs)
            self.keep += [arr, bs]
        if on_token is not None:
            o.on_token = _ffi.TOKEN_FN(on_token)
            self.keep.append(o.on_token)
        self.opt = o


def _stops_list(stop):
    if stop is None:
        return []
    if isinstance(stop, (str, bytes)):
        return [stop]
    return list(stop)


class Session(_Handle):
    """One timeline (dsi_session): KV cache and logits. One thread at a time, except
    cancel(), which any thread may call. ``n_ctx`` 0 = min(4096, trained context)."""

    _kind = "session"

    def __init__(self, model, *, n_ctx=0, n_batch=0, flags=0):
        self.model = model
        opt = _ffi.init_struct(_ffi.session_options, _lib.dsi_session_options_init)
        opt.n_ctx = n_ctx
        opt.n_batch = n_batch
        opt.flags = flags
        h = ctypes.c_void_p()
        _check_thread(_lib.dsi_session_create(model._handle(), ctypes.byref(opt),
                                              ctypes.byref(h)))
        self._adopt(h.value)
        model._children.add(self)

    def _free(self, h):
        _lib.dsi_session_free(h)


    def sync(self, tokens):
        """Makes the timeline equal ``tokens`` (longest common prefix kept); returns how
        many tokens were reused."""
        arr, n = _tokens_array(tokens)
        reused = ctypes.c_size_t()
        self._fail(_lib.dsi_session_sync(self._handle(), arr, n, ctypes.byref(reused)))
        return reused.value

    def append(self, tokens):
        arr, n = _tokens_array(tokens)
        self._fail(_lib.dsi_session_append(self._handle(), arr, n))

    def logits(self):
        """Logits of the last evaluated token: a NumPy float32 array when NumPy is
        present, else a memoryview of format 'f'. A copy: it stays valid after later
        calls."""
        p = ctypes.POINTER(ctypes.c_float)()
        n = ctypes.c_int32()
        self._fail(_lib.dsi_session_logits(self._handle(), ctypes.byref(p), ctypes.byref(n)))
        return _float_copy(p, n.value)

    @property
    def position(self):
        pos = ctypes.c_uint32()
        self._fail(_lib.dsi_session_position(self._handle(), ctypes.byref(pos)))
        return pos.value

    def tokens(self):
        h = self._handle()
        need = ctypes.c_size_t()
        st = _lib.dsi_session_tokens(h, None, 0, ctypes.byref(need))
        if st != _ffi.OK and need.value == 0:
            self._fail(st)
        arr = (_ffi.c_token * max(need.value, 1))()
        self._fail(_lib.dsi_session_tokens(h, arr, need.value, ctypes.byref(need)))
        return list(arr[:need.value])

    def reset(self):
        self._fail(_lib.dsi_session_reset(self._handle()))

    def cancel(self):
        """Any thread: stops the running generate()/sync()/append() at the next token or
        prefill chunk (it raises CancelledError), and a stream() at its next token. Made
        while nothing runs, the request is sticky: the next such call is cancelled before
        it changes the session (dsi_session_cancel). Never call it concurrently with
        close()."""
        h = self._h
        if h:
            _lib.dsi_session_cancel(h)

    def cancel_clear(self):
        """Drops a pending cancel request (one that arrived after the call it was meant for
        had finished); call it when starting new work (dsi_session_cancel_clear)."""
        _lib.dsi_session_cancel_clear(self._handle())

    def generate(self, sampler, prompt=None, *, max_tokens=256, stop=None, stop_tokens=None,
                 on_token=None):
        """Generates with one dsi_session_generate call and returns a GenerationResult.

        ``prompt``: token ids synced first (prefix reused); without it the session must
        hold logits. ``stop``: strings that end generation (never delivered);
        ``stop_tokens``: ids that end it besides EOS. ``on_token(token, text)`` is called
        on this thread for each token (token -1 for the final held-back text); returning
        False stops (finish "callback"). A cancel raises CancelledError whose ``result``
        holds the delivered text.
        """
        res = GenerationResult()
        parts = []
        exc = []

        def _cb(token, text, n, _ud):
            s = ctypes.string_at(text, n).decode("utf-8", "replace") if n else ""
            parts.append(s)
            if token >= 0:
                res.tokens.append(token)
            if on_token is None or exc:
                return 1
            try:
                return 0 if on_token(int(token), s) is False else 1
            except BaseException as e:
                exc.append(e)
                return 0

        g = _GenOptions(prompt, max_tokens, _stops_list(stop), stop_tokens, _cb)
        r = _ffi.generate_result()
        r.struct_size = ctypes.sizeof(r)
        st = _lib.dsi_session_generate(self._handle(), sampler._handle(), ctypes.byref(g.opt),
                                       ctypes.byref(r))
        res.text = "".join(parts)
        res.finish_reason = _FINISH.get(r.finish_reason, "none")
        res.n_prompt, res.n_reused, res.n_generated = r.n_prompt, r.n_reused, r.n_generated
        res.prefill_ms, res.decode_ms = r.prefill_ms, r.decode_ms
        if exc:
            raise exc[0]
        if st != _ffi.OK:
            try:
                self._fail(st)
            except CancelledError as e:
                e.result = res
                raise
        return res

    def stream(self, sampler, prompt=None, *, max_tokens=256, stop=None, stop_tokens=None):
        """Generation as an iterator of Piece(token, text), one per generated token (text
        may be "" while it is held back), plus Piece(-1, rest) for text flushed at the
        end. Same options and output as generate(); the iterator's ``result`` is the
        GenerationResult once it is exhausted. See docs/bindings.md for how it steps."""
        return Stream(self, sampler, prompt, max_tokens, _stops_list(stop), stop_tokens)


class Stream:
    """Iterator returned by Session.stream().

    Each step is one dsi_session_generate call with max_tokens = 1 (the first one also
    syncs the prompt), so the sampler, the session, the stop tokens and cancellation (a
    request between steps is sticky and cancels the next step) behave exactly as in one
    long call; the text of the steps goes through a Detokenizer and the stop-string
    hold-back rule of dsi_session_generate (docs/tokenizer.md §6), so the pieces
    concatenate to generate()'s text.
    """

    def __init__(self, session, sampler, prompt, max_tokens, stops, stop_tokens):
        if max_tokens < 0:
            raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT,
                                       "max_tokens = %d: must be >= 0" % max_tokens)
        for i, s in enumerate(stops):
            if not s:
                raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT, "stop[%d] is empty" % i)
        self.session = session
        self.sampler = sampler
        self.result = GenerationResult()
        self._prompt = list(prompt) if prompt is not None else None
        self._max = max_tokens
        self._stops = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in stops]
        self._stop_tokens = list(stop_tokens or [])
        self._detok = Detokenizer(session.model)
        self._held = b""
        self._done = False
        # the callback must not refer to self: no reference cycle, so an abandoned stream
        # is freed (and closes its detokenizer) at once
        last = self._last = []

        def _cb(token, _text, _n, _ud):
            if token >= 0:
                last.append(int(token))
            return 1
        self._gen = _GenOptions(None, 1, [], self._stop_tokens, _cb)

    def __iter__(self):
        return self

    def _finish(self, reason, flush=True):
        self._done = True
        self.result.finish_reason = reason
        rest = b""
        if flush:
            rest = self._held + self._detok.flush_bytes()
        self._held = b""
        self._detok.close()
        if rest:
            s = rest.decode("utf-8", "replace")
            self.result.text += s
            return Piece(-1, s)
        return None

    def _emit(self, token, new_bytes):
        """Adds a token's text, applies the stop strings; returns (piece, stopped)."""
        t = self._held + new_bytes
        at = -1
        for s in self._stops:
            i = t.find(s)
            if i >= 0 and (at < 0 or i < at):
                at = i
        if at >= 0:
            out, self._held = t[:at], b""
        else:
            hold = 0
            for s in self._stops:
                for h in range(min(len(s) - 1, len(t)), hold, -1):
                    if t.endswith(s[:h]):
                        hold = h
                        break
            out, self._held = t[:len(t) - hold], t[len(t) - hold:]
        s = out.decode("utf-8", "replace")
        self.result.text += s
        self.result.tokens.append(token)
        return Piece(token, s), at >= 0

    def __next__(self):
        if self._done:
            raise StopIteration
        s = self.session
        r = self.result
        if r.n_generated >= self._max and self._prompt is None:
            p = self._finish("length")
            if p is None:
                raise StopIteration
            return p
        o = self._gen.opt
        first = self._prompt is not None
        if first:
            arr, n = _tokens_array(self._prompt)
            if n == 0:
                self._done = True
                raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT, "prompt is empty")
            o.prompt = ctypes.cast(arr, ctypes.POINTER(_ffi.c_token))
            o.n_prompt = n
            o.max_tokens = min(1, self._max)
        res = _ffi.generate_result()
        res.struct_size = ctypes.sizeof(res)
        del self._last[:]
        st = _lib.dsi_session_generate(s._handle(), self.sampler._handle(), ctypes.byref(o),
                                       ctypes.byref(res))
        if first:
            self._prompt = None
            o.prompt = None
            o.n_prompt = 0
            o.max_tokens = 1
            r.n_prompt, r.n_reused, r.prefill_ms = res.n_prompt, res.n_reused, res.prefill_ms
        r.n_generated += res.n_generated
        r.decode_ms += res.decode_ms
        if st != _ffi.OK:
            self._finish("cancelled" if st == _ffi.ERR_CANCELLED else "none", flush=False)
            try:
                s._fail(st)
            except CancelledError as e:
                e.result = r
                raise
        reason = res.finish_reason
        if self._last:
            tok = self._last[0]
            piece, stopped = self._emit(tok, self._detok.feed_bytes(tok))
            if stopped:
                self._finish("stop_string", flush=False)
            return piece
        # no token: EOS, a stop token, context full, or max_tokens = 0
        p = self._finish(_FINISH.get(reason, "none"))
        if p is None:
            raise StopIteration
        return p

    def close(self):
        """Ends the stream early (the session keeps the tokens generated so far)."""
        if not self._done:
            self._finish("callback", flush=False)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
