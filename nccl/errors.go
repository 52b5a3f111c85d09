package nccl

import (
	"errors"
	"fmt"
	"strconv"
)

// Result is an ncclResult_t, the status code every NCCL call returns. Its String and Error
// give the ncclResult_t name. The non-zero codes are the Err* constants, which are also the
// sentinels that errors.Is matches an *Error against; ncclSuccess (0) never becomes an error.
type Result int32

// The codes of ncclResult_t (nccl.h), each usable as a sentinel with errors.Is.
const (
	// ErrUnhandledCudaError: a CUDA call inside NCCL failed (ncclUnhandledCudaError), often a
	// CUDA context already lost to an earlier fault.
	ErrUnhandledCudaError Result = 1
	// ErrSystemError: a system call failed (ncclSystemError): sockets, shared memory, /dev/shm
	// too small in a container, file descriptor limits.
	ErrSystemError Result = 2
	// ErrInternalError: an NCCL internal check failed (ncclInternalError).
	ErrInternalError Result = 3
	// ErrInvalidArgument: an argument was rejected (ncclInvalidArgument): a NULL or foreign
	// pointer, an unknown data type or operation, a bad rank.
	ErrInvalidArgument Result = 4
	// ErrInvalidUsage: the call is not allowed now (ncclInvalidUsage): mismatched calls across
	// ranks, a communicator in the wrong state, a group not closed.
	ErrInvalidUsage Result = 5
	// ErrRemoteError: a peer failed or went away (ncclRemoteError), or the network did.
	ErrRemoteError Result = 6
	// ErrInProgress: a non-blocking communicator is still working (ncclInProgress): poll it
	// with Comm.WaitReady before using it.
	ErrInProgress Result = 7
)

var resultNames = [...]string{
	"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
	"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress",
}

// String returns the ncclResult_t name of r, or ncclResult_t(N) for a code this package does
// not know.
func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return "ncclResult_t(" + strconv.Itoa(int(r)) + ")"
}

// Error returns the ncclResult_t name of r.
func (r Result) Error() string { return r.String() }

// Sentinel errors for what happens outside an NCCL call. Compare with errors.Is.
var (
	// ErrNotFound: no libnccl could be loaded. The error names every path tried and why each
	// failed. goccl runs without NCCL; only what needs it is off.
	ErrNotFound = errors.New("NCCL library libnccl.so.2 not found")
	// ErrVersion: the loaded libnccl is older than this package supports (NCCL 2.18), or
	// lacks entry points that every supported version has. The error names both versions.
	ErrVersion = errors.New("unsupported NCCL version")
	// ErrNotSupported: the loaded libnccl lacks an optional feature (see Has), or this
	// architecture cannot pass ncclUniqueId by value.
	ErrNotSupported = errors.New("not supported")
	// ErrClosed: the communicator was destroyed or aborted.
	ErrClosed = errors.New("NCCL communicator is closed")
	// ErrTimeout: a wait for a non-blocking communicator outlived its deadline. The
	// communicator was aborted.
	ErrTimeout = errors.New("timed out")
)

// Error is a failed NCCL call.
type Error struct {
	Op      string // the C function, e.g. "ncclAllReduce"
	Code    Result // the ncclResult_t it returned (or, for ncclCommGetAsyncError, the state it reported)
	Message string // ncclGetErrorString, then ncclGetLastError when it says more
}

// Error formats e as "ncclAllReduce: ncclInvalidArgument (4): invalid argument (run with
// NCCL_DEBUG=WARN for details): <last error>".
func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s (%d)", e.Op, e.Code, int32(e.Code))
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Is reports whether target is e's code (one of the Err* Result constants).
func (e *Error) Is(target error) bool {
	r, ok := target.(Result)
	return ok && r == e.Code
}

// message combines NCCL's text for code and its last error: the first is generic ("invalid
// argument"), the second says which argument and why, when NCCL recorded it.
func message(errString, lastError string) string {
	switch {
	case lastError == "" || lastError == errString:
		return errString
	case errString == "":
		return lastError
	}
	return errString + ": " + lastError
}
