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
// # Inputs and graphs
//
// OneShot and TwoShot read the peers' inputs directly, so the input must be in memory the
// peers have mapped. An eager call copies src into the rank's staging buffer first. Register
// shares a user buffer once so calls that read from it skip the copy (and TwoShot calls that
// write into it write every rank's output directly). Capture records all-reduces into a CUDA
// graph and exchanges the captured buffers afterwards. Registered buffers are matched across
// ranks by registration order: a call that passes a registered buffer on one rank must pass
// its counterpart on every rank.
//
// # Errors
//
// Invalid calls fail before anything is launched, with errors wrapping ErrInvalidArgument.
// Kernels never wait forever: a peer that does not arrive within Options.Timeout makes the
// waiting kernel record a KernelError (errors.Is ErrTimeout) naming the rank, the missing
// peer and the phase; Err returns it and the communicator refuses further work.
//
// # Concurrency
//
// A Comm's methods may be called from any goroutine; calls are serialised. The all-reduces of
// one communicator must be ordered on the GPU (one stream, or streams ordered by events),
// since each kernel's barrier pairs with the peers' kernel of the same call.
package collective
