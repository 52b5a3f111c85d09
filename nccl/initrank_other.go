//go:build !amd64 && !arm64

package nccl

import (
	"fmt"
	"runtime"
)

// initRankSupported is false where the by-value passing of the 128-byte ncclUniqueId is not
// known (it is in initrank_amd64.go and initrank_arm64.go): InitRank fails before any call.
const initRankSupported = false

// errInitRankArch is the error for InitRank on such an architecture.
var errInitRankArch = fmt.Errorf("ncclCommInitRank on %s (passing the 128-byte ncclUniqueId by value is implemented for amd64 and arm64): %w",
	runtime.GOARCH, ErrNotSupported)

func (l *library) initRank(comm *uintptr, nranks, rank int, id *UniqueID, cfg *config) Result {
	return ErrInvalidUsage // never called: InitRank checks initRankSupported first
}
