package dsinfer

// Exported Go functions the C trampolines of shim.c call. A file with //export may only
// declare in its preamble.

/*
#include <stdint.h>
#include <stddef.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

//export goLogCallback
func goLogCallback(level C.int32_t, msg *C.char, h C.uintptr_t) {
	f := cgo.Handle(h).Value().(func(LogLevel, string))
	defer func() { _ = recover() }() // a log sink must not unwind into C
	f(LogLevel(level), C.GoString(msg))
}

//export goProgressCallback
func goProgressCallback(stage C.int32_t, done, total C.uint64_t, h C.uintptr_t) C.int32_t {
	f := cgo.Handle(h).Value().(func(int, uint64, uint64) bool)
	ok := false
	func() {
		defer func() { _ = recover() }()
		ok = f(int(stage), uint64(done), uint64(total))
	}()
	if ok {
		return 1
	}
	return 0
}

//export goTokenCallback
func goTokenCallback(tok C.int32_t, text *C.char, n C.size_t, h C.uintptr_t) C.int32_t {
	st := cgo.Handle(h).Value().(*genState)
	s := ""
	if n > 0 {
		s = string(unsafe.Slice((*byte)(unsafe.Pointer(text)), int(n)))
	}
	if onTokenGo(st, Token(tok), s) {
		return 1
	}
	return 0
}
