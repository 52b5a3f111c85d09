package collective

import (
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/ptx"
)

// DType is the element type of an all-reduce.
type DType = dtype.DType

// Element types.
const (
	Float32  = dtype.Float32
	Float16  = dtype.Float16
	BFloat16 = dtype.BFloat16
)

// Algorithm names how an all-reduce is done: one of goccl's kernels, or NCCL. Auto lets the
// selection table choose per call.
type Algorithm int

// Algorithms. OneShot reads every rank's input and reduces (two barriers); TwoShot does a
// reduce-scatter then an all-gather (more bandwidth, one more hop); Push writes the input into
// every rank's receive buffer and needs no barrier and no registered input (small messages).
// NCCL hands the call to libnccl: sizes past MaxBytes, GPUs the kernels cannot serve, several
// nodes (see Options.NCCL).
const (
	Auto    Algorithm = 0
	OneShot           = Algorithm(ptx.OneShot)
	TwoShot           = Algorithm(ptx.TwoShot)
	Push              = Algorithm(ptx.Push)
	NCCL    Algorithm = 16
)

// Algorithms lists goccl's own kernels, in a fixed order.
var Algorithms = []Algorithm{OneShot, TwoShot, Push}

// String returns the name used by GOCCL_ALGO, flags and tables: "auto", "oneshot",
// "twoshot", "push" or "nccl".
func (a Algorithm) String() string {
	switch a {
	case Auto:
		return "auto"
	case NCCL:
		return "nccl"
	}
	return ptx.Algorithm(a).String()
}

// kernel returns the kernel of a, or false for Auto and NCCL.
func (a Algorithm) kernel() (ptx.Algorithm, bool) {
	switch a {
	case OneShot, TwoShot, Push:
		return ptx.Algorithm(a), true
	}
	return 0, false
}

// ParseAlgorithm turns a name of String (any case) into an Algorithm.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch strings.ToLower(s) {
	case "auto":
		return Auto, nil
	case "nccl":
		return NCCL, nil
	}
	a, err := ptx.ParseAlgorithm(s)
	if err != nil {
		return 0, fmt.Errorf("unknown algorithm %q: use auto, oneshot, twoshot, push or nccl", s)
	}
	return Algorithm(a), nil
}

// NCCLMode says whether a communicator also drives NCCL, the engine for what goccl's kernels
// cannot do or do worse: all-reduces past MaxBytes, GPUs without a working peer path or a full
// NVLink mesh, ranks on several nodes.
type NCCLMode int

const (
	// NCCLAuto initialises an NCCL communicator beside the kernels when every rank's process
	// can load libnccl (package nccl says where it looks) and no two ranks of one host share
	// a GPU (NCCL takes one rank per GPU of a host); without it everything the kernels can do
	// still works, and a call only NCCL could take says why NCCL is missing.
	NCCLAuto NCCLMode = iota
	// NCCLOff never uses NCCL.
	NCCLOff
	// NCCLAlways requires NCCL: New fails when it cannot be initialised.
	NCCLAlways
)

// Defaults of Options.
const (
	DefaultMaxBytes     = 8 << 20
	DefaultPushMaxBytes = 512 << 10
	// DefaultBlocks is ptx.MaxBlocks: the largest grid the signal region has counters for.
	// With virtual ranks on an H200 (BenchmarkAllReduceGrid), 64 blocks instead of 36 took
	// 2 ranks from 13.0 to 8.8 us (OneShot) and from 9.1 to 7.4 us (direct TwoShot) at 8 MiB,
	// 4 ranks from 22.6 to 21.2 us at 8 MiB, and changed nothing at 16 KiB (two blocks of
	// work); grids shrink to what a message needs, and ranks sharing a GPU are capped anyway.
	DefaultBlocks     = 64
	DefaultPushBlocks = 16
	DefaultTimeout    = 10 * time.Second
	DefaultMaxSlots   = 4096
	// MaxSlotsLimit is the largest Options.MaxSlots: a table of 128 MiB a rank.
	MaxSlotsLimit = 1 << 20
)

// Options configure a communicator. The zero value is ready to use. All ranks of one
// communicator must pass the same options.
type Options struct {
	// MaxBytes is the largest all-reduce in bytes (default DefaultMaxBytes), a multiple of 16.
	// Each rank holds about 2*MaxBytes of staging memory. At most 16*(2^32-1): larger calls
	// belong to NCCL.
	MaxBytes int64
	// PushMaxBytes is the largest all-reduce the Push algorithm takes (default
	// DefaultPushMaxBytes). Each rank holds ptx.PushParts(world size) * world size * PushMaxBytes
	// of receive buffers (2 or 3 parts).
	PushMaxBytes int64
	// Algorithm forces one algorithm for every call (default Auto: the selection table, or
	// the GOCCL_ALGO environment variable: oneshot, twoshot, push or nccl).
	Algorithm Algorithm
	// Blocks is the number of thread blocks per rank for OneShot and TwoShot (default
	// DefaultBlocks). It is capped by occupancy when several ranks share one GPU, since every
	// block of every rank must be resident at once.
	Blocks int
	// PushBlocks is the fixed number of blocks of every Push launch (default
	// DefaultPushBlocks), capped like Blocks.
	PushBlocks int
	// ThreadsPerBlock fixes the block size of every launch: a multiple of 32 in
	// [MinThreadsPerBlock, 512]. The default (0) uses 512-thread blocks, except that Push
	// spreads a message smaller than its grid, and TwoShot a small shard, over smaller
	// blocks. (The block caps for ranks sharing a GPU assume 512 threads either way.)
	ThreadsPerBlock int
	// Timeout is how long a kernel waits for a peer before it gives up and records an error
	// (default DefaultTimeout; negative: wait forever). An all-reduce handed to NCCL must
	// complete within Timeout of when its stream reaches it, else the NCCL communicator is
	// aborted and the communicator fails; the replay of a captured graph that holds such calls
	// must complete within Timeout times the number of calls it holds (see Graph.Launch).
	Timeout time.Duration
	// IPC selects how memory is shared between processes (default memory.LegacyIPC).
	IPC memory.Kind
	// MaxSlots bounds the registration table: one slot per registered buffer and per
	// all-reduce captured in a graph (default DefaultMaxSlots, at most MaxSlotsLimit). Each
	// slot takes 128 bytes of device memory on every rank.
	MaxSlots int
	// DisablePDL turns off programmatic dependent launch on sm_90 and later.
	DisablePDL bool
	// SystemScope keeps the system-scope barriers of OneShot and TwoShot (release/acquire at
	// system scope) when every rank runs on one GPU, where the default GPU-scope kernels
	// (ptx.ScopeGPU) are enough and cheaper. Both are correct there. It exists for tests and
	// benchmarks that measure the barriers ranks on several GPUs use; services leave it false.
	SystemScope bool
	// FlagBarriers makes the system-scope barriers store round numbers into the peers' flags
	// (ptx.ScopeSystem), the protocol of GPUs without native atomics on each other's memory
	// (PCIe), also where every rank's GPU has them (NVLink, or one GPU with SystemScope) and
	// the barriers would count arrivals with atomic adds instead (ptx.ScopeSystemCounted).
	// Both are correct there. It exists for tests and benchmarks that measure the barriers of
	// GPUs linked by PCIe; services leave it false.
	FlagBarriers bool
	// AllowNonNVLink lets NewGroup build a communicator over more than two GPUs that are not
	// all linked by NVLink (correct, but usually slower than NCCL there).
	AllowNonNVLink bool
	// NCCL says whether the communicator also drives NCCL (default NCCLAuto).
	NCCL NCCLMode
	// TuneFile is the tuning table that replaces the built-in selection and grids where it
	// has a section for this communicator (docs/tuning.md; arsmoke --tune measures one).
	// The default ("") is the file named by GOCCL_TUNE_FILE, else DefaultTunePath's, used
	// when it exists. GOCCL_TUNE=off turns tables off whatever this says. Algorithm, Blocks,
	// PushBlocks and ThreadsPerBlock, where set, win over the table. Every rank must end up
	// with the same section: if one does not, every rank uses the built-in selection (Notes
	// says so).
	TuneFile string
	// NoTune makes the communicator use the built-in selection and grids, whatever tuning
	// table exists (as GOCCL_TUNE=off does).
	NoTune bool
	// Logf receives each note of New (a tuning table that was ignored, and why; see
	// Comm.Notes), prefixed with "goccl: rank N: ". nil writes each note once per process
	// with the standard logger (package log).
	Logf func(format string, args ...any)

	// defaultBlocks and defaultPushBlocks record that withDefaults filled Blocks and
	// PushBlocks: a tuning table may set those grids, never ones the caller chose.
	defaultBlocks, defaultPushBlocks bool
}

// withDefaults fills zero fields and validates the rest.
func (o Options) withDefaults() (Options, error) {
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.PushMaxBytes == 0 {
		o.PushMaxBytes = min(DefaultPushMaxBytes, o.MaxBytes)
	}
	if o.Blocks == 0 {
		o.Blocks, o.defaultBlocks = DefaultBlocks, true
	}
	if o.PushBlocks == 0 {
		o.PushBlocks, o.defaultPushBlocks = DefaultPushBlocks, true
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxSlots == 0 {
		o.MaxSlots = DefaultMaxSlots
	}
	algoFrom := "Options.Algorithm"
	if o.Algorithm == Auto {
		if env := os.Getenv("GOCCL_ALGO"); env != "" && env != "auto" {
			a, err := ParseAlgorithm(env)
			if err != nil {
				return o, fmt.Errorf("%w: GOCCL_ALGO: %v", ErrInvalidArgument, err)
			}
			o.Algorithm, algoFrom = a, "GOCCL_ALGO="+env
		}
	}
	switch {
	case o.MaxBytes < 16 || o.MaxBytes%16 != 0:
		return o, fmt.Errorf("%w: MaxBytes %d must be a positive multiple of 16", ErrInvalidArgument, o.MaxBytes)
	case o.MaxBytes > maxKernelBytes:
		// the kernels count 16-byte vectors in 32 bits
		return o, fmt.Errorf("%w: MaxBytes %d is more than goccl's kernels address (%d): calls that large belong to NCCL", ErrInvalidArgument, o.MaxBytes, int64(maxKernelBytes))
	case o.PushMaxBytes < 16 || o.PushMaxBytes%16 != 0 || o.PushMaxBytes > o.MaxBytes:
		return o, fmt.Errorf("%w: PushMaxBytes %d must be a multiple of 16 in [16, MaxBytes]", ErrInvalidArgument, o.PushMaxBytes)
	case o.Blocks < 1 || o.Blocks > ptx.MaxBlocks:
		return o, fmt.Errorf("%w: Blocks %d must be in [1, %d]", ErrInvalidArgument, o.Blocks, ptx.MaxBlocks)
	case o.PushBlocks < 1 || o.PushBlocks > ptx.MaxBlocks:
		return o, fmt.Errorf("%w: PushBlocks %d must be in [1, %d]", ErrInvalidArgument, o.PushBlocks, ptx.MaxBlocks)
	case o.ThreadsPerBlock != 0 && (o.ThreadsPerBlock < MinThreadsPerBlock || o.ThreadsPerBlock > ptx.ThreadsPerBlock || o.ThreadsPerBlock%32 != 0):
		return o, fmt.Errorf("%w: ThreadsPerBlock %d must be 0 (automatic) or a multiple of 32 in [%d, %d]", ErrInvalidArgument, o.ThreadsPerBlock, MinThreadsPerBlock, ptx.ThreadsPerBlock)
	case o.Algorithm != Auto && o.Algorithm != OneShot && o.Algorithm != TwoShot && o.Algorithm != Push && o.Algorithm != NCCL:
		return o, fmt.Errorf("%w: unknown algorithm %d", ErrInvalidArgument, int(o.Algorithm))
	case o.Algorithm == NCCL && o.NCCL == NCCLOff:
		return o, fmt.Errorf("%w: %s picks NCCL, but Options.NCCL is NCCLOff: allow NCCL or pick a kernel", ErrInvalidArgument, algoFrom)
	case o.NCCL < NCCLAuto || o.NCCL > NCCLAlways:
		return o, fmt.Errorf("%w: unknown NCCL mode %d: use NCCLAuto, NCCLOff or NCCLAlways", ErrInvalidArgument, int(o.NCCL))
	case o.IPC != memory.LegacyIPC && o.IPC != memory.VMM:
		return o, fmt.Errorf("%w: unknown IPC kind %d", ErrInvalidArgument, int(o.IPC))
	case o.MaxSlots < 2 || o.MaxSlots > MaxSlotsLimit:
		return o, fmt.Errorf("%w: MaxSlots %d must be in [2, %d]", ErrInvalidArgument, o.MaxSlots, MaxSlotsLimit)
	}
	return o, nil
}

// maxKernelBytes is the largest message a kernel's 32-bit count of 16-byte vectors reaches.
const maxKernelBytes = 16 * math.MaxUint32

// timeoutNanos is the kernel's watchdog parameter: 0 means wait forever.
func (o Options) timeoutNanos() uint64 {
	if o.Timeout < 0 {
		return 0
	}
	return uint64(o.Timeout)
}
