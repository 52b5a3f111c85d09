package collective

import (
	"fmt"
	"os"
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

// Algorithm names an all-reduce algorithm; Auto lets the selection table choose.
type Algorithm = ptx.Algorithm

// Algorithms. OneShot reads every rank's input and reduces (two barriers); TwoShot does a
// reduce-scatter then an all-gather (more bandwidth, one more hop); Push writes the input into
// every rank's receive buffer and needs no barrier and no registered input (small messages).
const (
	Auto    Algorithm = 0
	OneShot           = ptx.OneShot
	TwoShot           = ptx.TwoShot
	Push              = ptx.Push
)

// Defaults of Options.
const (
	DefaultMaxBytes     = 8 << 20
	DefaultPushMaxBytes = 512 << 10
	DefaultBlocks       = 36
	DefaultPushBlocks   = 16
	DefaultTimeout      = 10 * time.Second
	DefaultMaxSlots     = 4096
)

// Options configure a communicator. The zero value is ready to use. All ranks of one
// communicator must pass the same options.
type Options struct {
	// MaxBytes is the largest all-reduce in bytes (default DefaultMaxBytes), a multiple of 16.
	// Each rank holds about 2*MaxBytes of staging memory.
	MaxBytes int64
	// PushMaxBytes is the largest all-reduce the Push algorithm takes (default
	// DefaultPushMaxBytes). Each rank holds ptx.PushParts(world size) * world size * PushMaxBytes
	// of receive buffers (2 or 3 parts).
	PushMaxBytes int64
	// Algorithm forces one algorithm for every call (default Auto: the selection table, or
	// the GOCCL_ALGO environment variable: oneshot, twoshot or push).
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
	// (default DefaultTimeout; negative: wait forever).
	Timeout time.Duration
	// IPC selects how memory is shared between processes (default memory.LegacyIPC).
	IPC memory.Kind
	// MaxSlots bounds the registration table: one slot per registered buffer and per
	// all-reduce captured in a graph (default DefaultMaxSlots).
	MaxSlots int
	// DisablePDL turns off programmatic dependent launch on sm_90 and later.
	DisablePDL bool
	// SystemScope keeps the system-scope barriers of OneShot and TwoShot (round-number
	// flags, release/acquire at system scope) when every rank runs on one GPU, where the
	// default GPU-scope kernels (counted arrivals, GPU-scope release/acquire: ptx.ScopeGPU)
	// are enough and cheaper. Both are correct there. It exists for tests and benchmarks that
	// measure the barriers ranks on several GPUs use; services leave it false.
	SystemScope bool
	// AllowNonNVLink lets NewGroup build a communicator over more than two GPUs that are not
	// all linked by NVLink (correct, but usually slower than NCCL there).
	AllowNonNVLink bool
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
		o.Blocks = DefaultBlocks
	}
	if o.PushBlocks == 0 {
		o.PushBlocks = DefaultPushBlocks
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxSlots == 0 {
		o.MaxSlots = DefaultMaxSlots
	}
	if o.Algorithm == Auto {
		if env := os.Getenv("GOCCL_ALGO"); env != "" && env != "auto" {
			a, err := ptx.ParseAlgorithm(env)
			if err != nil {
				return o, fmt.Errorf("%w: GOCCL_ALGO: %v", ErrInvalidArgument, err)
			}
			o.Algorithm = a
		}
	}
	switch {
	case o.MaxBytes < 16 || o.MaxBytes%16 != 0:
		return o, fmt.Errorf("%w: MaxBytes %d must be a positive multiple of 16", ErrInvalidArgument, o.MaxBytes)
	case o.PushMaxBytes < 16 || o.PushMaxBytes%16 != 0 || o.PushMaxBytes > o.MaxBytes:
		return o, fmt.Errorf("%w: PushMaxBytes %d must be a multiple of 16 in [16, MaxBytes]", ErrInvalidArgument, o.PushMaxBytes)
	case o.Blocks < 1 || o.Blocks > ptx.MaxBlocks:
		return o, fmt.Errorf("%w: Blocks %d must be in [1, %d]", ErrInvalidArgument, o.Blocks, ptx.MaxBlocks)
	case o.PushBlocks < 1 || o.PushBlocks > ptx.MaxBlocks:
		return o, fmt.Errorf("%w: PushBlocks %d must be in [1, %d]", ErrInvalidArgument, o.PushBlocks, ptx.MaxBlocks)
	case o.ThreadsPerBlock != 0 && (o.ThreadsPerBlock < MinThreadsPerBlock || o.ThreadsPerBlock > ptx.ThreadsPerBlock || o.ThreadsPerBlock%32 != 0):
		return o, fmt.Errorf("%w: ThreadsPerBlock %d must be 0 (automatic) or a multiple of 32 in [%d, %d]", ErrInvalidArgument, o.ThreadsPerBlock, MinThreadsPerBlock, ptx.ThreadsPerBlock)
	case o.Algorithm != Auto && o.Algorithm != OneShot && o.Algorithm != TwoShot && o.Algorithm != Push:
		return o, fmt.Errorf("%w: unknown algorithm %d", ErrInvalidArgument, int(o.Algorithm))
	case o.IPC != memory.LegacyIPC && o.IPC != memory.VMM:
		return o, fmt.Errorf("%w: unknown IPC kind %d", ErrInvalidArgument, int(o.IPC))
	case o.MaxSlots < 2:
		return o, fmt.Errorf("%w: MaxSlots %d must be at least 2", ErrInvalidArgument, o.MaxSlots)
	}
	return o, nil
}

// timeoutNanos is the kernel's watchdog parameter: 0 means wait forever.
func (o Options) timeoutNanos() uint64 {
	if o.Timeout < 0 {
		return 0
	}
	return uint64(o.Timeout)
}
