//go:build amd64 || arm64

package nccl

import "unsafe"

// initRankSupported: initrank_$GOARCH.go passes the 128-byte ncclUniqueId by value.
const initRankSupported = true

// errInitRankArch is unused where initRankSupported is true.
var errInitRankArch error

// config must have the C layout of ncclConfig_t on LP64 (size 48, netName at 32, splitShare
// at 40): a mismatch fails the build.
var (
	_ [48 - unsafe.Sizeof(config{})]byte
	_ [unsafe.Sizeof(config{}) - 48]byte
	_ [32 - unsafe.Offsetof(config{}.netName)]byte
	_ [unsafe.Offsetof(config{}.netName) - 32]byte
	_ [40 - unsafe.Offsetof(config{}.splitShare)]byte
	_ [unsafe.Offsetof(config{}.splitShare) - 40]byte
)
