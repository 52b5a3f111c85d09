// Package driver is goccl's binding of the CUDA driver API (libcuda), in pure Go: no cgo and
// no CUDA toolkit at build time. It is the only package of goccl that touches libcuda's C ABI;
// the others see typed handles (Device, Context, Stream, Event, DevicePtr, Module, Function).
//
// # Loading
//
// libcuda is loaded on first use (Init, or any function that needs the driver) with
// purego.Dlopen, in this order:
//
//  1. $GOCCL_LIBCUDA, a path. When it is set, it is the only candidate: a library the user
//     named that fails to load is an error, never a silent fall back to another one.
//  2. "libcuda.so.1" through the dynamic loader (ld.so.cache, LD_LIBRARY_PATH).
//  3. The usual driver folders: /usr/lib/<multiarch>, /usr/lib64, /usr/lib,
//     /usr/local/nvidia/lib64 (containers), /usr/lib/wsl/lib (WSL). The toolkit's stubs folder
//     is not searched: its libcuda is a stub that cannot run anything.
//
// A missing library is ErrNoDriver, naming every path tried and why it failed; a driver that
// sees no GPU is ErrNoDevice. Functions are bound from one symbol table of exact versioned
// names (cuMemAlloc_v2, cuIpcOpenMemHandle_v2, ...). A required symbol missing from an old
// driver fails Init naming it; an optional one turns off its Feature (see Has), and only the
// methods needing it fail, with an error wrapping ErrNotSupported.
//
// # Threads
//
// CUDA's current context is per OS thread. Every method that needs a context makes its
// Context current itself, on a goroutine locked to its thread for the duration of the call:
// callers never call runtime.LockOSThread, and every object is usable from any goroutine. The
// one exception is stream capture, which the driver ties to a thread (see Stream.BeginCapture).
//
// # Errors
//
// A failed call returns an *Error {Op, Code, Name, Message}, e.g. "cuMemAlloc_v2:
// CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", usually wrapped with what was being done.
// Compare with errors.Is against the Err* sentinels. A PTX module the JIT rejects returns a
// *JITError with the compiler's log.
//
// # Lost contexts
//
// A kernel fault (illegal address, device-side assert, ...) kills the CUDA context: every
// later call on it fails with the same code, and errors.Is(err, ErrContextLost) tells such
// errors apart from those that leave the context usable. Context.Health asks for that state
// without waiting for queued work. Only a new process can use the GPU again.
//
// # Hot path
//
// Launch, LaunchEx, the *Async copies and memsets, Event.Record, Stream.WaitEvent,
// GraphExec.Launch, the Query methods, Context.PointerInfo and Context.Health make no Go
// allocation per successful call: arguments travel through purego.SyscallN, and kernel
// arguments and launch structures live in a reusable Args.
//
// # Working with other CUDA code
//
// Streams and contexts made elsewhere (cgo code, another binding, a CUDA library) are wrapped
// without being owned: WrapStream takes a CUstream, WrapContext a CUcontext, CurrentContext
// the context current on the calling thread. A wrapped object works like one of this package
// for every method, but Close only forgets it; its owner destroys it, after the last use of
// the wrapper. Stream.Handle and Context.Handle hand this package's objects to others, which
// must not destroy them. Context.PointerInfo tells what memory an address is (device, host,
// which device, which allocation, this context's or not) in one driver call, and
// ErrNotDeviceMemory when the driver knows no allocation there.
//
// # Ownership
//
// What a Context creates must be released before the Context is closed: Stream.Close,
// Event.Close, Module.Close (which invalidates its Functions), Free for Alloc,
// HostBuffer.Close, IPCCloseMemHandle for IPCOpenMemHandle, Unmap, FreeAddress and
// PhysicalAlloc.Release for VMM memory, Graph.Close and GraphExec.Close. Closing twice is a
// no-op; using a closed object is an error, not a crash. Closing a foreign Context releases
// only what this package made in it (the stream of Health); closing a wrapped Stream only
// forgets it. A Device is a plain number. The file descriptor from PhysicalAlloc.ExportFD
// belongs to the caller.
package driver
