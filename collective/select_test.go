package collective

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/ptx"
)

func TestSelectAlgorithm(t *testing.T) {
	cases := []struct {
		major, ws int
		bytes     int64
		direct    bool
		want      Algorithm
	}{
		{9, 8, 1 << 10, false, Push},
		{9, 8, 16 << 10, false, Push},
		{9, 8, 16<<10 + 16, false, OneShot},
		{9, 8, 256 << 10, false, OneShot},
		{9, 8, 256<<10 + 16, false, TwoShot},
		{9, 8, 256<<10 + 16, true, TwoShot},
		{9, 8, 8 << 20, false, TwoShot},
		{9, 2, 64 << 10, false, Push},
		{9, 2, 64<<10 + 16, false, OneShot},
		{9, 2, 8 << 20, false, OneShot},
		{9, 2, 2 << 20, true, OneShot},
		{9, 2, 2<<20 + 16, true, TwoShot}, // writing straight into the outputs wins earlier
		{9, 4, 64 << 10, false, Push},
		{9, 4, 512 << 10, false, OneShot},
		{9, 4, 1 << 20, false, OneShot},
		{9, 4, 2 << 20, false, TwoShot},
		{9, 4, 2 << 20, true, OneShot},
		{9, 4, 2<<20 + 16, true, TwoShot},
		{9, 16, 16 << 10, false, Push},
		{9, 16, 32 << 10, false, OneShot},
		{9, 16, 256 << 10, false, TwoShot},
		{8, 8, 256 << 10, false, TwoShot}, // Ampere switches earlier
		{8, 8, 128 << 10, false, OneShot},
	}
	for _, c := range cases {
		got := selectAlgorithm(c.major, c.ws, c.bytes, DefaultPushMaxBytes, c.direct, false)
		assert.Equal(t, c.want, got, "cc %d.x, ws %d, %d bytes, direct %v", c.major, c.ws, c.bytes, c.direct)
	}
	// Push never exceeds the communicator's receive slots.
	assert.Equal(t, OneShot, selectAlgorithm(9, 8, 16<<10, 8<<10, false, false))
	// GPU-scope barriers make the direct TwoShot cheaper: 8 ranks switch above 64 KiB.
	assert.Equal(t, OneShot, selectAlgorithm(9, 8, 64<<10, DefaultPushMaxBytes, true, true))
	assert.Equal(t, TwoShot, selectAlgorithm(9, 8, 64<<10+16, DefaultPushMaxBytes, true, true))
	assert.Equal(t, OneShot, selectAlgorithm(9, 8, 256<<10, DefaultPushMaxBytes, false, true))
	assert.Equal(t, OneShot, selectAlgorithm(9, 8, 256<<10, DefaultPushMaxBytes, true, false))
	// and 4 ranks above 512 KiB
	assert.Equal(t, OneShot, selectAlgorithm(9, 4, 512<<10, DefaultPushMaxBytes, true, true))
	assert.Equal(t, TwoShot, selectAlgorithm(9, 4, 512<<10+16, DefaultPushMaxBytes, true, true))
	assert.Equal(t, OneShot, selectAlgorithm(9, 4, 2<<20, DefaultPushMaxBytes, true, false))
}

// TestSelectedInPlace: an in-place call whose output the peers see takes the direct TwoShot
// where OneShot would serve it out of place; Push, TwoShot, a forced algorithm, a call the
// peers cannot write into and out-of-place calls keep their choice.
func TestSelectedInPlace(t *testing.T) {
	o, err := Options{}.withDefaults()
	require.NoError(t, err)
	c := &Comm{opts: o, size: 8, major: 9, custom: true, scope: ptx.ScopeGPU}
	for _, tc := range []struct {
		bytes int64
		kind  CallKind
		want  Algorithm
	}{
		{16 << 10, CallKind{SharedOutput: true, InPlace: true}, Push},
		{32 << 10, CallKind{SharedOutput: true, InPlace: true}, TwoShot},
		{32 << 10, CallKind{SharedOutput: true}, OneShot},
		{32 << 10, CallKind{InPlace: true}, OneShot}, // eager, not registered: staged either way
		{32 << 10, CallKind{Captured: true, InPlace: true}, TwoShot},
		{32 << 10, CallKind{Captured: true}, OneShot},
		{8 << 20, CallKind{SharedOutput: true, InPlace: true}, TwoShot},
	} {
		assert.Equal(t, tc.want, c.SelectedFor(tc.bytes, tc.kind), "%d bytes, %+v", tc.bytes, tc.kind)
		if !tc.kind.InPlace && !tc.kind.Captured {
			assert.Equal(t, tc.want, c.Selected(tc.bytes, tc.kind.SharedOutput), "Selected is SelectedFor out of place")
		}
	}
	algo, err := c.route(Auto, 32<<10, true, true)
	require.NoError(t, err)
	assert.Equal(t, TwoShot, algo, "AllReduce's route: in place, output shared")
	algo, err = c.route(OneShot, 32<<10, true, true)
	require.NoError(t, err)
	assert.Equal(t, OneShot, algo, "an algorithm the caller names is kept")
	c.opts.Algorithm = OneShot
	assert.Equal(t, OneShot, c.SelectedFor(32<<10, CallKind{SharedOutput: true, InPlace: true}), "Options.Algorithm wins")
}

func TestLaunchShape(t *testing.T) {
	shape := func(algo Algorithm, nvec, limit, fixed int) [2]int {
		b, th := launchShape(algo, nvec, 8, limit, 16, fixed)
		return [2]int{b, th}
	}
	// Pull kernels: 512-thread blocks, one vector per thread, at most limit.
	assert.Equal(t, [2]int{36, 512}, shape(OneShot, 1<<20, 36, 0))
	assert.Equal(t, [2]int{36, 512}, shape(OneShot, 36*512, 36, 0))
	assert.Equal(t, [2]int{16, 512}, shape(OneShot, 16384, 16, 0))
	assert.Equal(t, [2]int{1, 512}, shape(OneShot, 1, 36, 0))
	assert.Equal(t, [2]int{2, 512}, shape(OneShot, 513, 36, 0))
	// TwoShot sizes the grid by the largest shard (1000/8 + 1000%8 = 125 vectors); a shard
	// that fills at most half of limit in 512-thread blocks is spread over up to limit blocks
	// of at least 128 threads.
	assert.Equal(t, [2]int{1, 128}, shape(TwoShot, 1000, 36, 0))
	assert.Equal(t, [2]int{16, 128}, shape(TwoShot, 8*2048, 16, 0)) // 8 ranks, 256 KiB
	assert.Equal(t, [2]int{35, 256}, shape(TwoShot, 8*8800, 36, 0)) // 18 blocks of 512: spread
	assert.Equal(t, [2]int{19, 512}, shape(TwoShot, 8*9300, 36, 0)) // 19 blocks of 512: kept
	assert.Equal(t, [2]int{16, 512}, shape(TwoShot, 8*8192, 16, 0)) // 8 ranks, 1 MiB
	assert.Equal(t, [2]int{36, 512}, shape(TwoShot, 1<<20, 36, 0))
	// Push always uses the communicator's fixed grid; a small message gets smaller blocks
	// (at least 64 threads, a multiple of 32) so that it spreads over all of them.
	assert.Equal(t, [2]int{16, 64}, shape(Push, 1, 36, 0))
	assert.Equal(t, [2]int{16, 64}, shape(Push, 1024, 36, 0))
	assert.Equal(t, [2]int{16, 96}, shape(Push, 16*70, 36, 0)) // 70 a block rounds up to 96
	assert.Equal(t, [2]int{16, 512}, shape(Push, 16*512, 36, 0))
	assert.Equal(t, [2]int{16, 512}, shape(Push, 1<<20, 36, 0))
	// A fixed block size (Options.ThreadsPerBlock) is kept.
	assert.Equal(t, [2]int{2, 512}, shape(OneShot, 1024, 16, 512))
	assert.Equal(t, [2]int{16, 128}, shape(OneShot, 1<<20, 16, 128))
	assert.Equal(t, [2]int{16, 512}, shape(Push, 1, 36, 512))
	// Every shape is a legal launch: at least one block, a whole number of warps, enough
	// threads for the barrier's lanes.
	for nvec := 1; nvec < 1<<16; nvec = nvec*3 + 1 {
		for _, algo := range []Algorithm{OneShot, TwoShot, Push} {
			b, th := launchShape(algo, nvec, ptx.MaxRanks, 36, 16, 0)
			assert.True(t, b >= 1 && b <= 36 && th%32 == 0 && th >= ptx.MaxRanks && th <= ptx.ThreadsPerBlock, "%v %d: %d x %d", algo, nvec, b, th)
		}
	}
}

func TestBlockCap(t *testing.T) {
	assert.Equal(t, 36, blockCap(36, 132, 2, 1), "one rank per GPU: no cap")
	assert.Equal(t, 33, blockCap(36, 132, 4, 16), "16 virtual ranks: 132*4/16")
	assert.Equal(t, 16, blockCap(36, 132, 2, 16))
	assert.Equal(t, 1, blockCap(36, 4, 1, 16), "never zero")
}

func TestOptionsDefaultsAndValidation(t *testing.T) {
	t.Setenv("GOCCL_ALGO", "")
	o, err := Options{}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, int64(DefaultMaxBytes), o.MaxBytes)
	assert.Equal(t, int64(DefaultPushMaxBytes), o.PushMaxBytes)
	assert.Equal(t, DefaultBlocks, o.Blocks)
	assert.Equal(t, Auto, o.Algorithm)
	assert.Equal(t, uint64(DefaultTimeout), o.timeoutNanos())

	small, err := Options{MaxBytes: 4096}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, int64(4096), small.PushMaxBytes, "push slots never exceed MaxBytes")

	never, err := Options{Timeout: -1}.withDefaults()
	require.NoError(t, err)
	assert.Zero(t, never.timeoutNanos(), "negative timeout: the kernel waits forever")

	for _, bad := range []Options{
		{MaxBytes: 100},
		{MaxBytes: 16 << 32},
		{MaxBytes: 4096, PushMaxBytes: 8192},
		{Blocks: ptx.MaxBlocks + 1},
		{PushBlocks: -1},
		{ThreadsPerBlock: 32},
		{ThreadsPerBlock: 100},
		{ThreadsPerBlock: 1024},
		{Algorithm: 42},
		{MaxSlots: 1},
		{MaxSlots: MaxSlotsLimit + 1},
		{MaxSlots: 1<<57 + 1}, // its table's byte size would wrap to 128 bytes
	} {
		_, err := bad.withDefaults()
		assert.ErrorIs(t, err, ErrInvalidArgument, "%+v", bad)
	}

	t.Setenv("GOCCL_ALGO", "twoshot")
	o, err = Options{}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, TwoShot, o.Algorithm)
	o, err = Options{Algorithm: Push}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, Push, o.Algorithm, "an explicit option wins over GOCCL_ALGO")
	t.Setenv("GOCCL_ALGO", "nccl")
	_, err = Options{NCCL: NCCLOff}.withDefaults()
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "GOCCL_ALGO=nccl picks NCCL, but Options.NCCL is NCCLOff", "the message names where NCCL came from")
	t.Setenv("GOCCL_ALGO", "fastest")
	_, err = Options{}.withDefaults()
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "GOCCL_ALGO")
}

func TestArenaLayout(t *testing.T) {
	o, err := Options{}.withDefaults()
	require.NoError(t, err)
	for ws := 2; ws <= ptx.MaxRanks; ws++ {
		l := newArenaLayout(o, ws)
		maxVec := uint64(o.MaxBytes) / 16
		largest := maxVec/uint64(ws) + maxVec%uint64(ws)
		assert.Equal(t, uint64(ptx.SignalBytes), l.staging)
		assert.GreaterOrEqual(t, l.tmp-l.staging, uint64(o.MaxBytes), "staging holds a whole input")
		assert.GreaterOrEqual(t, l.recv-l.tmp, 16*largest, "tmp holds the largest two-shot shard")
		assert.Equal(t, l.recv+uint64(ptx.PushParts(ws)*ws)*uint64(ptx.PushSlotBytes(o.PushMaxBytes)), l.total, "PushParts parts (calls) of ws receive slots")
		assert.GreaterOrEqual(t, l.recvSlot, uint64(o.PushMaxBytes), "a receive slot holds the largest push message")
		assert.Zero(t, l.tmp%16)
		assert.Zero(t, l.recv%16)
	}
}

// TestContextHint: a context refused for MPS's limits or memory, with more hardware queues
// asked for than CUDA's default, says to unset CUDA_DEVICE_MAX_CONNECTIONS in one-rank
// processes; any other refusal or setting adds nothing.
func TestContextHint(t *testing.T) {
	connections := &driver.Error{Op: "cuDevicePrimaryCtxRetain", Code: 809}
	memory := &driver.Error{Op: "cuDevicePrimaryCtxRetain", Code: 2}
	other := &driver.Error{Op: "cuDevicePrimaryCtxRetain", Code: 999}
	t.Setenv(MaxConnectionsEnv, "32")
	for _, err := range []error{connections, memory} {
		hint := contextHint(err)
		assert.Contains(t, hint, MaxConnectionsEnv+"=32 here: under MPS")
		assert.Contains(t, hint, "unset it")
	}
	assert.Empty(t, contextHint(other))
	for _, v := range []string{"8", "4", "many", ""} {
		t.Setenv(MaxConnectionsEnv, v)
		assert.Empty(t, contextHint(connections), "%s=%q", MaxConnectionsEnv, v)
	}
}

func TestKernelErrorMessages(t *testing.T) {
	e := &KernelError{Code: ptx.ErrCodeTimeout, Rank: 2, Block: 5, Peer: 7, Phase: ptx.PhaseEntry}
	assert.ErrorIs(t, e, ErrTimeout)
	assert.ErrorIs(t, e, ErrUnusable)
	assert.NotErrorIs(t, e, ErrUnfilledSlot)
	assert.Contains(t, e.Error(), "rank 2 timed out in the entry barrier waiting for rank 7")
	assert.NotContains(t, e.Error(), MaxConnectionsEnv)
	e.SharedGPU = true
	assert.Contains(t, e.Error(), MaxConnectionsEnv+"=")

	u := &KernelError{Code: ptx.ErrCodeUnfilledSlot, Rank: 1, Peer: 3}
	assert.ErrorIs(t, u, ErrUnfilledSlot)
	assert.NotErrorIs(t, u, ErrTimeout)
	assert.Contains(t, u.Error(), "replayed before Capture")

	m := &KernelError{Code: ptx.ErrCodeMismatch, Rank: 0, Peer: 1, Phase: ptx.PhaseEntry,
		Mine:   ptx.Call{Op: ptx.OpAllReduce, Algo: ptx.TwoShot, DType: BFloat16, Count: 1024},
		Theirs: ptx.Call{Op: ptx.OpAllReduce, Algo: ptx.TwoShot, DType: BFloat16, Count: 2048}}
	assert.ErrorIs(t, m, ErrCallMismatch)
	assert.ErrorIs(t, m, ErrUnusable)
	assert.NotErrorIs(t, m, ErrTimeout)
	assert.Contains(t, m.Error(), "rank 0 issued "+m.Mine.String())
	assert.Contains(t, m.Error(), "rank 1 issued "+m.Theirs.String())
	assert.Contains(t, m.Error(), "1024")
	assert.Contains(t, m.Error(), "2048")
}

func TestRankInfoRoundTrip(t *testing.T) {
	in := rankInfo{rankFacts: rankFacts{PID: 42, Process: 0xfeedface12345678, Device: 3, UUID: [16]byte{1, 2, 3}, SMs: 132, BlocksPerSM: 2, Major: 9,
		Blocks: 36, PushBlocks: 16, MaxBytes: 8 << 20, PushMaxBytes: 512 << 10, Algorithm: int64(TwoShot), SystemScope: 1}}
	in.Arena.PID, in.Arena.Process, in.Arena.Ptr, in.Arena.Size, in.Arena.Handle[63] = 42, 0xfeedface12345678, 0x7f0000000000, 1<<20, 9
	b, err := in.marshal()
	require.NoError(t, err)
	out, err := unmarshalRankInfo(b)
	require.NoError(t, err)
	assert.Equal(t, in, out)
	_, err = unmarshalRankInfo(b[:20])
	assert.ErrorContains(t, err, "malformed rank info")
}

// TestAgree: ranks must share the options that shape the kernels' shared state, the scope
// (which picks the barrier protocol) included.
func TestAgree(t *testing.T) {
	infos := make([]rankInfo, 3)
	for r := range infos {
		infos[r].rankFacts = rankFacts{Blocks: 16, PushBlocks: 16, MaxBytes: 1 << 20, PushMaxBytes: 64 << 10}
	}
	require.NoError(t, agree(infos, 1))
	infos[2].SystemScope = 1
	err := agree(infos, 1)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "rank 2 was created with different options")
	assert.ErrorContains(t, err, "SystemScope")
	infos[2].SystemScope = 0
	infos[0].FlagBarriers = 1
	err = agree(infos, 1)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "rank 0 was created with different options")
	assert.ErrorContains(t, err, "FlagBarriers")
}

func TestCheckParams(t *testing.T) {
	for ws := 2; ws <= ptx.MaxRanks; ws++ {
		require.NoError(t, checkParams(ws), "ws %d", ws)
	}
}

func TestValidate(t *testing.T) {
	o, err := Options{MaxBytes: 1 << 20}.withDefaults()
	require.NoError(t, err)
	c := &Comm{opts: o}
	const p = 0x7f0000000000
	cases := []struct {
		name     string
		dst, src uintptr
		count    int
		dt       DType
		want     string
	}{
		{"dtype", p, p, 8, 0, "unsupported element type"},
		{"count", p, p, 0, BFloat16, "count 0"},
		{"negative", p, p, -8, BFloat16, "count -8"},
		// count*2 wraps an int64 to a small size: refused, not reduced as 0 bytes
		{"overflow", p, p, 1 << 62, BFloat16, "more bytes than an int64 holds"},
		{"overflow f32", p, p, 1<<62 + 1<<61, Float32, "more bytes than an int64 holds"},
		{"partial overlap", p + 16, p, 64, BFloat16, "overlap without being equal"},
		{"partial overlap below", p, p + 8192, 1 << 17, BFloat16, "overlap without being equal"},
		{"wraps", 0xFFFFFFFFFFFFFF00, p, 1 << 10, Float32, "wraps around the address space"},
		{"nil src", p, 0, 8, BFloat16, "nil buffer"},
		{"nil dst", 0, p, 8, Float32, "nil buffer"},
		{"misaligned", p + 8, p, 8, BFloat16, "16-byte aligned"},
		{"nil stream", p, p, 8, Float16, "nil stream"},
	}
	for _, tc := range cases {
		_, err := c.validate(nil, driverPtr(tc.dst), driverPtr(tc.src), tc.count, tc.dt)
		assert.ErrorIs(t, err, ErrInvalidArgument, tc.name)
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
	// A Stream that no driver call made has no context: refused, not dereferenced.
	_, err = c.validate(&driver.Stream{}, driverPtr(p), driverPtr(p), 8, BFloat16)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "the stream is closed, or was not made by driver.NewStream or driver.WrapStream")
}

func TestClosedAndFailedCommRefuseWork(t *testing.T) {
	c := &Comm{closed: true}
	assert.ErrorIs(t, c.AllReduce(nil, 16, 16, 8, BFloat16), ErrClosed)
	assert.ErrorIs(t, c.Err(), ErrClosed)
	assert.NoError(t, c.Close())
	assert.NoError(t, c.Close(), "Close after a Close that returned nil")

	failed := &Comm{failed: &KernelError{Code: ptx.ErrCodeTimeout, Rank: 1, Peer: 2}}
	err := failed.AllReduce(nil, 16, 16, 8, BFloat16)
	assert.ErrorIs(t, err, ErrTimeout, "a failed communicator refuses work before looking at the arguments")
	assert.ErrorIs(t, err, ErrUnusable)
}

// TestNilHandles: the methods of a nil *Comm (a New that failed, then a deferred Close) and of
// nil or zero graphs and registrations return errors, or nothing to do, instead of panicking.
func TestNilHandles(t *testing.T) {
	var c *Comm
	assert.NoError(t, c.Close(), "Close of a nil *Comm does nothing, as a second Close does")
	assert.ErrorIs(t, c.Err(), ErrClosed)
	assert.ErrorContains(t, c.Err(), "nil *Comm")
	assert.ErrorIs(t, c.AllReduce(nil, 16, 16, 8, BFloat16), ErrClosed)
	assert.ErrorIs(t, c.AllReduceWith(nil, 16, 16, 8, BFloat16, OneShot), ErrClosed)
	assert.ErrorIs(t, c.AllReduceResidualRMSNorm(nil, FusedArgs{}), ErrClosed)
	assert.ErrorIs(t, c.ResidualRMSNorm(nil, FusedArgs{}), ErrClosed)
	assert.ErrorIs(t, c.LoadFused(BFloat16), ErrClosed)
	_, err := c.FusedSelected(1, 8192, BFloat16, false)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = c.Register(context.Background(), 16, 16)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = c.Capture(context.Background(), nil, func() error { return nil })
	assert.ErrorIs(t, err, ErrClosed)
	_, err = c.TuneTarget(context.Background())
	assert.ErrorIs(t, err, ErrClosed)

	for _, g := range []*Graph{nil, {}} {
		assert.NoError(t, g.Close())
		assert.ErrorIs(t, g.Launch(nil), ErrClosed)
		assert.Nil(t, g.Exec())
	}
	for _, r := range []*Registration{nil, {}} {
		assert.NoError(t, r.Release())
	}
}

func driverPtr(p uintptr) driver.DevicePtr { return driver.DevicePtr(p) }

// TestRoute: each call goes to the engine that can take it, and a call that none can take says
// what is missing.
func TestRoute(t *testing.T) {
	o, err := Options{MaxBytes: 1 << 20}.withDefaults()
	require.NoError(t, err)
	kernelsOnly := &Comm{opts: o, size: 2, major: 9, custom: true, ncclWhy: "libnccl.so.2 not found"}
	algo, err := kernelsOnly.route(Auto, 1<<20, false, false)
	require.NoError(t, err)
	assert.NotEqual(t, NCCL, algo)
	_, err = kernelsOnly.route(Auto, 1<<20+16, false, false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "more than MaxBytes")
	assert.ErrorContains(t, err, "libnccl.so.2 not found", "says why NCCL cannot take it")
	_, err = kernelsOnly.route(NCCL, 16, false, false)
	assert.ErrorContains(t, err, "needs NCCL")
	_, err = kernelsOnly.route(Push, o.PushMaxBytes+16, false, false)
	assert.ErrorContains(t, err, "PushMaxBytes")

	both := &Comm{opts: o, size: 2, major: 9, custom: true, nccl: &ncclEngine{}}
	for _, tc := range []struct {
		bytes int64
		want  Algorithm
	}{{1 << 20, Algorithm(selectAlgorithm(9, 2, 1<<20, o.PushMaxBytes, false, false))}, {1<<20 + 16, NCCL}, {1 << 30, NCCL}} {
		algo, err := both.route(Auto, tc.bytes, false, false)
		require.NoError(t, err)
		assert.Equal(t, tc.want, algo, "%d bytes", tc.bytes)
		assert.Equal(t, tc.want, both.selected(tc.bytes, false))
	}

	ncclOnly := &Comm{opts: o, size: 2, nccl: &ncclEngine{}, noCustomWhy: "rank 1 runs on another host than rank 0"}
	algo, err = ncclOnly.route(Auto, 64, false, false)
	require.NoError(t, err)
	assert.Equal(t, NCCL, algo)
	_, err = ncclOnly.route(OneShot, 64, false, false)
	assert.ErrorContains(t, err, "another host")
	assert.ErrorContains(t, err, "use Auto or NCCL", "NCCL is there: the way out is NCCL, not installing it")

	_, err = both.route(OneShot, 1<<20+16, false, false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "more than MaxBytes (1048576): raise Options.MaxBytes, or use Auto or NCCL, which takes it")
}

func TestParseAlgorithm(t *testing.T) {
	for _, a := range append([]Algorithm{Auto, NCCL}, Algorithms...) {
		got, err := ParseAlgorithm(strings.ToUpper(a.String()))
		require.NoError(t, err)
		assert.Equal(t, a, got)
	}
	_, err := ParseAlgorithm("ring")
	assert.ErrorContains(t, err, "use auto, oneshot, twoshot, push or nccl")
	_, err = Options{Algorithm: NCCL, NCCL: NCCLOff}.withDefaults()
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

// TestRegisterWithoutKernels: a communicator that NCCL alone serves has no registration
// table; Register says so on every rank alike, without an exchange.
func TestRegisterWithoutKernels(t *testing.T) {
	c := &Comm{noCustomWhy: "rank 1 runs on another host than rank 0", nccl: &ncclEngine{}}
	_, err := c.Register(context.Background(), 0x7f0000000000, 4096)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "another host")
	assert.Equal(t, Engines{NCCL: true, NoKernels: "rank 1 runs on another host than rank 0"}, c.Engines())
}
