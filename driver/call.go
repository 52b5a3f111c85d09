package driver

import (
	"errors"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Calls into libcuda go through purego.SyscallN, never purego.RegisterFunc, which converts
// arguments by reflection and allocates on every call. There are two paths:
//
// The general path (raw, call, Context.call) follows unsafe.Pointer rule 4: the
// uintptr(unsafe.Pointer(&x)) conversion is written inside the argument list of a
// //go:uintptrescapes function, so the compiler moves x to the heap (which does not move) and
// keeps it alive until the call returns. It costs an allocation per call: SyscallN's variadic
// slice escapes, so each call's argument list is a new heap object.
//
// The hot path (Context.hot) allocates nothing: its variadic slice stays on the caller's
// stack, and the arguments reach SyscallN in a pooled frame. Its arguments are plain values or
// pointers to memory that the caller keeps alive explicitly (runtime.KeepAlive), since nothing
// does it for them: an Args (heap, and held by the caller), or C memory (pinned buffers).

// errNotLoaded is what a call returns when its symbol was never bound, instead of the panic
// purego.SyscallN would raise on a nil function.
var errNotLoaded = errors.New("CUDA driver function not bound: call driver.Init first and check its error")

// raw calls the C function fn and returns its CUresult.
//
//go:uintptrescapes
func raw(fn uintptr, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(fn, args...)
	// CUresult is a 32-bit enum returned in EAX (W0 on arm64); the upper half of the register
	// is unspecified, so only the low 32 bits are the result.
	return Result(int32(uint32(r)))
}

// call calls fn on the calling OS thread and turns a failing CUresult into an *Error.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) error {
	if fn == 0 {
		return errNotLoaded
	}
	if r := raw(fn, args...); r != 0 {
		return newError(fn, r)
	}
	return nil
}

// newError describes the failure of fn with cuGetErrorName and cuGetErrorString, falling back
// on this package's names when those are not bound.
func newError(fn uintptr, r Result) *Error {
	e := &Error{Op: symbolName(fn), Code: r, Name: r.String()}
	var s *byte
	if cuGetErrorName != 0 && raw(cuGetErrorName, uintptr(r), uintptr(unsafe.Pointer(&s))) == 0 && s != nil {
		e.Name = cString(s)
	}
	s = nil
	if cuGetErrorString != 0 && raw(cuGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&s))) == 0 && s != nil {
		e.Message = cString(s)
	}
	return e
}

// maxCString bounds how far cString reads: the driver's strings are short, and a missing NUL
// must not walk through memory.
const maxCString = 4096

// cString copies the NUL-terminated C string at p (memory owned by the driver).
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for n < maxCString && *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// cBytes returns s as a NUL-terminated byte slice for a const char* argument.
func cBytes(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

// bufString returns the NUL-terminated string that the driver wrote into buf.
func bufString(buf []byte) string {
	for i, c := range buf {
		if c == 0 {
			return string(buf[:i])
		}
	}
	return string(buf)
}

// call calls fn with c current. CUDA's current context is per OS thread, so the goroutine is
// locked to its thread from cuCtxSetCurrent until fn returns; callers never lock threads.
//
//go:uintptrescapes
func (c *Context) call(fn uintptr, args ...uintptr) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.makeCurrent(); err != nil {
		return err
	}
	return call(fn, args...)
}

// frame carries the arguments of one hot call to purego.SyscallN: slot 0 the context for
// cuCtxSetCurrent, then the function's arguments (11 at most, for cuLaunchKernel).
type frame [12]uintptr

var frames = sync.Pool{New: func() any { return new(frame) }}

// hot is Context.call without allocation, for the hot methods (launches, async copies and
// memsets, events, graph launches). See the top of this file for what its callers keep alive.
func (c *Context) hot(fn uintptr, args ...uintptr) error {
	return c.hotCall(true, fn, args...)
}

// launch is hot for the launch functions, which skip binding the context once
// ProbeStreamLaunch has found that the driver takes it from the stream.
func (c *Context) launch(fn uintptr, args ...uintptr) error {
	return c.hotCall(!streamLaunch.Load(), fn, args...)
}

// hotCall is hotResult with the CUresult turned into an *Error.
func (c *Context) hotCall(bind bool, fn uintptr, args ...uintptr) error {
	r, failed, err := c.hotResult(bind, fn, args...)
	if err != nil || r == 0 {
		return err
	}
	return newError(failed, r)
}

// hotResult makes c current (unless bind is false) and calls fn like hot, but returns the
// CUresult and the function that produced it (cuCtxSetCurrent or fn) instead of an *Error, so
// that callers for which a code is an answer (NOT_READY) allocate nothing. err is set when
// nothing was called.
func (c *Context) hotResult(bind bool, fn uintptr, args ...uintptr) (r Result, failed uintptr, err error) {
	if err := c.live(); err != nil {
		return 0, 0, err
	}
	if fn == 0 || cuCtxSetCurrent == 0 {
		return 0, 0, errNotLoaded
	}
	f := frames.Get().(*frame)
	f[0] = c.handle
	n := 1 + copy(f[1:], args)
	var ret uintptr
	if bind {
		failed = cuCtxSetCurrent
		runtime.LockOSThread()
		ret, _, _ = purego.SyscallN(cuCtxSetCurrent, f[:1]...)
	}
	if uint32(ret) == 0 {
		failed = fn
		ret, _, _ = purego.SyscallN(fn, f[1:n]...)
	}
	if bind {
		runtime.UnlockOSThread()
	}
	frames.Put(f)
	return Result(int32(uint32(ret))), failed, nil
}

// rawHot calls fn like raw, but without allocation: the arguments reach purego.SyscallN in a
// pooled frame, as in hotResult. The caller keeps what they point to alive and in place
// (heap memory it still references, or C memory).
func rawHot(fn uintptr, args ...uintptr) Result {
	f := frames.Get().(*frame)
	n := copy(f[:], args)
	r, _, _ := purego.SyscallN(fn, f[:n]...)
	frames.Put(f)
	return Result(int32(uint32(r)))
}

// query runs cuStreamQuery or cuEventQuery on handle h: CUDA_ERROR_NOT_READY is the answer
// "not done", not an error, and costs no allocation (Wait polls it).
func (c *Context) query(fn, h uintptr) (done bool, err error) {
	r, failed, err := c.hotResult(true, fn, h)
	switch {
	case err != nil:
		return false, err
	case r == 0:
		return true, nil
	case r == 600:
		return false, nil
	}
	return false, newError(failed, r)
}
