package ptx

// The constants below are the host side of docs/kernel-abi.md; the templates
// hard-code the same numbers, and the tests check that they agree.

// Launch shape.
const (
	// ThreadsPerBlock is the largest block a kernel is launched with (the
	// PTX says .maxntid 512, 1, 1); launches may use fewer threads.
	ThreadsPerBlock = 512
	// MaxBlocks is the largest grid: the signal region has counters for 64
	// blocks and no more.
	MaxBlocks = 64
	// MaxRanks is the largest world size: the signal region has 16 lanes per
	// block.
	MaxRanks = 16
	// VectorBytes is the unit of work of one thread: one ld/st.global.v4.b32.
	// Buffers handed to a kernel hold a whole number of vectors.
	VectorBytes = 16
)

// Signal region: one per rank, SignalBytes long, zeroed once at creation and
// then owned by the kernels.
const (
	// SignalBytes is the size of one rank's signal region.
	SignalBytes = 16384
	// SelfCounterOffset is the byte offset of self_counter[64 blocks][16 lanes]
	// (u32): the round number of each (block, lane), private to the rank.
	SelfCounterOffset = 0
	// PeerCounterOffset is the byte offset of peer_counter[2 phases][64 blocks][16 ranks]
	// (u32): the flags the peers write into this rank's region.
	PeerCounterOffset = 4096
	// PushEpochOffset is the byte offset of push_epoch[64 blocks] (u32): the
	// receive part (0 to PushParts-1) of each block's next push call.
	PushEpochOffset = 12288
	// PushPendingOffset is the byte offset of push_pending[64 blocks] ({u32 nvec,
	// u32 ntid}): the shape of block b's previous push call if that call left its
	// receive slots to be re-armed by the next one (its deferred re-arm), else zeros.
	PushPendingOffset = 12544
)

// Error record: ErrRecordBytes of u32 words {code, rank, block, peer, phase,
// 0, 0, 0} in host-mapped memory, zeroed by the host before a launch. The first
// thread that fails claims it (atomic compare-and-swap of the code from 0) and
// only then writes the other words.
const (
	// ErrRecordBytes is the size of one error record.
	ErrRecordBytes = 32
	// ErrCodeTimeout: a peer did not arrive within the timeout. The record's
	// peer is the rank waited for and phase says where.
	ErrCodeTimeout = 1
	// ErrCodeUnfilledSlot: a registration slot of the input table held a nil
	// pointer (a graph whose handles were never exchanged). The record's peer
	// is the rank whose pointer is nil; phase is PhaseNone.
	ErrCodeUnfilledSlot = 2
)

// Phases of an error record: where the kernel was waiting.
const (
	// PhaseNone is the phase of an error that is not a wait (an unfilled slot).
	PhaseNone = 0
	// PhaseEntry is the entry barrier (one-shot and two-shot).
	PhaseEntry = 1
	// PhaseMiddle is the two-shot barrier between reduce-scatter and all-gather.
	PhaseMiddle = 2
	// PhaseExit is the one-shot exit barrier.
	PhaseExit = 3
	// PhasePush is the push kernel waiting for a peer's data.
	PhasePush = 4
)

// Launch flags: the bits of p_flags.
const (
	// FlagEarlyTrigger lets a kernel launched with PDL (sm_90) allow the next kernel of its
	// stream to launch before its last wait on a peer: one-shot before its exit barrier, the
	// direct two-shot before its delivered barrier, push after its sends. The next kernel's
	// blocks then wait, in griddepcontrol.wait, next to this kernel's, so the host sets the
	// flag only where both grids of every rank on the GPU fit at once (with one rank per GPU,
	// always). Without it a kernel triggers only after its last wait on a peer (two-shot
	// through tmp, after the middle barrier) or when it exits.
	FlagEarlyTrigger = 1
)

// EarlyTriggerRoom is the host's rule for FlagEarlyTrigger: the largest grid that may carry
// it when ranksOnGPU ranks share a GPU that holds slots resident blocks (SMs times blocks per
// SM at ThreadsPerBlock), and each rank's grids, at most maxBlocks, are capped to its share,
// slots/ranksOnGPU. A rank has at most two of its grids on the GPU at once: the one running
// and the next, launched by the first's trigger; the next triggers only after its
// griddepcontrol.wait, so the one after that launches once the first is complete. A flagged
// grid next to any grid of the rank then stays within the rank's share, and every block
// that a waiting block waits for can become resident. With one rank per GPU the next kernel
// waits only for this one, so every grid (up to MaxBlocks) may carry the flag. A result
// below 1 means none may. internal/protomodel's residency model checks the rule.
func EarlyTriggerRoom(maxBlocks, slots, ranksOnGPU int) int {
	if ranksOnGPU <= 1 {
		return MaxBlocks
	}
	return slots/ranksOnGPU - maxBlocks
}

// StaleAfterNs is the period at which a kernel waiting for a peer also checks
// its own rank's error record (once per period and thread: it is host memory),
// and gives up at once (without claiming the record) if an earlier kernel of
// the rank already failed: after one timeout, the kernels queued behind it
// leave within a period each instead of waiting out the whole timeout in turn.
const StaleAfterNs = 65536

// DeferRearmMinRanks is the smallest world size whose push kernel defers the re-arm of its
// receive slots to the next call when every thread has at most one vector (docs/kernel-abi.md,
// push). The zero stores then go out while the rank waits for its slowest peer instead of after
// its last receive. With 8 virtual ranks on an H200 that took 0.2 to 0.27 us off 16 KiB; with
// 4 it cost 0 to 0.08 us, with 2 0.05 to 0.15 (there is less waiting to hide the stores in);
// 5 to 7 ranks were not measured and keep the re-arm after the receive (docs/benchmarks.md).
const DeferRearmMinRanks = 8

// PushParts is the number of parts of a push receive buffer, each ws slots of p_slot bytes,
// that the push kernel of worldSize ranks cycles through: 2, or 3 where it may defer its
// re-arm (a deferred re-arm completes one call later, so the part it zeroes must not be the
// next call's).
func PushParts(worldSize int) int {
	if worldSize >= DeferRearmMinRanks {
		return 3
	}
	return 2
}
