package collective

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/ptx"
)

// TestValidateFused refuses every bad fused call before any driver call: a bare Comm has no
// context, so a call that got as far as the pointer check would fail otherwise.
func TestValidateFused(t *testing.T) {
	o, err := Options{MaxBytes: 1 << 20}.withDefaults()
	require.NoError(t, err)
	c := &Comm{opts: o}
	const p, h, rows = 0x7f0000000000, 4096, 4
	const n = rows * h * 2 // bytes of each bf16 buffer
	good := FusedArgs{In: p, Residual: p + n, ResidualOut: p + n, NormOut: p + 2*n, Gamma: p + 3*n,
		Rows: rows, Hidden: h, Eps: 1e-6, DType: BFloat16}
	with := func(f func(a *FusedArgs)) FusedArgs { a := good; f(&a); return a }
	cases := []struct {
		name string
		a    FusedArgs
		want string
	}{
		{"good args reach the stream check", good, "nil stream"},
		{"dtype", with(func(a *FusedArgs) { a.DType = 0 }), "unsupported element type"},
		{"hidden not a multiple of 8", with(func(a *FusedArgs) { a.Hidden = 4100 }), "hidden size 4100"},
		{"hidden too small", with(func(a *FusedArgs) { a.Hidden = 1024 }), "hidden size 1024"},
		{"hidden too large", with(func(a *FusedArgs) { a.Hidden = 16392 }), "hidden size 16392"},
		{"no rows", with(func(a *FusedArgs) { a.Rows = 0 }), "0 rows"},
		{"negative rows", with(func(a *FusedArgs) { a.Rows = -1 }), "-1 rows"},
		{"rows past the fingerprint", with(func(a *FusedArgs) { a.Rows = ptx.MaxFusedRows }), "rows: must be in"},
		{"eps NaN", with(func(a *FusedArgs) { a.Eps = float32(math.NaN()) }), "eps"},
		{"eps negative", with(func(a *FusedArgs) { a.Eps = -1 }), "eps"},
		{"nil In", with(func(a *FusedArgs) { a.In = 0 }), "nil In"},
		{"nil NormOut", with(func(a *FusedArgs) { a.NormOut = 0 }), "nil NormOut"},
		{"nil Gamma", with(func(a *FusedArgs) { a.Gamma = 0 }), "nil Gamma"},
		{"misaligned Residual", with(func(a *FusedArgs) { a.Residual = p + n + 8 }), "Residual"},
		{"wraps", with(func(a *FusedArgs) { a.ResidualOut = 0xFFFFFFFFFFFFFF00 }), "wraps around the address space"},
		{"ResidualOut shifted over Residual", with(func(a *FusedArgs) { a.ResidualOut = p + n + 16 }), "overlap without being equal"},
		{"ResidualOut shifted over In", with(func(a *FusedArgs) { a.ResidualOut, a.Residual = p+16, p+4*n }), "overlap without being equal"},
		{"NormOut equal to ResidualOut", with(func(a *FusedArgs) { a.NormOut = p + n }), "NormOut"},
		{"NormOut over In", with(func(a *FusedArgs) { a.NormOut = p + n - 16 }), "NormOut"},
		{"Gamma inside ResidualOut", with(func(a *FusedArgs) { a.Gamma = p + n + 64 }), "Gamma"},
		{"Gamma inside NormOut", with(func(a *FusedArgs) { a.Gamma = p + 2*n + 64 }), "NormOut"},
	}
	for _, tc := range cases {
		_, err := c.validateFused(nil, tc.a)
		assert.ErrorIs(t, err, ErrInvalidArgument, tc.name)
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
	// Allowed aliasing reaches the stream check: In == ResidualOut, Gamma inside In, and with
	// NoNorm a NormOut and Gamma that are not looked at.
	for name, a := range map[string]FusedArgs{
		"In is ResidualOut":   with(func(a *FusedArgs) { a.ResidualOut, a.Residual = p, p+4*n }),
		"Gamma inside In":     with(func(a *FusedArgs) { a.Gamma = p + 64 }),
		"NoNorm ignores both": with(func(a *FusedArgs) { a.NoNorm, a.NormOut, a.Gamma = true, p+n, 0 }),
		"hidden 16384":        with(func(a *FusedArgs) { a.Hidden = 16384; a.Rows = 1 }),
		"f32 hidden 5120":     with(func(a *FusedArgs) { a.Hidden, a.DType, a.Rows = 5120, Float32, 1 }),
	} {
		_, err := c.validateFused(nil, a)
		assert.ErrorContains(t, err, "nil stream", name)
	}
}

// TestRouteFused: the size limits and the algorithms the fused call has.
func TestRouteFused(t *testing.T) {
	o, err := Options{MaxBytes: 1 << 20}.withDefaults()
	require.NoError(t, err)
	c := &Comm{opts: o, size: 8, major: 9, custom: true}
	c.layout = newArenaLayout(o, c.size)
	a := FusedArgs{Rows: 64, Hidden: 8192, DType: BFloat16} // 1 MiB
	algo, err := c.routeFused(Auto, a, 1<<20, false)
	require.NoError(t, err)
	assert.Equal(t, TwoShot, algo, "1 MiB over 8 ranks")
	algo, err = c.routeFused(Auto, FusedArgs{Rows: 1, Hidden: 8192, DType: BFloat16}, 16<<10, false)
	require.NoError(t, err)
	assert.Equal(t, OneShot, algo, "one row")
	for _, forced := range []Algorithm{OneShot, TwoShot} {
		algo, err = c.routeFused(forced, a, 1<<20, false)
		require.NoError(t, err)
		assert.Equal(t, forced, algo)
	}
	_, err = c.routeFused(Push, a, 1<<20, false)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "no push kernel")
	_, err = c.routeFused(NCCL, a, 1<<20, false)
	assert.ErrorContains(t, err, "no nccl kernel")
	big := FusedArgs{Rows: 65, Hidden: 8192, DType: BFloat16}
	_, err = c.routeFused(Auto, big, 65*16384, false)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "more than MaxBytes")
	// 9 rows of 64 KiB (f32) over 8 ranks: a band of 2 rows does not fit a tmp of about
	// MaxBytes/8: Auto takes OneShot, a forced TwoShot is refused.
	odd := FusedArgs{Rows: 9, Hidden: 16384, DType: Float32}
	nbytes := int64(9 * 16384 * 4)
	c2 := &Comm{opts: o, size: 8, major: 9, custom: true}
	o2, err := Options{MaxBytes: nbytes + 16}.withDefaults()
	require.NoError(t, err)
	c2.opts, c2.layout = o2, newArenaLayout(o2, 8)
	algo, err = c2.routeFused(Auto, odd, nbytes, false)
	require.NoError(t, err)
	assert.Equal(t, OneShot, algo)
	_, err = c2.routeFused(TwoShot, odd, nbytes, false)
	assert.ErrorContains(t, err, "tmp buffer")
	// writing straight into shared outputs needs no tmp
	algo, err = c2.routeFused(TwoShot, odd, nbytes, true)
	require.NoError(t, err)
	assert.Equal(t, TwoShot, algo)
	noKernels := &Comm{opts: o, size: 8, custom: false, noCustomWhy: "one rank"}
	_, err = noKernels.routeFused(Auto, a, 1<<20, false)
	assert.ErrorContains(t, err, "one rank")
}

// TestFusedShape: one block per row (per row of the largest band), at most limit.
func TestFusedShape(t *testing.T) {
	b, th := fusedShape(OneShot, 7, 1024, 8, 36)
	assert.Equal(t, [2]int{7, 512}, [2]int{b, th})
	b, th = fusedShape(OneShot, 513, 256, 8, 36)
	assert.Equal(t, [2]int{36, 256}, [2]int{b, th})
	b, _ = fusedShape(TwoShot, 513, 256, 8, 36)
	assert.Equal(t, 36, b)
	b, _ = fusedShape(TwoShot, 17, 256, 8, 36)
	assert.Equal(t, 3, b, "bands of at most 3 rows")
	b, _ = fusedShape(TwoShot, 1, 256, 8, 36)
	assert.Equal(t, 1, b)
	assert.Equal(t, 32, ptx.FusedThreads(1))
	assert.Equal(t, 96, ptx.FusedThreads(65))
	assert.Equal(t, 512, ptx.FusedThreads(2048), "16384 bf16: 4 vectors per thread")
}

func TestClosedCommRefusesFused(t *testing.T) {
	c := &Comm{closed: true}
	assert.ErrorIs(t, c.AllReduceResidualRMSNorm(nil, FusedArgs{}), ErrClosed)
}
