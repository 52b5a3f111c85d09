// Package collective is goccl's communicator: an all-reduce across the GPUs of one node for
// the small and medium messages of tensor parallelism, with no cgo and no CUDA toolkit.
//
// A communicator has one Comm per rank. Build it with NewGroup when one process drives every
// GPU (a device may repeat: virtual ranks sharing one GPU), or with New in each of several
// processes, joined by a bootstrap (package collective/bootstrap: Unix socket, or torchrun's
// environment). Then, on every rank:
//
//	err := comm.AllReduce(stream, dst, src, count, collective.BFloat16)
//
// enqueues the all-reduce on the rank's stream. All ranks issue the same all-reduces in the
// same order; the result is bitwise identical on every rank.
//
// # Algorithms
//
// Three kernels, chosen per call by a table of (compute capability, world size, bytes) or
// forced with Options.Algorithm or GOCCL_ALGO:
//   - Push: each rank writes its input into a slot of every rank's receive buffer; receivers
//     poll for arrival element by element (+0.0 travels as -0.0, so all-zero bits mean "not
//     arrived"). No barrier, no registered input: the fastest for small messages.
//   - OneShot: an entry barrier, every rank reads every input and reduces in rank order, an
//     exit barrier. The fastest up to a few hundred KiB.
//   - TwoShot: reduce-scatter into each rank's tmp buffer, then all-gather. Moves the least
//     data: the choice for large messages. When the outputs are shared too (registered, or
//     captured), each rank writes its reduced shard straight into every rank's output: two
//     barriers instead of three and no tmp round trip ("direct"). Its release/acquire
//     barriers are GPU-scope when every rank runs on one GPU (virtual ranks, or processes
//     sharing it), system-scope otherwise.
//
// The one-shot and two-shot barriers count arrivals with atomic adds where the ranks' GPUs
// have native atomics on each other's memory (one GPU, NVLink), and store round numbers into
// the peers' flags where they do not (PCIe); docs/kernel-abi.md, "Barrier".
//
// # Fused all-reduce + residual add + RMSNorm
//
// AllReduceResidualRMSNorm is the call that ends a tensor-parallel transformer layer:
// ResidualOut = allreduce(In) + Residual and NormOut = RMSNorm(ResidualOut) * Gamma, in one
// kernel (one-shot; two-shot, where each rank norms a band of whole rows; or, from 8 ranks on
// one GPU and few rows, columns, where each rank sums a band of every row's columns: picked by
// rows and world size; push where AllReduceResidualRMSNormWith asks for it), with the same
// barriers, watchdog, registration, graphs and PDL as AllReduce.
// The sum makes no extra trip through HBM and the layer pays one launch instead of two. The
// arithmetic order, and so every rounding, is fixed (docs/kernel-abi.md); internal/ref
// reproduces it bit for bit. Where the kernels cannot take the call (past MaxBytes, a
// communicator they cannot serve) NCCL does, as for AllReduce: NCCL's all-reduce, then the
// residual add and RMSNorm of each rank in a second kernel.
//
// # Inputs and graphs
//
// OneShot and TwoShot read the peers' inputs directly, so the input must be in memory the
// peers have mapped. An eager call copies src into the rank's staging buffer first (OneShot's
// kernel makes the copy itself, before its entry barrier; TwoShot and the fused kernels are
// preceded by a device-to-device copy). Register shares a user buffer once so calls that read
// from it skip the copy (and TwoShot calls that write into it write every rank's output
// directly); an in-place OneShot still goes through the staging buffer, since it overwrites
// its input while the peers read it, so the selection gives an in-place call into a
// registered (or captured) buffer to TwoShot, which needs no copy. Every rank must then read
// its peers the same way: a registered input read in place on one rank beside a staged one on
// another is reported as ErrCallMismatch. Release the Registration before freeing
// the buffer. Capture records all-reduces into a CUDA graph and exchanges the captured buffers
// afterwards; a buffer used by many calls of one capture takes one registration slot, and
// closing the Graph gives its slots back, so an engine can capture one graph per batch size and
// capture them again at will. Registered buffers are matched across ranks by registration
// order: a call that passes a registered buffer on one rank must pass its counterpart on every
// rank. AllReduce may also be called while the caller captures its own graph (the input then
// goes through the staging buffer unless it is registered).
//
// Streams and memory made elsewhere work as they are: driver.WrapStream takes a CUstream of
// another library without owning it, and buffers only need to be device memory of the rank's
// device.
//
// # Errors
//
// Invalid calls fail before anything is launched, with errors wrapping ErrInvalidArgument:
// sizes past MaxBytes (overflow included), nil, misaligned or partly overlapping buffers, and
// pointers that are not device memory of the rank's device (checked once per allocation with
// the driver). Any element count is accepted. Register and Capture are collective: one rank's
// refusal reaches every rank at once (*RefusedError), and the communicator stays usable.
//
// Kernels never wait forever: a peer that does not arrive within Options.Timeout makes the
// waiting kernel record a KernelError (errors.Is ErrTimeout) naming the rank, the missing
// peer and the phase. Ranks that issue different all-reduces (another count or element type)
// are caught in the kernel: ErrCallMismatch names both ranks and both calls. A CUDA error that
// leaves the context unusable (a kernel fault anywhere in the process) is reported as
// driver.ErrContextLost. After any of these Err returns the error, every call refuses work
// with it (errors.Is ErrUnusable), and the communicator should be closed. docs/guarantees.md
// lists what goccl guarantees under bad input and faults, with the test behind each line.
//
// # Start-up
//
// New JIT-compiles the kernels the communicator launches (nine modules: three algorithms,
// three element types, of the barrier scope it uses), side by side on the process's cores,
// and keeps them loaded for the rest of the process: a later New of the same world size finds
// them ready. The fused and single-rank norm kernels are not among them: each loads on its
// first call, or when Comm.LoadFused asks, which a process driving several ranks must do
// before its first all-reduce (a module load can wait for the kernels in flight, and those
// may wait for ranks the process has yet to launch). UnloadKernels frees the ones no open
// communicator uses. Comm.Startup returns where New spent its time (driver, context,
// kernels, memory, exchanges), step by step, and which kernels it compiled or found loaded;
// docs/benchmarks.md ("Start-up") has the figures.
//
// # Concurrency and lifetime
//
// A Comm's methods may be called from any goroutine; calls are serialised. The all-reduces of
// one communicator must be ordered on the GPU (one stream, or streams ordered by events),
// since each kernel's barrier pairs with the peers' kernel of the same call. Close waits for
// this communicator's own queued work (bounded by twice Options.Timeout plus a few seconds),
// never for the rest of the context's, and frees nothing if that work is still running.
//
// After a communicator's first calls, its eager calls (AllReduce, AllReduceResidualRMSNorm,
// ResidualRMSNorm, and calls handed to NCCL) allocate nothing in Go: a service that makes
// them for every layer adds no work for the garbage collector.
package collective
