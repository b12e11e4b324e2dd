package dsinfer

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// Session is one timeline (dsi_session): KV cache and logits. Its calls are serialized;
// Cancel may be called from any goroutine at any time and never waits.
type Session struct {
	mu    sync.Mutex   // one call at a time (the C API's [per-handle] rule)
	ptrMu sync.RWMutex // guards ptr against Close while Cancel reads it
	ptr   *C.dsi_session
	model *Model
}

// Close frees the session (waits for a running call).
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ptrMu.Lock()
	defer s.ptrMu.Unlock()
	if s.ptr != nil {
		C.dsi_session_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

// Model returns the session's model.
func (s *Session) Model() *Model { return s.model }

// lock takes the call lock and returns the pointer (error if closed).
func (s *Session) lock() (*C.dsi_session, error) {
	s.mu.Lock()
	if s.ptr == nil {
		s.mu.Unlock()
		return nil, closedErr("Session")
	}
	return s.ptr, nil
}

// Cancel asks the running call of this session to stop at the next token or prefill
// chunk (it then returns ErrCancelled). Safe from any goroutine. Made while nothing runs,
// the request is sticky: the next call is cancelled before it changes the session
// (dsi_session_cancel); CancelClear drops it.
func (s *Session) Cancel() {
	s.ptrMu.RLock()
	defer s.ptrMu.RUnlock()
	if s.ptr != nil {
		C.dsi_session_cancel(s.ptr)
	}
}

// CancelClear drops a pending cancel request (one that arrived after the call it was
// meant for had finished); safe from any goroutine.
func (s *Session) CancelClear() {
	s.ptrMu.RLock()
	defer s.ptrMu.RUnlock()
	if s.ptr != nil {
		C.dsi_session_cancel_clear(s.ptr)
	}
}

// Sync makes the timeline equal tokens (longest common prefix kept) and returns how many
// tokens were reused.
func (s *Session) Sync(tokens []Token) (int, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	p, err := s.lock()
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	var m cmem
	defer m.free()
	var reused C.size_t
	err = check(C.dsi_session_sync(p, m.tokens(tokens), C.size_t(len(tokens)), &reused))
	return int(reused), err
}

// Append evaluates more tokens at the end of the timeline.
func (s *Session) Append(tokens []Token) error {
	defer pin()() // dsi_last_error is read on this OS thread
	p, err := s.lock()
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	var m cmem
	defer m.free()
	return check(C.dsi_session_append(p, m.tokens(tokens), C.size_t(len(tokens))))
}

// Logits returns a copy of the logits of the last evaluated token.
func (s *Session) Logits() ([]float32, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	p, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var l *C.float
	var n C.int32_t
	if err := check(C.dsi_session_logits(p, &l, &n)); err != nil {
		return nil, err
	}
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(l)), int(n))...), nil
}

// Position is the number of tokens in the timeline.
func (s *Session) Position() (int, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	p, err := s.lock()
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	var pos C.uint32_t
	err = check(C.dsi_session_position(p, &pos))
	return int(pos), err
}

// Tokens returns the timeline's tokens.
func (s *Session) Tokens() ([]Token, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	p, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var need C.size_t
	if st := C.dsi_session_tokens(p, nil, 0, &need); st != C.DSI_OK && need == 0 {
		return nil, check(st)
	}
	var m cmem
	defer m.free()
	buf := (*C.dsi_token)(m.alloc(int(need) * 4))
	if err := check(C.dsi_session_tokens(p, buf, need, &need)); err != nil {
		return nil, err
	}
	return append([]Token(nil), unsafe.Slice((*Token)(unsafe.Pointer(buf)), int(need))...), nil
}

// Reset empties the timeline.
func (s *Session) Reset() error {
	defer pin()() // dsi_last_error is read on this OS thread
	p, err := s.lock()
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	return check(C.dsi_session_reset(p))
}

// FinishReason says why a generation ended.
type FinishReason int32

const (
	FinishNone        FinishReason = FinishReason(C.DSI_FINISH_NONE)
	FinishLength      FinishReason = FinishReason(C.DSI_FINISH_LENGTH)
	FinishEOS         FinishReason = FinishReason(C.DSI_FINISH_EOS)
	FinishStopToken   FinishReason = FinishReason(C.DSI_FINISH_STOP_TOKEN)
	FinishStopString  FinishReason = FinishReason(C.DSI_FINISH_STOP_STRING)
	FinishCallback    FinishReason = FinishReason(C.DSI_FINISH_CALLBACK)
	FinishCancelled   FinishReason = FinishReason(C.DSI_FINISH_CANCELLED)
	FinishContextFull FinishReason = FinishReason(C.DSI_FINISH_CONTEXT_FULL)
)

// GenerateOptions of Generate and Stream.
type GenerateOptions struct {
	Prompt     []Token  // synced first; nil: continue (the session must hold logits)
	MaxTokens  int      // 0 = 256 (the library's default); use NoTokens for none
	Stop       []string // strings that end generation (never delivered)
	StopTokens []Token  // ids that end generation besides EOS
	NoTokens   bool     // MaxTokens 0 for real: only sync the prompt
}

// GenerationResult is what a generation produced.
type GenerationResult struct {
	Text         string
	Tokens       []Token // delivered ids (EOS / stop tokens are not delivered)
	FinishReason FinishReason
	Prompt       int
	Reused       int
	Generated    int
	PrefillMS    float64
	DecodeMS     float64
}

// Piece is one streamed token: Token is -1 for text flushed at the end.
type Piece struct {
	Token Token
	Text  string
}

type genState struct {
	ctx     context.Context
	onToken func(Token, string) bool
	res     *GenerationResult
	stopped bool // the callback saw ctx done and stopped the call
	panicV  any
}

// Generate runs one dsi_session_generate call on this goroutine. onToken (may be nil)
// receives each delivered token with its text; returning false stops (FinishCallback).
// When ctx ends, the generation is cancelled: the result holds what was delivered and
// the error satisfies errors.Is(err, ErrCancelled) and errors.Is(err, ctx.Err()).
func (s *Session) Generate(ctx context.Context, smp *Sampler, opts *GenerateOptions, onToken func(Token, string) bool) (*GenerationResult, error) {
	defer pin()() // dsi_last_error is read on this OS thread
	if ctx == nil {
		ctx = context.Background()
	}
	if opts == nil {
		opts = &GenerateOptions{}
	}
	res := &GenerationResult{}
	if err := ctx.Err(); err != nil {
		res.FinishReason = FinishCancelled
		return res, &Error{Status: StatusCancelled, Message: "generation cancelled before it started", Cause: err}
	}
	p, err := s.lock()
	if err != nil {
		return res, err
	}
	defer s.mu.Unlock()
	smp.mu.Lock()
	defer smp.mu.Unlock()
	if smp.ptr == nil {
		return res, closedErr("Sampler")
	}
	var m cmem
	defer m.free()
	o := (*C.dsi_generate_options)(m.alloc(C.sizeof_dsi_generate_options))
	C.dsigo_generate_options_init(o)
	if opts.MaxTokens > 0 || opts.NoTokens {
		o.max_tokens = C.int32_t(opts.MaxTokens)
	}
	if opts.Prompt != nil {
		o.prompt, o.n_prompt = m.tokens(opts.Prompt), C.size_t(len(opts.Prompt))
	}
	if len(opts.StopTokens) > 0 {
		o.stop_tokens, o.n_stop_tokens = m.tokens(opts.StopTokens), C.size_t(len(opts.StopTokens))
	}
	if len(opts.Stop) > 0 {
		arr := (**C.char)(m.alloc(len(opts.Stop) * int(unsafe.Sizeof(uintptr(0)))))
		as := unsafe.Slice(arr, len(opts.Stop))
		for i, str := range opts.Stop {
			as[i] = m.str(str)
		}
		o.stop_strings, o.n_stop_strings = arr, C.size_t(len(opts.Stop))
	}
	st := &genState{ctx: ctx, onToken: onToken, res: res}
	h := cgo.NewHandle(st)
	defer h.Delete()
	C.dsigo_set_on_token(o, C.uintptr_t(h))

	// A context that ends during the call cancels the session. The watcher cancels only
	// while the call runs (running, under runMu), and Generate waits for it before
	// returning, so a late cancel never reaches a later call or a closed session.
	var runMu sync.Mutex
	running, didCancel := true, false
	done := make(chan struct{})
	var watcher sync.WaitGroup
	if ctx.Done() != nil {
		watcher.Add(1)
		go func() {
			defer watcher.Done()
			select {
			case <-ctx.Done():
				runMu.Lock()
				if running {
					C.dsi_session_cancel(p) // [any-thread]
					didCancel = true
				}
				runMu.Unlock()
			case <-done:
			}
		}()
	}
	var r C.dsi_generate_result
	C.dsigo_generate_result_init(&r)
	status := C.dsi_session_generate(p, smp.ptr, o, &r)
	runMu.Lock()
	running = false
	if didCancel && status != C.DSI_ERR_CANCELLED {
		// the call ended on its own just as ctx ended: drop the request, which would
		// otherwise stay pending (sticky) and cancel the session's next call
		C.dsi_session_cancel_clear(p)
	}
	runMu.Unlock()
	close(done)
	watcher.Wait()
	if st.panicV != nil {
		panic(st.panicV)
	}
	res.FinishReason = FinishReason(r.finish_reason)
	res.Prompt, res.Reused, res.Generated = int(r.n_prompt), int(r.n_reused), int(r.n_generated)
	res.PrefillMS, res.DecodeMS = float64(r.prefill_ms), float64(r.decode_ms)
	if cerr := ctx.Err(); cerr != nil && (status == C.DSI_ERR_CANCELLED || st.stopped) {
		res.FinishReason = FinishCancelled
		return res, &Error{Status: StatusCancelled, Message: fmt.Sprintf("generation cancelled after %d tokens: %v", len(res.Tokens), cerr), Cause: cerr}
	}
	return res, check(status)
}

// onTokenGo is called (through the C trampoline) for every delivered token.
func onTokenGo(st *genState, tok Token, text string) (cont bool) {
	st.res.Text += text
	if tok >= 0 {
		st.res.Tokens = append(st.res.Tokens, tok)
	}
	if st.ctx.Err() != nil {
		st.stopped = true
		return false
	}
	if st.onToken == nil || st.panicV != nil {
		return st.panicV == nil
	}
	defer func() {
		if v := recover(); v != nil { // re-raised after the C call returns
			st.panicV = v
			cont = false
		}
	}()
	if !st.onToken(tok, text) {
		return false
	}
	if st.ctx.Err() != nil { // ended while the callback ran: no further token
		st.stopped = true
		return false
	}
	return true
}

// Stream is a generation running on its own goroutine; read C until it is closed, then
// Wait for the result. Cancel the context given to Session.Stream to stop early (a
// reader that stops reading must cancel it).
type Stream struct {
	C    <-chan Piece
	done chan struct{}
	res  *GenerationResult
	err  error
}

// Stream starts Generate on a new goroutine and delivers its pieces on a channel.
func (s *Session) Stream(ctx context.Context, smp *Sampler, opts *GenerateOptions) *Stream {
	if ctx == nil {
		ctx = context.Background()
	}
	ch := make(chan Piece)
	st := &Stream{C: ch, done: make(chan struct{})}
	go func() {
		defer close(st.done)
		defer close(ch)
		st.res, st.err = s.Generate(ctx, smp, opts, func(t Token, text string) bool {
			select {
			case ch <- Piece{Token: t, Text: text}:
				return true
			case <-ctx.Done():
				return false
			}
		})
	}()
	return st
}

// Wait blocks until the generation ended and returns its result and error.
func (st *Stream) Wait() (*GenerationResult, error) {
	<-st.done
	return st.res, st.err
}
