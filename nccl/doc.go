// Package nccl is goccl's binding of NCCL (libnccl), in pure Go: no cgo and no NCCL headers at
// build time. It is the only package of goccl that touches libnccl's C ABI; the others see a
// Comm, typed DataType, RedOp and Result values, and plain device pointers and stream handles
// (uint64 and uintptr), so that this package imports nothing else of goccl.
//
// # Loading
//
// NCCL is optional: goccl works without it, and its absence is an ordinary, explained
// outcome. libnccl is loaded on first use (Load, or any function that needs it) with
// purego.Dlopen, in this order:
//
//  1. $GOCCL_LIBNCCL, a path. When it is set, it is the only candidate: a library the user
//     named that fails to load is an error, never a silent fall back to another one.
//  2. "libnccl.so.2" through the dynamic loader (ld.so.cache, LD_LIBRARY_PATH).
//  3. The NCCL wheel of the active Python environment (pip's nvidia-nccl-cu12 or
//     nvidia-nccl-cu13, both at <site-packages>/nvidia/nccl/lib/libnccl.so.2), found through
//     $VIRTUAL_ENV, $CONDA_PREFIX (also its lib folder, where conda's nccl package goes) and
//     the entries of $PYTHONPATH: the NCCL that PyTorch in that environment uses.
//  4. The system library folders: /usr/lib/<multiarch>, /usr/lib64, /usr/lib, /usr/local/lib,
//     /usr/local/cuda/lib64 and the CUDA toolkit's targets folder.
//  5. The wheels of the system's Python (/usr/local/lib/python3*/ and /usr/lib/python3*/,
//     site-packages and dist-packages) and of the user's (~/.local/lib/python3*/).
//
// A missing library is ErrNotFound, naming every path tried and why it failed. The library
// must be NCCL 2.18 or newer (MinVersion, checked with ncclGetVersion): an older one is
// ErrVersion, naming both versions. The answer is kept for the life of the process.
//
// Functions are bound from one symbol table of exact names (symbols.go), each with its C
// prototype. A required one missing is ErrVersion; an optional one turns off its Feature (see
// Has), and only the methods needing it fail, with an error wrapping ErrNotSupported:
// FeatureFinalize (ncclCommFinalize, 2.14), FeatureRegister (ncclCommRegister and
// ncclCommDeregister, 2.19), FeatureWindow (ncclCommWindowRegister and
// ncclCommWindowDeregister, 2.27).
//
// # Communicators
//
// Rank 0 calls GetUniqueID and hands the 128-byte UniqueID to every rank, which calls InitRank
// with it. InitRank makes the communicator non-blocking by default (ncclConfig_t.blocking = 0):
// NCCL connects the ranks in the background while InitRank polls ncclCommGetAsyncError, and a
// context that ends first aborts the init instead of leaving the process waiting for a rank
// that never comes. NCCL takes the rank's device from the CUDA runtime's current device of the
// calling thread: Config.Bind makes it current. StartInitRank and WaitReady split the two
// steps, and Group issues several calls together (ncclGroupStart/ncclGroupEnd on one thread).
//
// Comm.AllReduce queues an all-reduce on a CUDA stream and makes no Go allocation. Comm.Destroy
// frees a communicator after its work (ncclCommFinalize, then ncclCommDestroy), Comm.Abort at
// once, from any goroutine; Comm.AsyncError reports errors that NCCL found in the background
// (a peer gone, a network failure).
//
// # Errors
//
// A failed call returns an *Error {Op, Code, Message}, e.g. "ncclAllReduce:
// ncclInvalidArgument (4): invalid argument (run with NCCL_DEBUG=WARN for details): <NCCL's
// last error>", where Message combines ncclGetErrorString and ncclGetLastError. It is usually
// wrapped with the rank and what was being done. Compare with errors.Is against the Err*
// Result constants (ErrInvalidArgument, ErrRemoteError, ErrInProgress, ...) and the other
// sentinels (ErrNotFound, ErrVersion, ErrNotSupported, ErrClosed, ErrTimeout). Setting
// NCCL_DEBUG=WARN in the environment makes NCCL print its own account on stderr.
//
// # Architectures
//
// ncclCommInitRank takes ncclUniqueId, a 128-byte struct, by value. The init functions pass it
// as the C ABI of amd64 (on the stack) and arm64 (by reference to a copy) requires; on other
// architectures they return an error wrapping ErrNotSupported.
package nccl
