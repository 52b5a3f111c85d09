package collective

import (
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
		want      Algorithm
	}{
		{9, 8, 1 << 10, Push},
		{9, 8, 64 << 10, Push},
		{9, 8, 64<<10 + 16, OneShot},
		{9, 8, 256 << 10, OneShot},
		{9, 8, 256<<10 + 16, TwoShot},
		{9, 8, 8 << 20, TwoShot},
		{9, 2, 8 << 20, OneShot},
		{9, 4, 512 << 10, OneShot},
		{9, 4, 1 << 20, OneShot},
		{9, 4, 2 << 20, TwoShot},
		{9, 16, 32 << 10, Push},
		{9, 16, 64 << 10, OneShot},
		{9, 16, 256 << 10, TwoShot},
		{8, 8, 256 << 10, TwoShot}, // Ampere switches earlier
		{8, 8, 128 << 10, OneShot},
	}
	for _, c := range cases {
		got := selectAlgorithm(c.major, c.ws, c.bytes, DefaultPushMaxBytes)
		assert.Equal(t, c.want, got, "cc %d.x, ws %d, %d bytes", c.major, c.ws, c.bytes)
	}
	// Push never exceeds the communicator's receive slots.
	assert.Equal(t, OneShot, selectAlgorithm(9, 8, 32<<10, 16<<10))
}

func TestGridBlocks(t *testing.T) {
	// One vector per thread until the limit.
	assert.Equal(t, 1, gridBlocks(OneShot, 1, 8, 36, 16))
	assert.Equal(t, 2, gridBlocks(OneShot, 513, 8, 36, 16))
	assert.Equal(t, 36, gridBlocks(OneShot, 1<<20, 8, 36, 16))
	// TwoShot sizes the grid by the largest shard: 1000/8 + 1000%8 = 125 vectors.
	assert.Equal(t, 1, gridBlocks(TwoShot, 1000, 8, 36, 16))
	assert.Equal(t, 3, gridBlocks(TwoShot, 8*1100, 8, 36, 16))
	// Push always uses the communicator's fixed grid.
	assert.Equal(t, 16, gridBlocks(Push, 1, 8, 36, 16))
	assert.Equal(t, 16, gridBlocks(Push, 1<<20, 8, 36, 16))
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
		{MaxBytes: 4096, PushMaxBytes: 8192},
		{Blocks: ptx.MaxBlocks + 1},
		{PushBlocks: -1},
		{Algorithm: 42},
		{MaxSlots: 1},
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
		assert.Equal(t, l.recv+2*uint64(ws)*uint64(o.PushMaxBytes), l.total, "two epochs of ws receive slots")
		assert.Zero(t, l.tmp%16)
		assert.Zero(t, l.recv%16)
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
}

func TestRankInfoRoundTrip(t *testing.T) {
	in := rankInfo{rankFacts: rankFacts{PID: 42, Device: 3, UUID: [16]byte{1, 2, 3}, SMs: 132, BlocksPerSM: 2, Major: 9,
		Blocks: 36, PushBlocks: 16, MaxBytes: 8 << 20, PushMaxBytes: 512 << 10, Algorithm: int64(TwoShot)}}
	in.Arena.PID, in.Arena.Ptr, in.Arena.Size, in.Arena.Handle[63] = 42, 0x7f0000000000, 1<<20, 9
	b, err := in.marshal()
	require.NoError(t, err)
	out, err := unmarshalRankInfo(b)
	require.NoError(t, err)
	assert.Equal(t, in, out)
	_, err = unmarshalRankInfo(b[:20])
	assert.ErrorContains(t, err, "malformed rank info")
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
		{"not 16 bytes", p, p, 7, BFloat16, "multiple of 16 bytes"},
		{"too big", p, p, 1<<19 + 8, BFloat16, "more than MaxBytes"},
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
}

func TestClosedAndFailedCommRefuseWork(t *testing.T) {
	c := &Comm{closed: true}
	assert.ErrorIs(t, c.AllReduce(nil, 16, 16, 8, BFloat16), ErrClosed)
	assert.ErrorIs(t, c.Err(), ErrClosed)
	assert.NoError(t, c.Close(), "Close is idempotent")

	failed := &Comm{failed: &KernelError{Code: ptx.ErrCodeTimeout, Rank: 1, Peer: 2}}
	err := failed.AllReduce(nil, 16, 16, 8, BFloat16)
	assert.ErrorIs(t, err, ErrTimeout, "a failed communicator refuses work before looking at the arguments")
	assert.ErrorIs(t, err, ErrUnusable)
}

func driverPtr(p uintptr) driver.DevicePtr { return driver.DevicePtr(p) }
