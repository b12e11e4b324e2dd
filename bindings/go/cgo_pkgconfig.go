//go:build !dsinfer_env

package dsinfer

// The library is found through pkg-config (PKG_CONFIG_PATH for a private prefix). Build
// with -tags dsinfer_env to use CGO_CFLAGS / CGO_LDFLAGS instead (docs/bindings.md).

// #cgo pkg-config: dsinfer
import "C"
