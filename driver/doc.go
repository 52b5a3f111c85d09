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
// # Hot path
//
// Launch, LaunchEx, the *Async copies and memsets, Event.Record, Stream.WaitEvent and
// GraphExec.Launch make no Go allocation per call: arguments travel through
// purego.SyscallN, and kernel arguments and launch structures live in a reusable Args.
//
// # Ownership
//
// What a Context creates must be released before the Context is closed: Stream.Close,
// Event.Close, Module.Close (which invalidates its Functions), Free for Alloc,
// HostBuffer.Close, IPCCloseMemHandle for IPCOpenMemHandle, Unmap, FreeAddress and
// PhysicalAlloc.Release for VMM memory, Graph.Close and GraphExec.Close. Closing twice is a
// no-op; using a closed object is an error, not a crash. A Device is a plain number. The file
// descriptor from PhysicalAlloc.ExportFD belongs to the caller.
package driver
