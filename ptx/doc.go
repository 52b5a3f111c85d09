// Package ptx holds goccl's all-reduce kernels: hand-written PTX templates
// embedded in the binary, their instantiation for one (algorithm, element
// type, world size, target), and the catalog the launcher packs its
// arguments from.
//
// Nothing here touches a GPU. A Spec is a pure description; Spec.Generate
// returns deterministic PTX text that the driver package JIT-compiles
// (cuModuleLoadData) into a module with the single entry Spec.EntryName.
// The host side of every kernel, the parameter list, the signal region, the
// barrier, the watchdog and the algorithms, is docs/kernel-abi.md; the Go
// constants of that contract are in abi.go and Params is its parameter list.
//
// # Templates
//
// templates/*.ptx.tmpl are PTX with text/template actions only where kernels
// differ: the element type, the world size (every loop over ranks is
// unrolled, so each rank's vector has its own registers) and the target
// (sm_90 adds programmatic dependent launch). common.ptx.tmpl defines the
// shared pieces:
//
//	header, entry   .version 7.8 / .target / .address_size, and the .entry
//	                signature (the same thirteen parameters, Params, for every plain
//	                kernel; FusedParams and FusedPushParams for the fused ones)
//	registers,      the registers every piece may use, the grid-stride mapping,
//	prologue        griddepcontrol.wait on sm_90, "timeout 0 = forever", the
//	                index of a partial last vector (%lastvec)
//	barrier         the per-block barrier, steps (1) to (6) of docs/kernel-abi.md:
//	                round numbers in two phase slots (system scope) or counted
//	                arrivals (GPU scope); volatile flags for entry/exit,
//	                release/acquire for the two-shot middle and delivered barriers
//	publish,        the call check of one-shot and two-shot: thread 0 publishes
//	callload,       the call (p_call) with the entry barrier's round, lane t loads
//	callcheck       rank t's right after the barrier and tests it before its next
//	                arrival (callwords, calldiff: the words and their test)
//	watchdog,       the tail of every spin loop: %globaltimer against
//	record          p_timeout, then the error record claimed with
//	                atom.global.cas.b32 on its claim word (first writer wins),
//	                filled, and published done first, code last
//	inputs,         a registration table of pointers (inputs; the direct
//	pointers,       two-shot's outputs) and the check for an unfilled (nil)
//	slotcheck       slot
//	loads,          the 16-byte vector path: all ws ld.global.v4.b32 first,
//	accumulate,     then widening to f32 and add.rn.f32 in a fixed order, then
//	pack            one rounding (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32)
//	outstore,       a final store: whole vectors, but only p_tail bytes of the
//	partial         message's last one (32-bit words, then a 16-bit half)
//	zerolanes       the all-zero-element marking of the push protocol
//
// oneshot.ptx.tmpl, twoshot.ptx.tmpl and push.ptx.tmpl each define one
// kernel from these pieces. fused.ptx.tmpl defines the fused all-reduce +
// residual add + RMSNorm kernels (FusedSpec: one-shot and two-shot, their
// parameter list declared once in FusedParams) and the single-rank residual
// add + RMSNorm kernel (NormSpec) that the benchmarks pair with a plain
// all-reduce. A piece that needs temporaries or labels opens a
// { } scope, which scopes both in PTX, so it can be used several times in a
// kernel.
//
// # Reading a kernel
//
// Generate a kernel (or read the templates) and read it top down: every block
// of instructions starts with a comment saying what it does and why its
// memory order is what it is. Registers: %v<4r>..%v<4r+3> are the r-th
// vector loaded for an index (rank r's for one-shot and push, rank
// (rank+r) mod ws's for two-shot), %acc<i> the f32 sums of its elements,
// %in<r> and %tmp<r> the pointers the vectors come from, %idx the vector
// index of the grid-stride loop and %off its byte offset. Labels are local to
// their { } scope; EXIT is the kernel's single ret.
//
// # What the host must provide
//
// Beyond docs/kernel-abi.md, the kernels rely on these, and do not check them:
//
//   - every pointer and p_slot are multiples of VectorBytes (16-byte vector
//     accesses);
//   - one-shot: p_out must not be a buffer the peers read, i.e. not this
//     rank's registered input (a peer may still be reading element i when this
//     rank writes its sum there). Two-shot and push may run in place (p_out
//     exactly the own input; for direct two-shot every rank's output exactly
//     its input): every element of the input is dead once the block that
//     writes it passed the middle barrier (two-shot), is read and then written
//     by the same thread and by no other (direct two-shot), or is never read
//     by a peer (push);
//   - two-shot: each tmp buffer holds part + nvec%ws vectors
//     (part = nvec/ws);
//   - push: receive buffers hold PushParts(ws)*ws slots of p_slot >= PushHeaderBytes +
//     nvec*16 bytes (PushSlotBytes) and are zero when created (all zero bits =
//     "not arrived"); the result of an element whose every input is zero is
//     -0.0, as +0.0 travels as -0.0;
//   - every input holds nvec whole vectors' worth of readable memory: the kernels
//     load the message's last vector whole (a 16-byte aligned vector that starts
//     inside an allocation never crosses a page) and store only its p_tail bytes;
//   - mismatched calls: see docs/kernel-abi.md ("Call check") for why a rank whose
//     count differs from its peers' still reads and writes in bounds;
//   - after an error record (a timeout), the signal region and the push
//     receive buffers are in an unknown state: the communicator must be
//     rebuilt, not reused.
//
// # Validation
//
// The tests assemble every variant (3 algorithms x 3 element types x world
// sizes 2..16 x 2 targets x 3 barrier scopes) with ptxas from GOCCL_PTXAS
// (scripts/fetch-tools.sh fetches it) and fail on register spills or a stack
// frame, and check every generated .entry signature against Params. They also
// read the text: the memory order of every flag, the tail store (interpreted
// for every p_tail), the call check's placement, and every error record's
// words and order. Whether the kernels compute the right bits is tested on a
// GPU by the collective package against internal/ref.
package ptx
