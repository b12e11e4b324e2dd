//go:build dsinfer_env

package dsinfer

// -tags dsinfer_env: the header and library come from CGO_CFLAGS (-I<include dir>) and
// CGO_LDFLAGS (-L<library dir>, optionally -Wl,-rpath,<library dir>).

// #cgo LDFLAGS: -ldsinfer
import "C"
