package nccl

import (
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Calls into libnccl go through purego.SyscallN, never purego.RegisterFunc, which converts
// arguments by reflection and allocates on every call. There are two paths, as in package
// driver:
//
// The general path (raw) follows unsafe.Pointer rule 4: the uintptr(unsafe.Pointer(&x))
// conversion is written inside the argument list of a //go:uintptrescapes function, so the
// compiler moves x to the heap and keeps it alive until the call returns. It costs an
// allocation per call.
//
// The hot path (hot, for ncclAllReduce) allocates nothing: its variadic slice stays on the
// caller's stack, and the arguments reach SyscallN in a pooled frame. Its arguments are plain
// values (device pointers, counts, handles), never pointers to Go memory.

// raw calls the C function fn and returns its ncclResult_t.
//
//go:uintptrescapes
func raw(fn uintptr, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(fn, args...)
	// ncclResult_t is a 32-bit enum returned in EAX (W0 on arm64); the upper half of the
	// register is unspecified, so only the low 32 bits are the result.
	return Result(int32(uint32(r)))
}

// frame carries the arguments of one hot call to purego.SyscallN (7 for ncclAllReduce).
type frame [8]uintptr

var frames = sync.Pool{New: func() any { return new(frame) }}

// hot calls fn like raw without allocating; see the top of this file for what it may be given.
func hot(fn uintptr, args ...uintptr) Result {
	f := frames.Get().(*frame)
	n := copy(f[:], args)
	r, _, _ := purego.SyscallN(fn, f[:n]...)
	frames.Put(f)
	return Result(int32(uint32(r)))
}

// newError describes the failure r of the call op with ncclGetErrorString and
// ncclGetLastError(comm). Call it on the OS thread that made the failing call, right after
// it: NCCL keeps the last error per process, or per thread in some versions.
func (l *library) newError(op string, r Result, comm uintptr) *Error {
	e := &Error{Op: op, Code: r}
	var errString, lastError string
	if l.getErrorString != 0 {
		p, _, _ := purego.SyscallN(l.getErrorString, uintptr(r))
		errString = cString(p)
	}
	if l.getLastError != 0 {
		p, _, _ := purego.SyscallN(l.getLastError, comm)
		lastError = cString(p)
	}
	e.Message = message(errString, lastError)
	return e
}

// call runs fn on a locked OS thread and turns a failing result into an *Error that carries
// NCCL's last error, read on the same thread.
//
//go:uintptrescapes
func (l *library) call(op string, fn, comm uintptr, args ...uintptr) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := raw(fn, args...); r != 0 {
		return l.newError(op, r, comm)
	}
	return nil
}

// maxCString bounds how far cString reads: NCCL's strings are short (its last error is a
// 1024-byte buffer), and a missing NUL must not walk through memory.
const maxCString = 4096

// cString copies the NUL-terminated C string at address p (memory owned by libnccl).
func cString(p uintptr) string {
	if p == 0 {
		return ""
	}
	// Reinterpreting the variable, not converting the integer, keeps vet's unsafeptr check
	// quiet: the memory is libnccl's, which the Go collector neither moves nor frees.
	b := *(**byte)(unsafe.Pointer(&p))
	n := 0
	for n < maxCString && *(*byte)(unsafe.Add(unsafe.Pointer(b), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(b, n))
}
