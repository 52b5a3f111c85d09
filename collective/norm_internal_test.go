package collective

import (
	"math"

	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/ptx"
)

// TestResidualRMSNormRefusals: the single-rank call checks its arguments as the fused call
// does, before any driver call (a bare Comm has no context: a call that got as far as the
// pointer check would fail otherwise), and MaxBytes does not bound it.
func TestResidualRMSNormRefusals(t *testing.T) {
	o, err := Options{MaxBytes: 1 << 20}.withDefaults()
	require.NoError(t, err)
	c := &Comm{opts: o}
	const p, h, rows = 0x7f0000000000, 4096, 4
	const n = rows * h * 2
	good := FusedArgs{In: p, Residual: p + n, ResidualOut: p + n, NormOut: p + 2*n, Gamma: p + 3*n,
		Rows: rows, Hidden: h, Eps: 1e-6, DType: BFloat16}
	with := func(f func(a *FusedArgs)) FusedArgs { a := good; f(&a); return a }
	// spread places the buffers 1 GiB apart, for shapes larger than good's.
	spread := func(a FusedArgs) FusedArgs {
		a.In, a.Residual, a.ResidualOut, a.NormOut, a.Gamma = p, p+1<<30, p+1<<30, p+2<<30, p+3<<30
		return a
	}
	for name, tc := range map[string]struct {
		a    FusedArgs
		want string
	}{
		"hidden not a multiple of 8": {with(func(a *FusedArgs) { a.Hidden = 4100 }), "hidden size 4100"},
		"no rows":                    {with(func(a *FusedArgs) { a.Rows = 0 }), "0 rows"},
		"eps negative":               {with(func(a *FusedArgs) { a.Eps = -1 }), "eps"},
		"nil In":                     {with(func(a *FusedArgs) { a.In = 0 }), "nil In"},
		"misaligned Gamma":           {with(func(a *FusedArgs) { a.Gamma += 8 }), "Gamma"},
		"NormOut over Residual":      {with(func(a *FusedArgs) { a.NormOut = p + n + 16 }), "NormOut"},
		"ResidualOut shifted":        {with(func(a *FusedArgs) { a.ResidualOut = p + n + 16 }), "overlap without being equal"},
	} {
		err := c.ResidualRMSNorm(nil, tc.a)
		assert.ErrorIs(t, err, ErrInvalidArgument, name)
		assert.ErrorContains(t, err, tc.want, name)
	}
	for name, a := range map[string]FusedArgs{
		"good":                 good,
		"In is ResidualOut":    with(func(a *FusedArgs) { a.ResidualOut, a.Residual = p, p+4*n }),
		"NoNorm ignores both":  with(func(a *FusedArgs) { a.NoNorm, a.NormOut, a.Gamma = true, 0, 0 }),
		"past MaxBytes":        spread(with(func(a *FusedArgs) { a.Rows, a.Hidden = 1024, 16384 })),
		"f32 at the max width": spread(with(func(a *FusedArgs) { a.Rows, a.Hidden, a.DType = 1, ptx.MaxHidden, Float32 })),
	} {
		assert.ErrorContains(t, c.ResidualRMSNorm(nil, a), "nil stream", name)
	}

	assert.ErrorIs(t, (&Comm{closed: true}).ResidualRMSNorm(nil, good), ErrClosed)
	failed := &Comm{failed: &KernelError{Code: ptx.ErrCodeTimeout, Rank: 1, Peer: 2}}
	assert.ErrorIs(t, failed.ResidualRMSNorm(nil, good), ErrUnusable, "a failed communicator refuses before the arguments")
}

// TestNormKernelWithoutKernels: a communicator that NCCL alone serves has no kernel set;
// the call says why instead of dereferencing it.
func TestNormKernelWithoutKernels(t *testing.T) {
	c := &Comm{noCustomWhy: "they take 2 to 16 ranks, not 1"}
	_, err := c.normKernel(BFloat16)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "not 1")
}

// TestFusedSelected answers as the fused call routes: the table, the forced algorithms (Push
// as Auto past PushMaxBytes), and the refusals of routeFused.
func TestFusedSelected(t *testing.T) {
	newComm := func(algo Algorithm, custom bool) *Comm {
		o, err := Options{MaxBytes: 1 << 20, Algorithm: algo}.withDefaults()
		require.NoError(t, err)
		c := &Comm{opts: o, size: 8, major: 9, custom: custom, noCustomWhy: "one rank"}
		c.layout = newArenaLayout(o, c.size)
		return c
	}
	c := newComm(Auto, true)
	for _, tc := range []struct {
		rows   int
		shared bool
		want   Algorithm
	}{
		{1, false, OneShot}, // 16 KiB over 8 ranks: the selection takes no push
		{7, true, OneShot},  // fewer rows than ranks
		{8, false, OneShot},
		{64, false, OneShot}, // 1 MiB over 8 ranks, through tmp: fewer than 9 rows a rank
		{64, true, TwoShot},  // direct
	} {
		got, err := c.FusedSelected(tc.rows, 8192, BFloat16, tc.shared)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "%d rows, shared %v", tc.rows, tc.shared)
		want, err := c.routeFused(Auto, FusedArgs{Rows: tc.rows, Hidden: 8192, DType: BFloat16}, int64(tc.rows)*8192*2, tc.shared, tc.shared)
		require.NoError(t, err)
		assert.Equal(t, want, got, "the call's own routing")
	}
	got, err := newComm(Push, true).FusedSelected(64, 8192, BFloat16, true)
	require.NoError(t, err)
	assert.Equal(t, TwoShot, got, "a communicator forced to Push selects as Auto")
	got, err = newComm(OneShot, true).FusedSelected(64, 8192, BFloat16, false)
	require.NoError(t, err)
	assert.Equal(t, OneShot, got)

	_, err = c.FusedSelected(65, 8192, BFloat16, false)
	assert.ErrorContains(t, err, "more than MaxBytes")
	_, err = newComm(Auto, false).FusedSelected(1, 8192, BFloat16, false)
	assert.ErrorContains(t, err, "one rank")
	for _, bad := range [][2]int{{0, 8192}, {1, 0}} {
		_, err = c.FusedSelected(bad[0], bad[1], BFloat16, false)
		assert.ErrorIs(t, err, ErrInvalidArgument)
	}
	_, err = c.FusedSelected(1, 8192, 0, false)
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

// TestFusedSelectedHugeShapes: shapes whose bytes do not fit an int64 are refused, never
// answered with a kernel for the few bytes their wrapped product leaves, with NCCL or without.
func TestFusedSelectedHugeShapes(t *testing.T) {
	o, err := Options{MaxBytes: 1 << 20}.withDefaults()
	require.NoError(t, err)
	c := &Comm{opts: o, size: 8, major: 9, custom: true, ncclWhy: "no libnccl"}
	c.layout = newArenaLayout(o, c.size)
	for _, shape := range [][2]int{{1 << 40, 1 << 23}, {1 << 62, 8192}, {1, math.MaxInt}, {math.MaxInt, 2}} {
		got, err := c.FusedSelected(shape[0], shape[1], BFloat16, false)
		assert.ErrorIs(t, err, ErrInvalidArgument, "%d rows of %d elements: got %v", shape[0], shape[1], got)
		assert.ErrorContains(t, err, "int64", "%d rows of %d elements", shape[0], shape[1])
	}
	// a shape that fits, past MaxBytes: still the route's own refusal
	_, err = c.FusedSelected(1<<20, 8192, BFloat16, false)
	assert.ErrorContains(t, err, "more than MaxBytes")
}
