// Package dsinfer is the Go binding of libdsinfer (DeepSeek V4 / V4.1 Flash inference),
// over cgo.
//
//	ctx, err := dsinfer.NewContext(&dsinfer.ContextOptions{Threads: 2})
//	model, err := ctx.LoadModel("model.gguf", nil)
//	s, err := model.NewSession(nil)
//	smp, err := dsinfer.NewSampler(dsinfer.Greedy())
//	prompt, err := model.Tokenize("The capital of France is", true, false)
//	st := s.Stream(context.Background(), smp, &dsinfer.GenerateOptions{Prompt: prompt, MaxTokens: 32})
//	for p := range st.C {
//		fmt.Print(p.Text)
//	}
//	res, err := st.Wait()
//
// Every handle is an io.Closer; close sessions, samplers and detokenizers before their
// model, and models before their context (the library answers ErrBusy otherwise).
// Context and Model are safe for concurrent use; a Session, Sampler or Detokenizer
// serializes its calls (one at a time), except Session.Cancel, which never waits.
// Cancellation: cancel the context.Context given to Generate / Stream, or call
// Session.Cancel from any goroutine.
package dsinfer

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// Token is a token id.
type Token = int32

// Status codes (DSI_ERR_*).
const (
	StatusOK                = int(C.DSI_OK)
	StatusInvalidArgument   = int(C.DSI_ERR_INVALID_ARGUMENT)
	StatusOutOfHostMemory   = int(C.DSI_ERR_OUT_OF_HOST_MEMORY)
	StatusOutOfDeviceMemory = int(C.DSI_ERR_OUT_OF_DEVICE_MEMORY)
	StatusIO                = int(C.DSI_ERR_IO)
	StatusBadFormat         = int(C.DSI_ERR_BAD_FORMAT)
	StatusUnsupported       = int(C.DSI_ERR_UNSUPPORTED)
	StatusBackend           = int(C.DSI_ERR_BACKEND)
	StatusCancelled         = int(C.DSI_ERR_CANCELLED)
	StatusContextFull       = int(C.DSI_ERR_CONTEXT_FULL)
	StatusStateMismatch     = int(C.DSI_ERR_STATE_MISMATCH)
	StatusABIMismatch       = int(C.DSI_ERR_ABI_MISMATCH)
	StatusBusy              = int(C.DSI_ERR_BUSY)
	StatusNotFound          = int(C.DSI_ERR_NOT_FOUND)
	StatusInternal          = int(C.DSI_ERR_INTERNAL)
)

// Error is a failed libdsinfer call: the status and the library's message. Cause is set
// when a context.Context ended the call (errors.Is(err, context.Canceled) holds then).
type Error struct {
	Status  int
	Message string
	Cause   error
}

func (e *Error) Error() string { return fmt.Sprintf("%s [%s]", e.Message, StatusString(e.Status)) }

// Is matches another *Error by status, so errors.Is(err, dsinfer.ErrCancelled) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status
}

func (e *Error) Unwrap() error { return e.Cause }

// Sentinels for errors.Is.
var (
	ErrInvalidArgument = &Error{Status: StatusInvalidArgument}
	ErrIO              = &Error{Status: StatusIO}
	ErrBadFormat       = &Error{Status: StatusBadFormat}
	ErrCancelled       = &Error{Status: StatusCancelled}
	ErrContextFull     = &Error{Status: StatusContextFull}
	ErrBusy            = &Error{Status: StatusBusy}
	ErrNotFound        = &Error{Status: StatusNotFound}
)

// StatusString is the library's short description of a status code.
func StatusString(status int) string { return C.GoString(C.dsi_status_string(C.dsi_status(status))) }

// Version is the library version ("MAJOR.MINOR.PATCH").
func Version() string { return C.GoString(C.dsi_version_string()) }

// ABIVersion is the ABI version the loaded library implements.
func ABIVersion() uint32 { return uint32(C.dsi_abi_version()) }

// check turns a status into an error with the calling thread's last message: every
// failing call records it there (ABI 2), so it is this call's own failure even on a model
// other goroutines use at once. dsi_last_error is thread-local and a goroutine may move
// between OS threads from one cgo call to the next: every method that calls into the
// library first pins its goroutine to its thread (defer pin()()).
func check(st C.dsi_status) error {
	if st == C.DSI_OK {
		return nil
	}
	return &Error{Status: int(st), Message: C.GoString(C.dsi_last_error())}
}

// pin locks the goroutine to its OS thread until the returned function runs.
func pin() func() {
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}

// onThread runs one C call and checks it on the same OS thread.
func onThread(call func() C.dsi_status) error {
	defer pin()()
	return check(call())
}

func closedErr(what string) error {
	return &Error{Status: StatusInvalidArgument, Message: what + " is closed"}
}

// cmem is C memory that lives for one call (cgo forbids Go pointers inside memory
// passed to C, so option structs and the arrays they point to live here).
type cmem struct{ ptrs []unsafe.Pointer }

func (m *cmem) alloc(n int) unsafe.Pointer {
	if n == 0 {
		n = 1
	}
	p := C.calloc(1, C.size_t(n))
	if p == nil {
		panic("dsinfer: out of memory")
	}
	m.ptrs = append(m.ptrs, p)
	return p
}

func (m *cmem) str(s string) *C.char {
	p := (*C.char)(m.alloc(len(s) + 1))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(p)), len(s)), s)
	return p
}

func (m *cmem) tokens(t []Token) *C.dsi_token {
	p := (*C.dsi_token)(m.alloc(len(t) * 4))
	copy(unsafe.Slice((*Token)(unsafe.Pointer(p)), len(t)), t)
	return p
}

func (m *cmem) free() {
	for _, p := range m.ptrs {
		C.free(p)
	}
	m.ptrs = nil
}

// ---- context ----------------------------------------------------------------------------

// LogLevel of the context's log sink.
type LogLevel int32

const (
	LogDebug LogLevel = LogLevel(C.DSI_LOG_DEBUG)
	LogInfo  LogLevel = LogLevel(C.DSI_LOG_INFO)
	LogWarn  LogLevel = LogLevel(C.DSI_LOG_WARN)
	LogError LogLevel = LogLevel(C.DSI_LOG_ERROR)
	LogNone  LogLevel = LogLevel(C.DSI_LOG_NONE)
)

// ContextOptions of NewContext; the zero value is the library's defaults.
type ContextOptions struct {
	Threads     int    // CPU worker threads; 0 = all online CPUs
	Backend     string // "cpu" (default), "vulkan", "cuda", "auto"
	BackendDir  string
	DeviceIndex *int   // nil = best device (-1)
	Devices     string // "backend[:index],..." to open (since ABI 2); "" = Backend + DeviceIndex
	// Log receives the library's messages on the goroutine that called into it; nil: no
	// logging anywhere.
	Log      func(level LogLevel, message string)
	LogLevel *LogLevel // nil = LogInfo
	// TrackAllocations routes the library's host allocations through counting hooks
	// (Context.LiveAllocations).
	TrackAllocations bool
}

// Context is the runtime root (dsi_context): backend, threads, log sink, allocator hooks.
// Safe for concurrent use.
type Context struct {
	mu        sync.Mutex
	ptr       *C.dsi_context
	log       cgo.Handle
	stats     *C.dsigo_alloc_stats
	finalLive int64
	finalAll  int64
}

// NewContext creates a context.
func NewContext(opts *ContextOptions) (*Context, error) {
	if opts == nil {
		opts = &ContextOptions{}
	}
	var m cmem
	defer m.free()
	o := (*C.dsi_context_options)(m.alloc(C.sizeof_dsi_context_options))
	C.dsigo_context_options_init(o)
	o.n_threads = C.int32_t(opts.Threads)
	if opts.DeviceIndex != nil {
		o.device_index = C.int32_t(*opts.DeviceIndex)
	}
	if opts.LogLevel != nil {
		o.log_level = C.int32_t(*opts.LogLevel)
	}
	if opts.Backend != "" {
		o.backend = m.str(opts.Backend)
	}
	if opts.BackendDir != "" {
		o.backend_dir = m.str(opts.BackendDir)
	}
	if opts.Devices != "" {
		o.devices = m.str(opts.Devices)
	}
	c := &Context{}
	if opts.Log != nil {
		c.log = cgo.NewHandle(opts.Log)
		C.dsigo_set_log(o, C.uintptr_t(c.log))
	}
	if opts.TrackAllocations {
		c.stats = (*C.dsigo_alloc_stats)(C.calloc(1, C.sizeof_dsigo_alloc_stats))
		C.dsigo_set_alloc_hooks(o, c.stats)
	}
	var p *C.dsi_context
	if err := onThread(func() C.dsi_status { return C.dsi_context_create(o, &p) }); err != nil {
		c.release()
		return nil, err
	}
	c.ptr = p
	runtime.SetFinalizer(c, func(c *Context) { _ = c.Close() })
	return c, nil
}

func (c *Context) release() {
	if c.log != 0 {
		c.log.Delete()
		c.log = 0
	}
	if c.stats != nil {
		c.finalLive = int64(C.dsigo_alloc_live(c.stats))
		c.finalAll = int64(C.dsigo_alloc_total(c.stats))
		C.free(unsafe.Pointer(c.stats))
		c.stats = nil
	}
}

// Close frees the context; every model must be closed first (ErrBusy otherwise).
func (c *Context) Close() error {
	defer pin()() // dsi_last_error is read on this OS thread
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ptr == nil {
		return nil
	}
	p := c.ptr
	if err := check(C.dsi_context_free(p)); err != nil {
		return err
	}
	c.ptr = nil
	c.release()
	runtime.SetFinalizer(c, nil)
	return nil
}

func (c *Context) handle() (*C.dsi_context, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ptr == nil {
		return nil, closedErr("Context")
	}
	return c.ptr, nil
}

// LiveAllocations reports the library's live and total host allocations (ok is false
// without TrackAllocations). After Close it reports the final counts.
func (c *Context) LiveAllocations() (live, total int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stats != nil {
		return int64(C.dsigo_alloc_live(c.stats)), int64(C.dsigo_alloc_total(c.stats)), true
	}
	return c.finalLive, c.finalAll, c.finalAll > 0
}

// Backend names the backend the context runs on.
func (c *Context) Backend() string {
	p, err := c.handle()
	if err != nil {
		return ""
	}
	return C.GoString(C.dsi_context_backend(p))
}

// Threads is the effective CPU thread count.
func (c *Context) Threads() int {
	p, err := c.handle()
	if err != nil {
		return 0
	}
	return int(C.dsi_context_n_threads(p))
}

// DeviceInfo describes one device of a context.
type DeviceInfo struct {
	Index                              int
	Backend, Name                      string
	Type                               int
	MemoryTotal, MemoryFree, MaxBuffer uint64
	Features, SubgroupSize             uint32
}

// Devices lists the devices visible to the context.
func (c *Context) Devices() ([]DeviceInfo, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	p, err := c.handle()
	if err != nil {
		return nil, err
	}
	var n C.int32_t
	if err := check(C.dsi_context_device_count(p, &n)); err != nil {
		return nil, err
	}
	var out []DeviceInfo
	for i := 0; i < int(n); i++ {
		var d C.dsi_device_info
		C.dsigo_device_info_init(&d)
		if err := check(C.dsi_context_device_info(p, C.int32_t(i), &d)); err != nil {
			return nil, err
		}
		out = append(out, DeviceInfo{
			Index: int(d.index), Backend: C.GoString(&d.backend[0]), Name: C.GoString(&d.name[0]),
			Type: int(d._type), MemoryTotal: uint64(d.memory_total), MemoryFree: uint64(d.memory_free),
			MaxBuffer: uint64(d.max_buffer_size), Features: uint32(d.features), SubgroupSize: uint32(d.subgroup_size),
		})
	}
	return out, nil
}

// ModelOptions of LoadModel; nil = memory-mapped, no progress callback.
type ModelOptions struct {
	Pread      bool // read into library memory instead of mapping the file
	VerifyFile bool // DSI_MODEL_FLAG_VERIFY_FILE (docs/api.md, "Model files")
	Resident   bool // DSI_MODEL_FLAG_RESIDENT
	// Coalesce (experimental, DSI_MODEL_FLAG_COALESCE, since 0.2): generations running at
	// once on sessions of this model, from different goroutines, share batched steps.
	Coalesce bool
	// Progress(stage, done, total) runs on the loading goroutine; false aborts the load.
	Progress func(stage int, done, total uint64) bool
}

// LoadModel loads a GGUF model.
func (c *Context) LoadModel(path string, opts *ModelOptions) (*Model, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	p, err := c.handle()
	if err != nil {
		return nil, err
	}
	var m cmem
	defer m.free()
	o := (*C.dsi_model_options)(m.alloc(C.sizeof_dsi_model_options))
	C.dsigo_model_options_init(o)
	if opts != nil && opts.Pread {
		o.access = C.DSI_ACCESS_PREAD
	}
	if opts != nil && opts.VerifyFile {
		o.flags |= C.DSI_MODEL_FLAG_VERIFY_FILE
	}
	if opts != nil && opts.Resident {
		o.flags |= C.DSI_MODEL_FLAG_RESIDENT
	}
	if opts != nil && opts.Coalesce {
		o.flags |= C.DSI_MODEL_FLAG_COALESCE
	}
	if opts != nil && opts.Progress != nil {
		h := cgo.NewHandle(opts.Progress)
		defer h.Delete()
		C.dsigo_set_progress(o, C.uintptr_t(h))
	}
	var mp *C.dsi_model
	if err := onThread(func() C.dsi_status { return C.dsi_model_load(p, m.str(path), o, &mp) }); err != nil {
		return nil, err
	}
	model := &Model{ptr: mp, ctx: c}
	runtime.SetFinalizer(model, func(m *Model) { _ = m.Close() })
	return model, nil
}

// ---- model ------------------------------------------------------------------------------

// Model is immutable weights plus tokenizer (dsi_model); safe for concurrent use.
type Model struct {
	mu       sync.RWMutex
	ptr      *C.dsi_model
	ctx      *Context
	children int // open detokenizers (the library does not count them)
}

// Close frees the model; its sessions and detokenizers must be closed first (ErrBusy).
func (m *Model) Close() error {
	defer pin()() // dsi_last_error is read on this OS thread
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr == nil {
		return nil
	}
	if m.children > 0 {
		return &Error{Status: StatusBusy, Message: fmt.Sprintf("Model.Close: %d detokenizer(s) of this model still open", m.children)}
	}
	p := m.ptr
	if err := check(C.dsi_model_free(p)); err != nil {
		return err
	}
	m.ptr = nil
	runtime.SetFinalizer(m, nil)
	return nil
}

// use runs f with the model pointer under a read lock (Close waits for it).
func (m *Model) use(f func(p *C.dsi_model) error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.ptr == nil {
		return closedErr("Model")
	}
	return f(m.ptr)
}

// ModelInfo is what Info reports.
type ModelInfo struct {
	Arch                                 int
	ArchName, Name                       string
	Layers, Embd, Vocab, Heads, CtxTrain int
	Experts, ExpertsUsed, DraftLayers    int
	HasMTP, HasDSpark, HasEngram         bool
	Params, WeightBytes                  uint64
	Fingerprint                          [32]byte
}

// Info describes the model.
func (m *Model) Info() (ModelInfo, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	var info ModelInfo
	err := m.use(func(p *C.dsi_model) error {
		var i C.dsi_model_info
		C.dsigo_model_info_init(&i)
		if err := check(C.dsi_model_get_info(p, &i)); err != nil {
			return err
		}
		info = ModelInfo{
			Arch: int(i.arch), ArchName: C.GoString(&i.arch_name[0]), Name: C.GoString(&i.name[0]),
			Layers: int(i.n_layers), Embd: int(i.n_embd), Vocab: int(i.n_vocab), Heads: int(i.n_heads),
			CtxTrain: int(i.n_ctx_train), Experts: int(i.n_experts), ExpertsUsed: int(i.n_experts_used),
			DraftLayers: int(i.n_draft_layers), HasMTP: i.has_mtp != 0, HasDSpark: i.has_dspark != 0,
			HasEngram: i.has_engram != 0, Params: uint64(i.n_params), WeightBytes: uint64(i.weight_bytes),
		}
		for k := range info.Fingerprint {
			info.Fingerprint[k] = byte(i.fingerprint[k])
		}
		return nil
	})
	return info, err
}

// Vocab is the vocabulary size (0 if the model is closed).
func (m *Model) Vocab() int {
	i, _ := m.Info()
	return i.Vocab
}

// Tokenize returns the token ids of text. parseSpecial matches special-token text:
// never use it on text from users (docs/bindings.md).
func (m *Model) Tokenize(text string, addBOS, parseSpecial bool) ([]Token, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	var out []Token
	err := m.use(func(p *C.dsi_model) error {
		var cm cmem
		defer cm.free()
		flags := C.uint32_t(0)
		if addBOS {
			flags |= C.DSI_TOKENIZE_ADD_BOS
		}
		if parseSpecial {
			flags |= C.DSI_TOKENIZE_PARSE_SPECIAL
		}
		t := (*C.char)(cm.alloc(len(text)))
		copy(unsafe.Slice((*byte)(unsafe.Pointer(t)), len(text)), text)
		var need C.size_t
		st := C.dsi_tokenize(p, t, C.size_t(len(text)), flags, nil, 0, &need)
		if st != C.DSI_OK && need == 0 {
			return check(st)
		}
		buf := (*C.dsi_token)(cm.alloc(int(need) * 4))
		if err := check(C.dsi_tokenize(p, t, C.size_t(len(text)), flags, buf, need, &need)); err != nil {
			return err
		}
		out = append([]Token(nil), unsafe.Slice((*Token)(unsafe.Pointer(buf)), int(need))...)
		return nil
	})
	return out, err
}

// twoCall runs a two-call-pattern function and returns its bytes.
func twoCall(f func(buf *C.char, c C.size_t, need *C.size_t) C.dsi_status) ([]byte, error) {
	var need C.size_t
	st := f(nil, 0, &need)
	if st != C.DSI_OK && need == 0 {
		return nil, check(st)
	}
	buf := (*C.char)(C.malloc(need + 1))
	defer C.free(unsafe.Pointer(buf))
	if err := check(f(buf, need+1, &need)); err != nil {
		return nil, err
	}
	return C.GoBytes(unsafe.Pointer(buf), C.int(need)), nil
}

// TokenBytes returns the raw bytes of one token (may be part of a UTF-8 character).
func (m *Model) TokenBytes(t Token) ([]byte, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	var out []byte
	err := m.use(func(p *C.dsi_model) (err error) {
		out, err = twoCall(func(b *C.char, c C.size_t, n *C.size_t) C.dsi_status {
			return C.dsi_token_to_bytes(p, C.dsi_token(t), b, c, n)
		})
		return
	})
	return out, err
}

// Detokenize returns the concatenated bytes of tokens.
func (m *Model) Detokenize(tokens []Token) ([]byte, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	var out []byte
	err := m.use(func(p *C.dsi_model) (err error) {
		var cm cmem
		defer cm.free()
		t := cm.tokens(tokens)
		out, err = twoCall(func(b *C.char, c C.size_t, n *C.size_t) C.dsi_status {
			return C.dsi_detokenize(p, t, C.size_t(len(tokens)), b, c, n)
		})
		return
	})
	return out, err
}

// Special names a special token.
type Special int32

const (
	SpecialBOS        Special = Special(C.DSI_SPECIAL_BOS)
	SpecialEOS        Special = Special(C.DSI_SPECIAL_EOS)
	SpecialPad        Special = Special(C.DSI_SPECIAL_PAD)
	SpecialUser       Special = Special(C.DSI_SPECIAL_USER)
	SpecialAssistant  Special = Special(C.DSI_SPECIAL_ASSISTANT)
	SpecialThinkBegin Special = Special(C.DSI_SPECIAL_THINK_BEGIN)
	SpecialThinkEnd   Special = Special(C.DSI_SPECIAL_THINK_END)
)

// SpecialToken returns the id of a special token (ok false if the vocabulary lacks it).
func (m *Model) SpecialToken(which Special) (Token, bool) {
	var t C.dsi_token
	ok := false
	_ = m.use(func(p *C.dsi_model) error {
		ok = C.dsi_model_special_token(p, C.int32_t(which), &t) == C.DSI_OK
		return nil
	})
	return Token(t), ok
}

// Role of a chat message.
type Role int32

const (
	RoleSystem    Role = Role(C.DSI_ROLE_SYSTEM)
	RoleUser      Role = Role(C.DSI_ROLE_USER)
	RoleAssistant Role = Role(C.DSI_ROLE_ASSISTANT)
	RoleTool      Role = Role(C.DSI_ROLE_TOOL)
)

// ChatMessage is one message of a conversation.
type ChatMessage struct {
	Role      Role
	Content   string
	Reasoning string // an assistant's thinking text, "" for none
}

// Thinking mode of the chat format.
type Thinking int32

const (
	ThinkingOff Thinking = Thinking(C.DSI_THINKING_OFF)
	ThinkingOn  Thinking = Thinking(C.DSI_THINKING_ON)
	ThinkingMax Thinking = Thinking(C.DSI_THINKING_MAX)
)

// ChatOptions of RenderChat; nil = thinking off, generation prompt, BOS.
type ChatOptions struct {
	Thinking           Thinking
	NoGenerationPrompt bool
	NoBOS              bool
}

// chatArgs builds the C messages, their pointer array and the options in C memory.
func chatArgs(cm *cmem, messages []ChatMessage, opts *ChatOptions) (**C.dsi_chat_message, C.size_t, *C.dsi_chat_options) {
	n := len(messages)
	ptrs := (**C.dsi_chat_message)(cm.alloc(n * int(unsafe.Sizeof(uintptr(0)))))
	ps := unsafe.Slice(ptrs, n)
	for i, msg := range messages {
		cmsg := (*C.dsi_chat_message)(cm.alloc(C.sizeof_dsi_chat_message))
		C.dsigo_chat_message_init(cmsg)
		cmsg.role = C.int32_t(msg.Role)
		cmsg.content = cm.str(msg.Content)
		if msg.Reasoning != "" {
			cmsg.reasoning = cm.str(msg.Reasoning)
		}
		ps[i] = cmsg
	}
	o := (*C.dsi_chat_options)(cm.alloc(C.sizeof_dsi_chat_options))
	C.dsigo_chat_options_init(o)
	if opts != nil {
		o.thinking = C.int32_t(opts.Thinking)
		if opts.NoGenerationPrompt {
			o.add_generation_prompt = 0
		}
		if opts.NoBOS {
			o.add_bos = 0
		}
	}
	return ptrs, C.size_t(n), o
}

// RenderChat returns the DeepSeek V4 chat text of messages (special tokens as text): for
// display and logs. To run a conversation use ChatTokens.
func (m *Model) RenderChat(messages []ChatMessage, opts *ChatOptions) (string, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	var out string
	err := m.use(func(p *C.dsi_model) error {
		var cm cmem
		defer cm.free()
		ptrs, n, o := chatArgs(&cm, messages, opts)
		b, err := twoCall(func(b *C.char, c C.size_t, nd *C.size_t) C.dsi_status {
			return C.dsi_chat_render(p, ptrs, n, o, b, c, nd)
		})
		out = string(b)
		return err
	})
	return out, err
}

// ChatTokens returns the token ids of a conversation, ready as a generation prompt
// (dsi_chat_tokenize): the template's structure becomes special tokens and every
// message's content is tokenized as plain text, so special-token text inside a message
// stays text.
func (m *Model) ChatTokens(messages []ChatMessage, opts *ChatOptions) ([]Token, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	var out []Token
	err := m.use(func(p *C.dsi_model) error {
		var cm cmem
		defer cm.free()
		ptrs, n, o := chatArgs(&cm, messages, opts)
		var need C.size_t
		if st := C.dsi_chat_tokenize(p, ptrs, n, o, nil, 0, &need); st != C.DSI_OK && need == 0 {
			return check(st)
		}
		buf := (*C.dsi_token)(cm.alloc(int(need) * 4))
		if err := check(C.dsi_chat_tokenize(p, ptrs, n, o, buf, need, &need)); err != nil {
			return err
		}
		out = append([]Token(nil), unsafe.Slice((*Token)(unsafe.Pointer(buf)), int(need))...)
		return nil
	})
	return out, err
}

// Metadata returns all GGUF metadata as key → value-as-text.
func (m *Model) Metadata() (map[string]string, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	out := map[string]string{}
	err := m.use(func(p *C.dsi_model) error {
		var n C.int32_t
		if err := check(C.dsi_model_meta_count(p, &n)); err != nil {
			return err
		}
		for i := C.int32_t(0); i < n; i++ {
			k, err := twoCall(func(b *C.char, c C.size_t, nd *C.size_t) C.dsi_status {
				return C.dsi_model_meta_key(p, i, b, c, nd)
			})
			if err != nil {
				return err
			}
			v, err := twoCall(func(b *C.char, c C.size_t, nd *C.size_t) C.dsi_status {
				return C.dsi_model_meta_value(p, i, b, c, nd)
			})
			if err != nil {
				return err
			}
			out[string(k)] = string(v)
		}
		return nil
	})
	return out, err
}

// Meta returns one metadata value as text (ok false when the key is absent).
func (m *Model) Meta(key string) (value string, ok bool, err error) {
	defer pin()() // dsi_last_error is read on this OS thread
	err = m.use(func(p *C.dsi_model) error {
		ck := C.CString(key)
		defer C.free(unsafe.Pointer(ck))
		b, err := twoCall(func(b *C.char, c C.size_t, nd *C.size_t) C.dsi_status {
			return C.dsi_model_meta_find(p, ck, b, c, nd)
		})
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		value, ok = string(b), err == nil
		return err
	})
	return
}

// SessionOptions of NewSession; nil = defaults.
type SessionOptions struct {
	Ctx   uint32 // maximum timeline length; 0 = min(4096, trained context)
	Batch uint32 // prefill chunk; 0 = 256
	Flags uint32
}

// NewSession creates a session (timeline) on the model.
func (m *Model) NewSession(opts *SessionOptions) (*Session, error) {
	var s *Session
	err := m.use(func(p *C.dsi_model) error {
		var o C.dsi_session_options
		C.dsigo_session_options_init(&o)
		if opts != nil {
			o.n_ctx, o.n_batch, o.flags = C.uint32_t(opts.Ctx), C.uint32_t(opts.Batch), C.uint32_t(opts.Flags)
		}
		var sp *C.dsi_session
		if err := onThread(func() C.dsi_status { return C.dsi_session_create(p, &o, &sp) }); err != nil {
			return err
		}
		s = &Session{ptr: sp, model: m}
		return nil
	})
	if s != nil {
		runtime.SetFinalizer(s, func(s *Session) { _ = s.Close() })
	}
	return s, err
}

// ---- detokenizer --------------------------------------------------------------------------

// Detokenizer turns a stream of tokens into complete UTF-8 text.
type Detokenizer struct {
	mu    sync.Mutex
	ptr   *C.dsi_detokenizer
	model *Model
}

// NewDetokenizer creates an incremental decoder.
func (m *Model) NewDetokenizer() (*Detokenizer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr == nil {
		return nil, closedErr("Model")
	}
	var d *C.dsi_detokenizer
	if err := onThread(func() C.dsi_status { return C.dsi_detokenizer_create(m.ptr, &d) }); err != nil {
		return nil, err
	}
	m.children++
	det := &Detokenizer{ptr: d, model: m}
	runtime.SetFinalizer(det, func(d *Detokenizer) { _ = d.Close() })
	return det, nil
}

// Close frees the detokenizer.
func (d *Detokenizer) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return nil
	}
	C.dsi_detokenizer_free(d.ptr)
	d.ptr = nil
	d.model.mu.Lock()
	d.model.children--
	d.model.mu.Unlock()
	runtime.SetFinalizer(d, nil)
	return nil
}

func (d *Detokenizer) call(f func(b *C.char, c C.size_t, n *C.size_t) C.dsi_status) ([]byte, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return nil, closedErr("Detokenizer")
	}
	var buf [64]C.char
	var need C.size_t
	st := f(&buf[0], 64, &need)
	if st != C.DSI_OK && need > 64 {
		big := (*C.char)(C.malloc(need))
		defer C.free(unsafe.Pointer(big))
		if err := check(f(big, need, &need)); err != nil {
			return nil, err
		}
		return C.GoBytes(unsafe.Pointer(big), C.int(need)), nil
	}
	if err := check(st); err != nil {
		return nil, err
	}
	return C.GoBytes(unsafe.Pointer(&buf[0]), C.int(need)), nil
}

// Feed returns the text (complete UTF-8 characters) that token finished.
func (d *Detokenizer) Feed(t Token) ([]byte, error) {
	return d.call(func(b *C.char, c C.size_t, n *C.size_t) C.dsi_status {
		return C.dsi_detokenizer_feed(d.ptr, C.dsi_token(t), b, c, n)
	})
}

// Flush returns whatever is held back (an unfinished character becomes U+FFFD).
func (d *Detokenizer) Flush() ([]byte, error) {
	return d.call(func(b *C.char, c C.size_t, n *C.size_t) C.dsi_status {
		return C.dsi_detokenizer_flush(d.ptr, b, c, n)
	})
}

// ---- sampler --------------------------------------------------------------------------------

// SamplerOptions of NewSampler; DefaultSamplerOptions gives the library's defaults.
type SamplerOptions struct {
	Temperature                       float32 // 0 = greedy
	TopK                              int32
	TopP, MinP                        float32
	RepetitionPenalty                 float32
	FrequencyPenalty, PresencePenalty float32
	PenaltyLastN                      int32
	Seed                              uint64
	LogitBias                         map[Token]float32
}

// DefaultSamplerOptions returns the library's defaults.
func DefaultSamplerOptions() *SamplerOptions {
	var o C.dsi_sampler_options
	C.dsigo_sampler_options_init(&o)
	return &SamplerOptions{
		Temperature: float32(o.temperature), TopK: int32(o.top_k), TopP: float32(o.top_p), MinP: float32(o.min_p),
		RepetitionPenalty: float32(o.repetition_penalty), FrequencyPenalty: float32(o.frequency_penalty),
		PresencePenalty: float32(o.presence_penalty), PenaltyLastN: int32(o.penalty_last_n), Seed: uint64(o.seed),
	}
}

// Greedy returns options for greedy sampling.
func Greedy() *SamplerOptions {
	o := DefaultSamplerOptions()
	o.Temperature = 0
	return o
}

// Sampler holds sampling settings and the RNG; calls are serialized.
type Sampler struct {
	mu  sync.Mutex
	ptr *C.dsi_sampler
	ctx *Context // NewSampler on a context: it must outlive the sampler
}

// NewSampler creates a sampler (nil options = the library's defaults) that allocates with
// the C library's malloc.
func NewSampler(opts *SamplerOptions) (*Sampler, error) { return newSampler(nil, opts) }

// NewSampler creates a sampler whose allocations go through this context's allocator
// hooks (dsi_sampler_create_with_context); close it before the context.
func (c *Context) NewSampler(opts *SamplerOptions) (*Sampler, error) {
	if _, err := c.handle(); err != nil {
		return nil, err
	}
	return newSampler(c, opts)
}

func newSampler(ctx *Context, opts *SamplerOptions) (*Sampler, error) {
	if opts == nil {
		opts = DefaultSamplerOptions()
	}
	var m cmem
	defer m.free()
	o := (*C.dsi_sampler_options)(m.alloc(C.sizeof_dsi_sampler_options))
	C.dsigo_sampler_options_init(o)
	o.temperature, o.top_k, o.top_p, o.min_p = C.float(opts.Temperature), C.int32_t(opts.TopK), C.float(opts.TopP), C.float(opts.MinP)
	o.repetition_penalty = C.float(opts.RepetitionPenalty)
	o.frequency_penalty, o.presence_penalty = C.float(opts.FrequencyPenalty), C.float(opts.PresencePenalty)
	o.penalty_last_n, o.seed = C.int32_t(opts.PenaltyLastN), C.uint64_t(opts.Seed)
	if len(opts.LogitBias) > 0 {
		b := (*C.dsi_logit_bias)(m.alloc(len(opts.LogitBias) * C.sizeof_dsi_logit_bias))
		bs := unsafe.Slice(b, len(opts.LogitBias))
		i := 0
		for t, v := range opts.LogitBias {
			bs[i].token, bs[i].bias = C.dsi_token(t), C.float(v)
			i++
		}
		o.logit_bias, o.n_logit_bias = b, C.size_t(len(opts.LogitBias))
	}
	var p *C.dsi_sampler
	err := onThread(func() C.dsi_status {
		if ctx != nil {
			return C.dsi_sampler_create_with_context(ctx.ptr, o, &p)
		}
		return C.dsi_sampler_create(o, &p)
	})
	if err != nil {
		return nil, err
	}
	s := &Sampler{ptr: p, ctx: ctx}
	runtime.SetFinalizer(s, func(s *Sampler) { _ = s.Close() })
	return s, nil
}

// Close frees the sampler.
func (s *Sampler) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr != nil {
		C.dsi_sampler_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

func (s *Sampler) fail(st C.dsi_status) error { return check(st) }

// Sample draws a token from logits (n_vocab values) and records it in the history.
func (s *Sampler) Sample(logits []float32) (Token, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return 0, closedErr("Sampler")
	}
	if len(logits) == 0 {
		return 0, &Error{Status: StatusInvalidArgument, Message: "no logits"}
	}
	var t C.dsi_token
	// a Go []float32 holds no Go pointers: it may be passed for the duration of the call
	err := s.fail(C.dsi_sampler_sample(s.ptr, (*C.float)(unsafe.Pointer(&logits[0])), C.int32_t(len(logits)), &t))
	return Token(t), err
}

// Accept adds a token to the penalty history without sampling.
func (s *Sampler) Accept(t Token) error {
	defer pin()() // dsi_last_error is read on this OS thread
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return closedErr("Sampler")
	}
	return s.fail(C.dsi_sampler_accept(s.ptr, C.dsi_token(t)))
}

// Reset clears the history and re-seeds the RNG.
func (s *Sampler) Reset() error {
	defer pin()() // dsi_last_error is read on this OS thread
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return closedErr("Sampler")
	}
	return s.fail(C.dsi_sampler_reset(s.ptr))
}

// Probs returns a copy of the distribution the last Sample drew from.
func (s *Sampler) Probs() ([]float32, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return nil, closedErr("Sampler")
	}
	var p *C.float
	var n C.int32_t
	if err := s.fail(C.dsi_sampler_probs(s.ptr, &p, &n)); err != nil {
		return nil, err
	}
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p)), int(n))...), nil
}
