package collective

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/driver"
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

// TestRouteFused: the size limits and the algorithms the fused call has, forced per call or by
// Options.Algorithm, and NCCL where only it can take the call.
func TestRouteFused(t *testing.T) {
	newComm := func(algo Algorithm, ws int, maxBytes int64) *Comm {
		o, err := Options{MaxBytes: maxBytes, Algorithm: algo}.withDefaults()
		require.NoError(t, err)
		c := &Comm{opts: o, size: ws, major: 9, custom: true, ncclWhy: "no libnccl"}
		c.layout = newArenaLayout(o, c.size)
		return c
	}
	rows := func(n int) (FusedArgs, int64) {
		return FusedArgs{Rows: n, Hidden: 8192, DType: BFloat16}, int64(n) * 8192 * 2
	}
	route := func(c *Comm, algo Algorithm, n int, direct bool) (Algorithm, error) {
		a, nbytes := rows(n)
		return c.routeFused(algo, a, nbytes, direct, direct)
	}
	c := newComm(Auto, 8, 1<<20)
	for _, tc := range []struct {
		c      *Comm
		rows   int
		want   Algorithm
		what   string
		direct bool
	}{
		{c, 64, OneShot, "1 MiB over 8 ranks, through tmp", false},
		{c, 64, TwoShot, "1 MiB over 8 ranks, direct", true},
		{c, 1, OneShot, "16 KiB over 8 ranks: Auto takes no push", true},
		{c, 2, OneShot, "32 KiB over 8 ranks, fewer rows than ranks", true},
		{c, 23, OneShot, "23 rows over 8 ranks: fewer than fusedTwoShotRowsPerRank a rank", true},
		{c, 24, TwoShot, "24 rows over 8 ranks, direct", true},
		{c, 24, OneShot, "24 rows over 8 ranks, through tmp", false},
		{newComm(Auto, 4, 1<<20), 4, OneShot, "64 KiB over 4 ranks", false},
		{newComm(Auto, 2, 1<<20), 4, OneShot, "64 KiB over 2 ranks", false},
		// Options.Algorithm, for the call's Auto: Push selects as Auto (the fused Push is
		// launched only when the call asks for it)
		{newComm(Push, 8, 1<<20), 1, OneShot, "forced push selects as Auto", true},
		{newComm(Push, 8, 1<<20), 64, TwoShot, "forced push selects as Auto, 8 rows a rank", true},
		{newComm(OneShot, 8, 1<<20), 1, OneShot, "forced OneShot", false},
		{newComm(TwoShot, 8, 1<<20), 8, TwoShot, "forced TwoShot", false},
	} {
		got, err := route(tc.c, Auto, tc.rows, tc.direct)
		require.NoError(t, err, tc.what)
		assert.Equal(t, tc.want, got, tc.what)
	}
	// GPU scope, from 8 ranks: OneShot's Columns kernel takes calls of up to 512/ws rows whose
	// ResidualOut is shared, where TwoShot would otherwise serve them
	gpu := newComm(Auto, 8, 2<<20)
	gpu.scope = ptx.ScopeGPU
	for _, tc := range []struct {
		rows                int
		direct, residShared bool
		want                Algorithm
	}{
		{24, true, true, OneShot}, {64, true, true, OneShot}, {65, true, true, TwoShot},
		{24, false, true, OneShot}, {48, false, true, OneShot}, {64, false, true, OneShot}, // TwoShot through tmp from 72
		{24, false, false, OneShot}, {72, false, false, TwoShot},
	} {
		a, nbytes := rows(tc.rows)
		got, err := gpu.routeFused(Auto, a, nbytes, tc.direct, tc.residShared)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "%+v", tc)
	}
	// which kernel OneShot launches: Columns direct from 16 rows (below, the one-shot with the
	// row cache, whose grid of 16 blocks takes up to 16 rows) to 64, through tmp from 24 to 64
	gpu.blocks = 16
	for _, tc := range []struct {
		rows        int
		residShared bool
		want        bool
	}{
		{1, true, false}, {15, true, false}, {16, true, true}, {64, true, true}, {65, true, false},
		{1, false, false}, {23, false, false}, {24, false, true}, {64, false, true}, {65, false, false},
	} {
		assert.Equal(t, tc.want, gpu.columnsServe(FusedArgs{Rows: tc.rows, Hidden: 8192, DType: BFloat16}, tc.residShared), "%+v", tc)
	}
	// where the row cache cannot take the call (more rows than blocks), Columns takes it from one row
	narrow := newComm(Auto, 8, 2<<20)
	narrow.scope, narrow.blocks = ptx.ScopeGPU, 4
	assert.False(t, narrow.columnsServe(FusedArgs{Rows: 4, Hidden: 8192, DType: BFloat16}, true))
	assert.True(t, narrow.columnsServe(FusedArgs{Rows: 5, Hidden: 8192, DType: BFloat16}, true))
	small := newComm(Auto, 8, 256<<10) // a tmp buffer of about 32 KiB: 32 rows of bands do not fit
	small.scope = ptx.ScopeGPU
	assert.False(t, small.columnsServe(FusedArgs{Rows: 32, Hidden: 8192, DType: BFloat16}, false))
	assert.True(t, small.columnsServe(FusedArgs{Rows: 32, Hidden: 8192, DType: BFloat16}, true))
	got, err := gpu.routeFused(TwoShot, FusedArgs{Rows: 24, Hidden: 8192, DType: BFloat16}, 24*8192*2, true, true)
	require.NoError(t, err)
	assert.Equal(t, TwoShot, got, "a forced TwoShot stays TwoShot")

	for _, forced := range []Algorithm{OneShot, TwoShot} {
		got, err := route(c, forced, 8, false)
		require.NoError(t, err)
		assert.Equal(t, forced, got)
		got, err = route(newComm(OneShot, 8, 1<<20), forced, 8, false)
		require.NoError(t, err)
		assert.Equal(t, forced, got, "the call's choice wins over Options.Algorithm")
	}
	got, err = route(c, Push, 1, false)
	require.NoError(t, err)
	assert.Equal(t, Push, got)
	_, err = route(c, Push, 33, false)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "more than PushMaxBytes")
	_, err = route(c, NCCL, 64, false)
	assert.ErrorContains(t, err, "does not have: no libnccl")
	_, err = route(newComm(NCCL, 8, 1<<20), Auto, 1, false)
	assert.ErrorContains(t, err, "does not have", "NCCL forced by the options, but none")
	_, err = route(c, Algorithm(9), 1, false)
	assert.ErrorContains(t, err, "unknown algorithm")
	_, err = route(c, Auto, 65, false)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "more than MaxBytes")
	assert.ErrorContains(t, err, "no libnccl")
	// 9 rows of 64 KiB (f32) over 8 ranks: a band of 2 rows does not fit a tmp of about
	// MaxBytes/8: Auto takes OneShot, a forced TwoShot is refused.
	odd := FusedArgs{Rows: 9, Hidden: 16384, DType: Float32}
	nbytes := int64(9 * 16384 * 4)
	c2 := newComm(Auto, 8, nbytes+16)
	got, err = c2.routeFused(Auto, odd, nbytes, false, false)
	require.NoError(t, err)
	assert.Equal(t, OneShot, got)
	_, err = c2.routeFused(TwoShot, odd, nbytes, false, false)
	assert.ErrorContains(t, err, "tmp buffer")
	// writing straight into shared outputs needs no tmp
	got, err = c2.routeFused(TwoShot, odd, nbytes, true, true)
	require.NoError(t, err)
	assert.Equal(t, TwoShot, got)
	noKernels := &Comm{opts: c.opts, size: 8, custom: false, noCustomWhy: "one rank", ncclWhy: "no libnccl"}
	_, err = route(noKernels, Auto, 64, false)
	assert.ErrorContains(t, err, "one rank")
	assert.ErrorContains(t, err, "no libnccl")

	// With NCCL: Auto takes it past MaxBytes and where the kernels cannot serve; forced
	// kernels stay refused there (as AllReduce's), forced NCCL takes everything.
	withNCCL := newComm(Auto, 8, 1<<20)
	withNCCL.nccl = &ncclEngine{}
	got, err = route(withNCCL, Auto, 65, false)
	require.NoError(t, err)
	assert.Equal(t, NCCL, got, "past MaxBytes")
	got, err = route(withNCCL, Auto, 1, false)
	require.NoError(t, err)
	assert.Equal(t, OneShot, got, "the kernels where they can")
	got, err = route(withNCCL, NCCL, 1, false)
	require.NoError(t, err)
	assert.Equal(t, NCCL, got)
	_, err = route(withNCCL, OneShot, 65, false)
	assert.ErrorContains(t, err, "use Auto or NCCL")
	onlyNCCL := &Comm{opts: c.opts, size: 1, custom: false, noCustomWhy: "one rank", nccl: &ncclEngine{}}
	for _, n := range []int{1, 65, 4096} {
		got, err = route(onlyNCCL, Auto, n, false)
		require.NoError(t, err)
		assert.Equal(t, NCCL, got, "%d rows on a communicator that NCCL alone serves", n)
	}
	_, err = route(onlyNCCL, TwoShot, 1, false)
	assert.ErrorContains(t, err, "one rank")
	forcedPush := newComm(Push, 8, 1<<20)
	forcedPush.custom, forcedPush.nccl = false, &ncclEngine{}
	got, err = route(forcedPush, Auto, 1, false)
	require.NoError(t, err)
	assert.Equal(t, NCCL, got, "forced push without kernels selects as Auto")
}

// TestSelectFused: from 4 ranks TwoShot from fusedTwoShotRowsPerRank rows a rank, direct or
// through tmp; at 2 and 3 ranks OneShot below fusedPlainTableRowsPerRank rows a rank, then the
// plain table.
func TestSelectFused(t *testing.T) {
	for _, ws := range []int{2, 3, 4, 5, 8, 16} {
		assert.Equal(t, OneShot, selectFused(9, ws, 1, 16<<10, false, true), "ws %d, one row", ws)
		assert.Equal(t, OneShot, selectFused(9, ws, ws-1, 16<<10, true, false), "ws %d, fewer rows than ranks", ws)
	}
	for _, tc := range []struct {
		ws, rows int // the most rows that take OneShot
		direct   bool
	}{{4, 95, true}, {5, 119, true}, {8, 23, true}, {16, 47, true}, {4, 159, false}, {7, 279, false}, {8, 71, false}, {16, 143, false}} {
		assert.Equal(t, OneShot, selectFused(9, tc.ws, tc.rows, int64(tc.rows)*16<<10, tc.direct, true), "%+v", tc)
		assert.Equal(t, TwoShot, selectFused(9, tc.ws, tc.rows+1, int64(tc.rows+1)*16<<10, tc.direct, true), "%+v", tc)
	}
	for _, ws := range []int{2, 3} {
		assert.Equal(t, OneShot, selectFused(9, ws, fusedPlainTableRowsPerRank*ws-1, 1<<20, false, true), "ws %d", ws)
	}
	assert.Equal(t, OneShot, selectFused(9, 2, 64, 1<<20, false, true), "the plain table's OneShot limit at 2 ranks")
	assert.Equal(t, TwoShot, selectFused(9, 2, 512, 8<<20, true, true), "the plain table at 2 ranks, 8 MiB")
}

// TestNCCLSumBuffer: where the NCCL route leaves NCCL's sum for every aliasing the call allows,
// never the caller's In unless it is ResidualOut.
func TestNCCLSumBuffer(t *testing.T) {
	const in, res, out, norm, staging = 0x1000, 0x2000, 0x3000, 0x4000, 0x9000
	a := FusedArgs{In: in, Residual: res, ResidualOut: out, NormOut: norm}
	for _, tc := range []struct {
		what    string
		f       func(a *FusedArgs)
		staging driver.DevicePtr
		want    driver.DevicePtr
	}{
		{"out of place", func(a *FusedArgs) {}, 0, out},
		{"out of place, NoNorm", func(a *FusedArgs) { a.NoNorm = true }, 0, out},
		{"in place over Residual", func(a *FusedArgs) { a.ResidualOut = res }, staging, norm},
		{"ResidualOut is In", func(a *FusedArgs) { a.ResidualOut = in }, 0, in},
		{"ResidualOut is In is Residual", func(a *FusedArgs) { a.ResidualOut, a.Residual = in, in }, 0, norm},
		{"in place over Residual, NoNorm", func(a *FusedArgs) { a.ResidualOut, a.NoNorm = res, true }, staging, staging},
	} {
		b := a
		tc.f(&b)
		got, err := ncclSumBuffer(b, tc.staging)
		require.NoError(t, err, tc.what)
		assert.Equal(t, tc.want, got, tc.what)
	}
	_, err := ncclSumBuffer(FusedArgs{In: in, Residual: res, ResidualOut: res, NoNorm: true}, 0)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "pass a ResidualOut of its own")
}

// TestFusedShape: one block per row (per row of the largest band), at most limit.
func TestFusedShape(t *testing.T) {
	b, th := fusedShape(OneShot, 7, 1024, 8, 36)
	assert.Equal(t, [2]int{7, 512}, [2]int{b, th}, "OneShot: one block per row")
	b, th = fusedShape(OneShot, 513, 256, 8, 36)
	assert.Equal(t, [2]int{36, 256}, [2]int{b, th})
	b, th = fusedShape(TwoShot, 513, 256, 8, 36)
	assert.Equal(t, [2]int{36, 256}, [2]int{b, th}, "bands past ptx.MaxSplitRows: one block per row")
	b, th = fusedShape(TwoShot, 17, 1024, 8, 36)
	assert.Equal(t, [2]int{24, 64}, [2]int{b, th}, "bands of at most 3 rows, 8 blocks each")
	b, th = fusedShape(TwoShot, 32, 1024, 8, 64)
	assert.Equal(t, [2]int{32, 64}, [2]int{b, th}, "bands of 4 rows, 8 blocks each")
	b, th = fusedShape(TwoShot, 40, 1024, 8, 64)
	assert.Equal(t, [2]int{5, 512}, [2]int{b, th}, "bands of 5 rows, past fusedSpreadRows: one block per row")
	b, th = fusedShape(TwoShot, 1, 256, 8, 36)
	assert.Equal(t, [2]int{4, 64}, [2]int{b, th})
	b, th = fusedShape(TwoShot, 16, 1024, 8, 1)
	assert.Equal(t, [2]int{1, 512}, [2]int{b, th}, "a grid of one block")
	assert.Equal(t, 32, ptx.FusedThreads(1))
	assert.Equal(t, 96, ptx.FusedThreads(65))
	assert.Equal(t, 512, ptx.FusedThreads(2048), "16384 bf16: 4 vectors per thread")
}

func TestClosedCommRefusesFused(t *testing.T) {
	c := &Comm{closed: true}
	assert.ErrorIs(t, c.AllReduceResidualRMSNorm(nil, FusedArgs{}), ErrClosed)
}

// TestFusedLimit: a fused kernel that fits fewer blocks per SM than the plain kernels gets a
// grid that takes no more of a shared GPU; with a GPU per rank, or enough occupancy, the grid
// stays.
func TestFusedLimit(t *testing.T) {
	shared := &Comm{blocks: 33, blocksPerSM: 2, ranksOnGPU: 4}
	assert.Equal(t, 33, shared.fusedLimit(2))
	assert.Equal(t, 33, shared.fusedLimit(3))
	assert.Equal(t, 16, shared.fusedLimit(1))
	tiny := &Comm{blocks: 1, blocksPerSM: 2, ranksOnGPU: 16}
	assert.Equal(t, 1, tiny.fusedLimit(1))
	own := &Comm{blocks: 64, blocksPerSM: 2, ranksOnGPU: 1}
	assert.Equal(t, 64, own.fusedLimit(1))
}

// TestFusedColumns: the Columns kernel serves calls of up to 512/ws rows from 8 ranks, with
// GPU-scope barriers only.
func TestFusedColumns(t *testing.T) {
	for ws, want := range map[int]int{2: 0, 4: 0, 7: 0, 8: 64, 12: 42, 16: 32} {
		assert.Equal(t, want, fusedColumnsMaxRows(ws), "%d ranks", ws)
	}
	c := &Comm{size: 8, scope: ptx.ScopeGPU}
	assert.True(t, c.fusedColumns(1))
	assert.True(t, c.fusedColumns(64))
	assert.False(t, c.fusedColumns(65))
	c.scope = ptx.ScopeSystem
	assert.False(t, c.fusedColumns(1), "not at system scope")
	assert.False(t, (&Comm{size: 4, scope: ptx.ScopeGPU}).fusedColumns(1), "not below 8 ranks")
}

// TestFusedRowCache: the one-shot with the row cache serves calls of up to fusedRowCacheRows
// rows, one block each (rows within the communicator's grid), of up to ptx.MaxRowCacheRanks
// ranks; TwoShot never.
func TestFusedRowCache(t *testing.T) {
	assert.True(t, fusedRowCache(ptx.OneShot, 2, 1, 64))
	assert.True(t, fusedRowCache(ptx.OneShot, 8, 16, 16))
	assert.True(t, fusedRowCache(ptx.OneShot, 4, fusedRowCacheRows, 64))
	assert.False(t, fusedRowCache(ptx.OneShot, 4, fusedRowCacheRows+1, 64), "more rows than the cache is for")
	assert.False(t, fusedRowCache(ptx.OneShot, 8, 17, 16), "two rows a block")
	assert.False(t, fusedRowCache(ptx.OneShot, ptx.MaxRowCacheRanks+1, 1, 64), "no registers to spare")
	assert.False(t, fusedRowCache(ptx.TwoShot, 2, 1, 64))
}

// TestLoadFused: LoadFused loads the fused one-shot (with and without the row cache) and
// two-shot of the communicator's scope and the norm kernel of the element type, each once, and
// nothing of other element types; it refuses an unknown element type and a closed communicator.
func TestLoadFused(t *testing.T) {
	f := newFakeJIT(0)
	mc := f.cache(2)
	key := kernelKey{dev: 917, worldSize: 4, target: ptx.SM90, scope: ptx.ScopeGPU}
	ks, _, err := acquireFrom(mc, key)
	require.NoError(t, err)
	defer func() {
		require.NoError(t, ks.release())
		require.NoError(t, unloadKernels(mc))
	}()
	c := &Comm{kernels: ks, scope: ptx.ScopeGPU, size: 4}
	// push: its one build, ScopeSystem's
	want := []string{"goccl_fused_oneshot_bf16_w4_gpu", "goccl_fused_oneshot_rc_bf16_w4_gpu", "goccl_fused_twoshot_bf16_w4_gpu", "goccl_fused_push_bf16_w4", "goccl_rmsnorm_bf16"}
	for range 2 {
		require.NoError(t, c.LoadFused(BFloat16))
		for _, entry := range want {
			assert.Equal(t, 1, f.count(entry), entry)
		}
	}
	assert.Equal(t, 9+len(want), f.total(), "the plain kernels and the five of bf16, nothing else")
	fn, _, err := ks.fusedKernel(ptx.ScopeGPU, ptx.TwoShot, BFloat16, false)
	require.NoError(t, err)
	assert.NotNil(t, fn, "the call finds it loaded")
	assert.Equal(t, 9+len(want), f.total())

	assert.ErrorIs(t, c.LoadFused(0), ErrInvalidArgument)
	assert.ErrorIs(t, (&Comm{closed: true}).LoadFused(BFloat16), ErrClosed)

	// From 8 ranks at GPU scope the Columns kernel loads too; at system scope it does not.
	for _, scope := range []ptx.Scope{ptx.ScopeGPU, ptx.ScopeSystem} {
		key8 := kernelKey{dev: 917, worldSize: 8, target: ptx.SM90, scope: scope}
		ks8, _, err := acquireFrom(mc, key8)
		require.NoError(t, err)
		c8 := &Comm{kernels: ks8, scope: scope, size: 8}
		require.NoError(t, c8.LoadFused(BFloat16))
		name := (ptx.FusedSpec{Algo: ptx.Columns, DType: BFloat16, WorldSize: 8, Target: ptx.SM90, Scope: scope}).EntryName()
		assert.Equal(t, map[ptx.Scope]int{ptx.ScopeGPU: 1, ptx.ScopeSystem: 0}[scope], f.count(name), name)
		require.NoError(t, ks8.release())
	}
}

// TestCallNamesTheRoute: ranks that deliver a call's sums differently (straight into every
// rank's registered outputs, or through the tmp buffers) pass different call fingerprints,
// so that the kernels report ErrCallMismatch: the two kernels pass as many barriers, and a
// rank gathering from a direct peer's tmp buffer would otherwise return stale rows. Whether
// an output is registered is each rank's own knowledge.
func TestCallNamesTheRoute(t *testing.T) {
	c := &Comm{}
	a := FusedArgs{Rows: 64, Hidden: 8192, DType: BFloat16}
	for _, kernel := range []ptx.Algorithm{ptx.TwoShot, ptx.Columns} {
		direct, tmp := c.fusedCall(kernel, a, true), c.fusedCall(kernel, a, false)
		assert.NotEqual(t, direct, tmp, "fused %v, direct against through tmp", kernel)
		assert.Equal(t, kernel, ptx.DecodeCall(direct).Algo)
	}
	assert.Equal(t, c.fusedCall(ptx.OneShot, a, false), c.fusedCall(ptx.OneShot, a, true), "OneShot has one route")
	assert.True(t, ptx.DecodeCall(c.fusedCall(ptx.TwoShot, a, true)).Direct)

	direct, tmp := allReduceCall(ptx.TwoShot, BFloat16, 1<<16, false, true), allReduceCall(ptx.TwoShot, BFloat16, 1<<16, false, false)
	assert.NotEqual(t, direct, tmp, "all-reduce TwoShot, direct against through tmp")
	assert.Equal(t, ptx.Call{Op: ptx.OpAllReduce, Algo: ptx.TwoShot, DType: BFloat16, Count: 1 << 16, Direct: true}, ptx.DecodeCall(direct))
	assert.NotEqual(t, allReduceCall(ptx.OneShot, BFloat16, 8, true, false), allReduceCall(ptx.OneShot, BFloat16, 8, false, false), "staged")
}

// TestFusedBuffersAllocateNothing: the check of a fused call's buffers, which runs for every
// layer, allocates nothing for good arguments, with the norm and without.
func TestFusedBuffersAllocateNothing(t *testing.T) {
	const p, h, rows = 0x7f0000000000, 4096, 4
	const n = rows * h * 2 // bytes of each bf16 buffer
	for _, noNorm := range []bool{false, true} {
		a := FusedArgs{In: p, Residual: p + n, ResidualOut: p + n, NormOut: p + 2*n, Gamma: p + 3*n,
			Rows: rows, Hidden: h, Eps: 1e-6, DType: BFloat16, NoNorm: noNorm}
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := a.buffers(n, h*2); err != nil {
				t.Fatal(err)
			}
		})
		assert.Zero(t, allocs, "NoNorm %v", noNorm)
		set, err := a.buffers(n, h*2)
		require.NoError(t, err)
		got := set.list()
		want := []string{"In", "ResidualOut", "Residual", "NormOut", "Gamma"}
		if noNorm {
			want = want[:3]
		}
		var names []string
		for _, b := range got {
			names = append(names, b.name)
		}
		assert.Equal(t, want, names, "NoNorm %v", noNorm)
	}
}

// TestFusedPushSlots: the fused push keeps push's grid, so it runs only where that grid of
// blocks of its occupancy takes no more of a shared GPU than the largest grid the ranks
// sized their room for; with a GPU per rank it always runs.
func TestFusedPushSlots(t *testing.T) {
	for _, tc := range []struct {
		onGPU, blocksPerSM, blocks, pushBlocks, occ int
		slots                                       int
		ok                                          bool
	}{
		{1, 2, 36, 16, 1, 1, true},  // a GPU per rank
		{2, 2, 36, 16, 1, 2, true},  // two plain slots a block: 32 of 36
		{2, 2, 36, 16, 2, 1, true},  // as the plain kernels
		{4, 2, 24, 16, 1, 2, false}, // 32 slots past the largest grid, 24
		{8, 1, 16, 16, 1, 1, true},
		{8, 1, 16, 16, 0, 0, false}, // does not fit at all
	} {
		c := &Comm{ranksOnGPU: tc.onGPU, blocksPerSM: tc.blocksPerSM, blocks: tc.blocks, pushBlocks: tc.pushBlocks}
		slots, ok := c.fusedPushSlots(tc.occ)
		assert.Equal(t, tc.ok, ok, "%+v", tc)
		if ok {
			assert.Equal(t, tc.slots, slots, "%+v", tc)
		}
	}
}
