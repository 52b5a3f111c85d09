package ptx

import (
	"fmt"

	"github.com/goccl/goccl/dtype"
)

// The constants below are the host side of docs/kernel-abi.md. The templates get
// them through abiConsts (spec.go), so each number is written down once here.

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
	// CallOffset is the byte offset of call (4 u32 words, CallWords): the call that block 0
	// of this rank made at its latest entry barrier, tagged with that barrier's round, for
	// the peers' call check (one-shot and two-shot; block 0 alone checks). The 64 vectors
	// from here up to FusedRowSyncOffset are reserved for it (only the first is used).
	CallOffset = 13056
)

// Error record: ErrRecordBytes of u32 words in host-mapped memory, zeroed by the host when it
// creates the record: [0] code, [1] rank, [2] block, [3] peer, [4] phase, [5] done, [6..7]
// this rank's call fingerprint (lo, hi), [8..9] the peer's (lo, hi; ErrCodeMismatch only),
// [10] claim, [11..15] 0. The first thread that fails claims the record (atomic
// compare-and-swap of the claim word from 0 to 1), writes words 1..4 and 6..15, then done,
// then the code, the last two with release stores at system scope. The host reads the record
// while kernels may still run: once it sees a code, every other word is there (done is 1).
// The kernels' stale check reads the code too.
const (
	// ErrRecordBytes is the size of one error record.
	ErrRecordBytes = 64
	// ErrWordDone is the index of the done word, set just before the code.
	ErrWordDone = 5
	// ErrWordClaim is the index of the claim word, which the compare-and-swap takes.
	ErrWordClaim = 10
)

// ErrCode is word 0 of an error record: what went wrong (0: nothing).
type ErrCode uint32

const (
	// ErrCodeTimeout: a peer did not arrive within the timeout. The record's
	// peer is the rank waited for and phase says where.
	ErrCodeTimeout ErrCode = 1
	// ErrCodeUnfilledSlot: a registration slot of the input table held a nil
	// pointer (a graph whose handles were never exchanged). The record's peer
	// is the rank whose pointer is nil; phase is PhaseNone.
	ErrCodeUnfilledSlot ErrCode = 2
	// ErrCodeMismatch: rank `rank` saw rank `peer` make a different call (another
	// count, element type, algorithm or operation). Words 6..9 hold both calls'
	// fingerprints; phase is PhaseEntry (pull kernels) or PhasePush.
	ErrCodeMismatch ErrCode = 3
)

// String names the code: "timeout", "unfilled registration slot", "call mismatch".
func (c ErrCode) String() string {
	switch c {
	case 0:
		return "no error"
	case ErrCodeTimeout:
		return "timeout"
	case ErrCodeUnfilledSlot:
		return "unfilled registration slot"
	case ErrCodeMismatch:
		return "call mismatch"
	}
	return fmt.Sprintf("error code %d", uint32(c))
}

// Phase is word 4 of an error record: where the kernel was when it recorded the error.
type Phase uint32

const (
	// PhaseNone is the phase of an error that is not a wait (an unfilled slot).
	PhaseNone Phase = 0
	// PhaseEntry is the entry barrier (one-shot and two-shot), and the call check
	// that follows it.
	PhaseEntry Phase = 1
	// PhaseMiddle is the two-shot barrier between reduce-scatter and all-gather.
	PhaseMiddle Phase = 2
	// PhaseExit is the one-shot exit barrier and the direct two-shot's delivered
	// barrier.
	PhaseExit Phase = 3
	// PhasePush is the push kernel waiting for a peer's data or call header.
	PhasePush Phase = 4
)

// String names the phase: "none", "entry barrier", "middle barrier", "exit barrier",
// "push receive".
func (p Phase) String() string {
	switch p {
	case PhaseNone:
		return "none"
	case PhaseEntry:
		return "entry barrier"
	case PhaseMiddle:
		return "middle barrier"
	case PhaseExit:
		return "exit barrier"
	case PhasePush:
		return "push receive"
	}
	return fmt.Sprintf("phase %d", uint32(p))
}

// Launch flags: the bits of p_flags.
const (
	// FlagEarlyTrigger lets a kernel launched with PDL (sm_90) allow the next kernel of its
	// stream to launch before its last wait on a peer: one-shot before its exit barrier, the
	// direct two-shot before its delivered barrier, push after its sends. The next kernel's
	// blocks then wait, in griddepcontrol.wait, next to this kernel's; where ranks share a GPU
	// the host sets the flag only where that cannot keep a peer's blocks off the GPU
	// (EarlyTriggerAnyGrid, EarlyTriggerRoom; with one rank per GPU, always). Without it
	// two-shot through tmp triggers after its middle barrier (its last wait on a peer), push
	// once a thread's first vector has arrived from every rank, the others when they exit.
	FlagEarlyTrigger = 1
	// FlagStageInput makes the one-shot kernel copy this rank's input, whose address it gets
	// in p_outputs (which one-shot has no other use for), into the buffer that its own entry
	// of the p_inputs table names (the host passes slot 0: the rank's staging buffer), before
	// the entry barrier: each thread copies exactly the vectors it reduces later, and the
	// entry barrier releases the copies to the peers (docs/kernel-abi.md, "Staging in the
	// kernel"). The host sets it wherever the peers cannot read the input in place (an
	// in-place call, or an eager input that is not registered) instead of enqueueing a copy
	// of its own before the launch. Bit 2: the fused kernels use bit 1 (FlagNoNorm), so the
	// bit can mean the same in both families.
	FlagStageInput = 4
	// FlagEntryTrigger moves the trigger that FlagEarlyTrigger allows to right after the entry
	// barrier in the kernels that have one (one-shot, two-shot and the fused kernels), so that
	// the next kernel of the stream launches while this one does its work rather than only
	// before its last wait on a peer; without FlagEarlyTrigger it does nothing. The residency
	// argument of EarlyTriggerAnyGrid is the same for both places. Where ranks share a GPU
	// it is not always faster (docs/benchmarks.md, "PDL trigger at the entry barrier"), so the
	// host chooses it. Push has no entry barrier: its flagged trigger is after its sends
	// either way, and the host does not set this bit for it.
	FlagEntryTrigger = 8
)

// EarlyTriggerAnyGrid reports whether kernel may carry FlagEarlyTrigger at any grid size
// where ranks share a GPU: every kernel but Push. Their early trigger follows their entry
// barrier, where block b waits until block b of every rank has arrived, and the next kernel
// launches only once every block has triggered: by then every block of every rank's same
// call is on the GPU, and those blocks finish without needing another slot (their last wait
// is on blocks that are already there). Push's flagged trigger comes right after its sends,
// before it has seen any peer, so its peers' blocks may still need the slots that its next
// kernel takes: it carries the flag within EarlyTriggerRoom only (without it, push triggers
// once a thread's first vector has arrived from every rank, at any grid: docs/kernel-abi.md,
// "PDL"). internal/protomodel's residency model checks both rules.
func EarlyTriggerAnyGrid(kernel Algorithm) bool {
	return kernel != Push
}

// EarlyTriggerRoom is the host's rule for FlagEarlyTrigger on a kernel whose early trigger
// precedes its waits on peers (Push; EarlyTriggerAnyGrid covers the others): the largest grid
// that may carry it when ranksOnGPU ranks share a GPU that holds slots resident blocks (SMs
// times blocks per SM at ThreadsPerBlock), and each rank's grids, at most maxBlocks, are
// capped to its share, slots/ranksOnGPU. A rank has at most two of its grids on the GPU at
// once: the one running and the next, launched by the first's trigger; the next triggers only
// after its griddepcontrol.wait, so the one after that launches once the first is complete. A
// flagged grid next to any grid of the rank then stays within the rank's share, and every
// block that a waiting block waits for can become resident. With one rank per GPU the next
// kernel waits only for this one, so every grid (up to MaxBlocks) may carry the flag. A result
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

// PushHeaderBytes is the header at the start of every push receive slot, then the data.
// Block 0 of the sender writes its call (CallWords with PushHeaderTag) into the header of
// its slot in every receiver, and the receiver's block 0 compares it with its own call; the
// header names the whole call, so the other blocks carry none (docs/kernel-abi.md, "Call
// check").
const PushHeaderBytes = VectorBytes

// PushHeaderTag is the tag of the push call header's words (CallWords): any value whose
// bits are not all zero, so that every word of a header that arrived is non-zero, which is
// how the receiver tells it from a re-armed (zeroed) slot.
const PushHeaderTag = 0x600C

// PushSlotBytes returns the bytes of one push receive slot for messages of up to
// pushMaxBytes: the call headers (PushHeaderBytes), then the data rounded up to whole
// vectors. It is the value the host passes as p_slot and sizes each receive buffer from
// (PushParts(ws)*ws slots). A negative size counts as 0.
func PushSlotBytes(pushMaxBytes int64) int64 {
	pushMaxBytes = max(pushMaxBytes, 0)
	return PushHeaderBytes + (pushMaxBytes+VectorBytes-1)/VectorBytes*VectorBytes
}

// CallOp is the operation of a call fingerprint. It is never 0, so that no fingerprint is.
type CallOp uint8

// Operations a kernel can check its peers for.
const (
	// OpAllReduce is a plain sum all-reduce.
	OpAllReduce CallOp = 1
)

// String names the operation: "all-reduce", "all-reduce+rmsnorm", "all-reduce+residual".
func (o CallOp) String() string {
	switch o {
	case OpAllReduce:
		return "all-reduce"
	case OpAllReduceRMSNorm:
		return "all-reduce+rmsnorm"
	case OpAllReduceResidual:
		return "all-reduce+residual"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Call describes one rank's call as its kernel checks it against the peers': each rank
// passes the fingerprint of its call (p_call), and a kernel that sees a peer with another
// records ErrCodeMismatch with both.
type Call struct {
	Op   CallOp
	Algo Algorithm
	// DType is the element type of the message.
	DType dtype.DType
	// Count is the number of elements; the fingerprint keeps its low 40 bits.
	Count uint64
	// Staged says that the rank's input is read through the staging buffer (table slot 0),
	// not in place from a registered buffer. Ranks must agree: a rank reading its peers'
	// staging buffers while a peer reads its registered input in place (registered src in
	// place on one rank, out of place on another) would read stale or changing data. For the
	// fused Columns kernel it says that the call goes through the tmp buffers instead of
	// into every rank's ResidualOut, on which the ranks must agree as well.
	Staged bool
	// Direct says that the rank's kernel writes its results straight into every rank's
	// output through a registration slot (p_outputs, the fused kernels' p_resid_outs), not
	// through its tmp buffer. Ranks must agree: a rank gathering from its peers' tmp buffers
	// beside a peer that wrote into the outputs instead (a registered output on one rank, an
	// unregistered one on another) would gather stale rows; the two kernels pass the same
	// number of barriers, so nothing else tells them apart.
	Direct bool
}

// Fingerprint packs the call into 64 bits: Count in bits 0..39, DType in 40..47, Algo in
// 48..53, Direct in 54, Staged in 55, Op in 56..63. Two calls whose fields fit these widths
// have equal fingerprints exactly when they are equal; a fingerprint is never 0 when Op is
// not.
func (c Call) Fingerprint() uint64 {
	return c.Count&(1<<40-1) | uint64(uint8(c.DType))<<40 | uint64(uint8(c.Algo)&0x3F)<<48 |
		bit(c.Direct)<<54 | bit(c.Staged)<<55 | uint64(c.Op)<<56
}

// bit is 1 for true, 0 for false.
func bit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// DecodeCall unpacks a fingerprint (the inverse of Fingerprint for calls whose fields fit).
// Zero gives the zero Call, whose String is "no call".
func DecodeCall(fp uint64) Call {
	return Call{
		Op:     CallOp(fp >> 56),
		Algo:   Algorithm(uint8(fp>>48) & 0x3F),
		DType:  dtype.DType(uint8(fp >> 40)),
		Count:  fp & (1<<40 - 1),
		Staged: fp>>55&1 == 1,
		Direct: fp>>54&1 == 1,
	}
}

// String describes the call, e.g. "all-reduce of 1024 bf16 elements (twoshot)".
func (c Call) String() string {
	if c == (Call{}) {
		return "no call"
	}
	direct := ""
	if c.Direct {
		direct = ", straight into every rank's output"
	}
	if c.Op == OpAllReduceRMSNorm || c.Op == OpAllReduceResidual {
		rows, hidden := FusedShape(c.Count)
		if c.Staged {
			return fmt.Sprintf("%v of %d rows of %d %v elements (%v, through tmp%s)", c.Op, rows, hidden, c.DType, c.Algo, direct)
		}
		return fmt.Sprintf("%v of %d rows of %d %v elements (%v%s)", c.Op, rows, hidden, c.DType, c.Algo, direct)
	}
	unit := "elements"
	if c.Count == 1 {
		unit = "element"
	}
	if c.Staged {
		return fmt.Sprintf("%v of %d %v %s (%v, input through the staging buffer%s)", c.Op, c.Count, c.DType, unit, c.Algo, direct)
	}
	return fmt.Sprintf("%v of %d %v %s (%v%s)", c.Op, c.Count, c.DType, unit, c.Algo, direct)
}

// CallWords spreads a fingerprint over four u32 words, 16 bits each, with tag in the upper
// half of every word: word i = tag<<16 | (fp >> 16i) & 0xFFFF. A reader that loads the
// words while they are being rewritten (a 16-byte store may land word by word) sees each
// word whole, and the tag says which write it came from: the one-shot and two-shot call
// check tags the words with the entry barrier's round, the push header with PushHeaderTag
// (so that no word of a header is 0). The kernels build the words with prmt.
func CallWords(fp uint64, tag uint16) [4]uint32 {
	var w [4]uint32
	for i := range w {
		w[i] = uint32(tag)<<16 | uint32(fp>>(16*i))&0xFFFF
	}
	return w
}

// CallFromWords is the fingerprint that CallWords spread, whatever the tags.
func CallFromWords(w [4]uint32) uint64 {
	var fp uint64
	for i := range w {
		fp |= uint64(w[i]&0xFFFF) << (16 * i)
	}
	return fp
}
