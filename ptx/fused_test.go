package ptx

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

// allFusedSpecs lists every fused kernel: one-shot and two-shot in both scopes, push (no
// barrier: the same kernel in both scopes, collective loads the system-scope one) in one, x 3
// types x 15 world sizes x 2 targets = 450 (fewer world sizes under the race detector:
// testWorldSizes).
func allFusedSpecs() []FusedSpec {
	var specs []FusedSpec
	for _, scope := range Scopes {
		for _, target := range []Target{SM80, SM90} {
			for _, algo := range Algorithms {
				if algo == Push && scope != ScopeSystem {
					continue
				}
				for _, dt := range dtype.All {
					for _, ws := range testWorldSizes {
						specs = append(specs, FusedSpec{Algo: algo, DType: dt, WorldSize: ws, Target: target, Scope: scope})
						if algo == OneShot && ws <= MaxRowCacheRanks {
							specs = append(specs, FusedSpec{Algo: algo, DType: dt, WorldSize: ws, Target: target, Scope: scope, RowCache: true})
						}
						if algo == OneShot {
							specs = append(specs, FusedSpec{Algo: Columns, DType: dt, WorldSize: ws, Target: target, Scope: scope})
						}
					}
				}
			}
		}
	}
	return specs
}

func TestFusedEntrySignature(t *testing.T) {
	specs := allFusedSpecs()
	// a world size's one-shot, Columns and two-shot in every scope, push in one, and the
	// one-shot with RowCache in every scope up to MaxRowCacheRanks ranks; three element types
	// and two targets each
	cached := 0
	for _, ws := range testWorldSizes {
		if ws <= MaxRowCacheRanks {
			cached++
		}
	}
	want := ((3*len(Scopes)+1)*len(testWorldSizes) + len(Scopes)*cached) * 3 * 2
	require.Len(t, specs, want)
	names := map[string]bool{}
	for _, s := range specs {
		src, err := s.Generate()
		require.NoError(t, err, s.EntryName())
		entry, params, err := ParseEntryParams(src)
		require.NoError(t, err, s.EntryName())
		assert.Equal(t, s.EntryName(), entry)
		assert.Equal(t, s.Params(), params, s.EntryName())
		if s.Algo == Push {
			assert.Equal(t, FusedPushParams(s.WorldSize), params, s.EntryName())
		} else {
			assert.Equal(t, FusedParams(s.WorldSize), params, s.EntryName())
		}
		names[s.EntryName()+s.Target.String()] = true
	}
	assert.Len(t, names, want)
	for _, dt := range dtype.All {
		for _, target := range []Target{SM80, SM90} {
			src, err := NormSpec{dt, target}.Generate()
			require.NoError(t, err)
			entry, params, err := ParseEntryParams(src)
			require.NoError(t, err)
			assert.Equal(t, NormSpec{dt, target}.EntryName(), entry)
			assert.Equal(t, FusedParams(1), params)
		}
	}
}

// TestFusedPTXAssembles assembles every fused kernel and the RMSNorm kernel with ptxas for
// its target: no spills, no stack frame, registers for one block of ThreadsPerBlock per SM.
func TestFusedPTXAssembles(t *testing.T) {
	ptxas := ptxasPath(t)
	type variant struct {
		name, arch string
		gen        func() ([]byte, error)
	}
	var vs []variant
	for _, s := range allFusedSpecs() {
		vs = append(vs, variant{s.EntryName() + "_" + s.Target.String(), s.Target.String(), s.Generate})
	}
	for _, dt := range dtype.All {
		for _, target := range []Target{SM80, SM90} {
			s := NormSpec{dt, target}
			vs = append(vs, variant{s.EntryName() + "_" + target.String(), target.String(), s.Generate})
		}
	}
	for _, v := range vs {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			src, err := v.gen()
			require.NoError(t, err)
			rep, err := assemble(ptxas, v.arch, src, t.TempDir())
			require.NoError(t, err)
			assert.Zero(t, rep.StackFrame, "stack frame bytes (local memory)")
			assert.Zero(t, rep.SpillStores, "spill store bytes")
			assert.Zero(t, rep.SpillLoads, "spill load bytes")
			assert.LessOrEqual(t, rep.Registers, 65536/ThreadsPerBlock, "registers for one block of %d threads per SM", ThreadsPerBlock)
		})
	}
}

// TestFusedArithmetic checks in the text what internal/ref.Fused relies on: IEEE-exact
// instructions only (no fma, no approximation, no flush to zero), the norm's steps in order,
// and the sum tree of every block sum: each warp's by shuffles at distances 16, 8, 4, 2, 1,
// then the warp sums' by the same tree, in registers (warpsumtree) where one block holds the
// row and by shuffles again where the row's blocks meet (rowsync).
func TestFusedArithmetic(t *testing.T) {
	// the warp sums' tree in registers from the shared array arr into sum: its loads, the adds
	// of lane l+d into lane l for d = 8, 4, 2, 1 (d = 16 adds the +0 padding: see
	// WarpSumTree), in that order and nothing else between them
	registerTree := func(arr, sum string) *regexp.Regexp {
		var b strings.Builder
		fmt.Fprintf(&b, `mov\.u64 %%wa, %s;`, arr)
		for i := 0; i < 16; i += 4 {
			fmt.Fprintf(&b, `\s+ld\.shared\.v4\.f32 \{%%w%d, %%w%d, %%w%d, %%w%d\}, \[%%wa\+%d\];`, i, i+1, i+2, i+3, 4*i)
		}
		for _, d := range []int{8, 4, 2, 1} {
			for l := range d {
				fmt.Fprintf(&b, `\s+add\.rn\.f32 %%w%d, %%w%d, %%w%d;`, l, l, l+d)
			}
		}
		fmt.Fprintf(&b, `\s+mov\.f32 %s, %%w0;`, regexp.QuoteMeta(sum))
		return regexp.MustCompile(b.String())
	}
	// trees: the shuffle trees over sum, at distances 16 .. 1 each
	trees := func(text, sum string) int {
		var dists []string
		for _, m := range regexp.MustCompile(`shfl\.sync\.down\.b32 %x, `+regexp.QuoteMeta(sum)+`, (\d+),`).FindAllStringSubmatch(text, -1) {
			dists = append(dists, m[1])
		}
		n := len(dists) / 5
		want := []string{}
		for range n {
			want = append(want, "16", "8", "4", "2", "1")
		}
		assert.Equal(t, want, dists, "shuffle distances over %s", sum)
		return n
	}
	// blockSums: the block sums over %ss (a warp tree, then the register tree); meetings: the
	// rows spread over blocks (rowsync: a warp tree, then a warp tree over the row's warp sums
	// and lane 0's result to the warp); invs: the reciprocals taken from them (the Columns
	// kernel's two rows at once sum the second row in %ssb and take two)
	check := func(name string, src []byte, blockSums, meetings, invs int) {
		text := code(src)
		for _, bad := range []string{"fma", "mad.rn", ".approx", ".ftz", "rsqrt", "add.f32", "mul.f32", "div.full"} {
			assert.False(t, has(text, bad), "%s: %s", name, bad)
		}
		assert.Equal(t, blockSums+2*meetings, trees(text, "%ss"), "%s: warp trees over %%ss", name)
		assert.Len(t, registerTree("wsum", "%ss").FindAllString(text, -1), blockSums, "%s: register trees into %%ss", name)
		assert.Equal(t, meetings, strings.Count(text, "shfl.sync.idx.b32 %ss, %ss, 0,"), name)
		steps := regexp.MustCompile(`div\.rn\.f32 %ss, %ss, %hid;\s+add\.rn\.f32 %ss, %ss, %eps;\s+sqrt\.rn\.f32 %ss, %ss;\s+div\.rn\.f32 %inv, 0f3F800000, %ss;`)
		assert.Len(t, steps.FindAllString(text, -1), invs, "%s: mean, + eps, sqrt, reciprocal", name)
		// x * inv, then * gamma, per element
		assert.Regexp(t, `mul\.rn\.f32 %acc0, %acc0, %inv;\s+mul\.rn\.f32 %acc0, %acc0, %gx;`, text, name)
		// squares: mul then add, never fused
		assert.Regexp(t, `mul\.rn\.f32 %x, %x, %x;\s+add\.rn\.f32 %ss, %ss, %x;`, text, name)
	}
	for _, s := range allFusedSpecs() {
		src, err := s.Generate()
		require.NoError(t, err)
		// every row loop of two-shot: one block per row (the block sum), or spread (rowsync);
		// one-shot and push: one block per row
		sums, meetings := 1, 1
		switch s.Algo {
		case OneShot, Push:
			meetings = 0
		case Columns:
			// one row at a time, and two: row A's block sum in %ss, row B's in %ssb
			text := code(src)
			assert.Equal(t, 1, trees(text, "%ssb"), s.EntryName())
			assert.Len(t, registerTree("wsumb", "%ssb").FindAllString(text, -1), 1, s.EntryName())
			assert.Zero(t, strings.Count(text, "shfl.sync.idx"), s.EntryName())
			assert.Regexp(t, `mul\.rn\.f32 %x, %x, %x;\s+add\.rn\.f32 %ssb, %ssb, %x;`, text, s.EntryName())
			check(s.EntryName()+"_"+s.Target.String(), src, 2, 0, 3)
			continue
		case TwoShot:
			sums, meetings = 2, 2 // through tmp and direct
		}
		check(s.EntryName()+"_"+s.Target.String(), src, sums, meetings, sums+meetings)
	}
	for _, dt := range dtype.All {
		src, err := NormSpec{dt, SM90}.Generate()
		require.NoError(t, err)
		check(NormSpec{dt, SM90}.EntryName(), src, 1, 0, 1)
	}
}

// TestFusedBarriers: one-shot passes the entry and exit barriers, two-shot the entry barrier
// and either the middle or the delivered one, each kernel checks the call, and only sm_90 has
// PDL. Push has no barrier (TestFusedPush).
func TestFusedBarriers(t *testing.T) {
	for _, s := range allFusedSpecs() {
		if s.Algo == Push {
			continue
		}
		text := code(mustGenerate(t, s.Generate))
		name := s.EntryName() + "_" + s.Target.String()
		src := string(mustGenerate(t, s.Generate))
		assert.Contains(t, src, "==== entry barrier", name)
		switch s.Algo {
		case OneShot:
			assert.Contains(t, src, "==== exit barrier", name)
			assert.NotContains(t, src, "==== middle barrier", name)
		case Columns:
			// stage 1's columns are published by the middle barrier; no exit barrier
			assert.Equal(t, 1, strings.Count(src, "==== middle barrier"), name)
			assert.NotContains(t, src, "==== exit barrier", name)
			assert.NotContains(t, src, "==== delivered barrier", name)
		default:
			assert.Contains(t, src, "==== middle barrier", name)
			assert.Contains(t, src, "==== delivered barrier", name)
		}
		assert.Contains(t, src, "call check, second half", name)
		assert.Equal(t, s.Target == SM90, has(text, "griddepcontrol.wait"), name)
	}
}

func mustGenerate(t *testing.T, gen func() ([]byte, error)) []byte {
	t.Helper()
	src, err := gen()
	require.NoError(t, err)
	return src
}

func TestFusedCall(t *testing.T) {
	c := FusedCall(TwoShot, dtype.BFloat16, 513, 16384, false)
	assert.Equal(t, OpAllReduceRMSNorm, c.Op)
	rows, hidden := FusedShape(c.Count)
	assert.Equal(t, [2]int{513, 16384}, [2]int{rows, hidden})
	assert.Equal(t, c, DecodeCall(c.Fingerprint()))
	assert.Equal(t, "all-reduce+rmsnorm of 513 rows of 16384 bf16 elements (twoshot)", c.String())
	// the same elements in other rows, or without the norm, are other calls
	assert.NotEqual(t, c.Fingerprint(), FusedCall(TwoShot, dtype.BFloat16, 1026, 8192, false).Fingerprint())
	nn := FusedCall(TwoShot, dtype.BFloat16, 513, 16384, true)
	assert.Equal(t, OpAllReduceResidual, nn.Op)
	assert.NotEqual(t, c.Fingerprint(), nn.Fingerprint())
	assert.NotEqual(t, c.Fingerprint(), Call{Op: OpAllReduce, Algo: TwoShot, DType: dtype.BFloat16, Count: 513 * 16384}.Fingerprint())
	assert.Equal(t, "all-reduce+residual", OpAllReduceResidual.String())

	assert.Equal(t, int64(3*4096+4*MaxBlocks), FusedTmpBytes(4, 9, 4096), "bands of at most 3 rows; the inv of each block's piece")
	assert.Equal(t, int64(100*4096+400), FusedTmpBytes(4, 400, 4096), "bands of 100 rows, one block each")
	assert.Equal(t, 32, FusedThreads(1))
	assert.Equal(t, 256, FusedThreads(256))
	assert.Equal(t, 512, FusedThreads(4096))

	assert.NoError(t, FusedSpec{Push, dtype.BFloat16, 4, SM90, ScopeSystem, false}.Validate())
	assert.ErrorContains(t, FusedSpec{Algorithm(7), dtype.BFloat16, 4, SM90, ScopeSystem, false}.Validate(), "ptx.OneShot, ptx.TwoShot, ptx.Push and ptx.Columns")
	assert.Equal(t, "goccl_fused_columns_bf16_w8_gpu", FusedSpec{Columns, dtype.BFloat16, 8, SM90, ScopeGPU, false}.EntryName())
	cols := FusedCall(Columns, dtype.BFloat16, 7, 8192, false)
	assert.NotEqual(t, FusedCall(OneShot, dtype.BFloat16, 7, 8192, false).Fingerprint(), cols.Fingerprint(), "ranks must agree on the kernel")
	assert.Equal(t, "all-reduce+rmsnorm of 7 rows of 8192 bf16 elements (columns)", DecodeCall(cols.Fingerprint()).String())
	assert.ErrorContains(t, FusedSpec{OneShot, dtype.BFloat16, 17, SM90, ScopeSystem, false}.Validate(), "world size 17")
	assert.Equal(t, "goccl_fused_push_bf16_w4", FusedSpec{Push, dtype.BFloat16, 4, SM90, ScopeSystem, false}.EntryName())
	assert.Equal(t, "all-reduce+rmsnorm of 1 rows of 8192 bf16 elements (push)", FusedCall(Push, dtype.BFloat16, 1, 8192, false).String())
	_, err := NormSpec{DType: 0, Target: SM90}.Generate()
	assert.Error(t, err)
	assert.Equal(t, "goccl_fused_twoshot_f16_w8_gpu", FusedSpec{TwoShot, dtype.Float16, 8, SM80, ScopeGPU, false}.EntryName())
	assert.Equal(t, "goccl_fused_oneshot_rc_bf16_w2_gpu", FusedSpec{OneShot, dtype.BFloat16, 2, SM90, ScopeGPU, true}.EntryName())
}

// TestFusedOccupancy: collective caps every grid with the smallest occupancy of the plain
// kernels of a world size (512-thread blocks per SM, from their registers), and loads a fused
// kernel only if it fits as many blocks per SM. Checked here with ptxas where the plain
// kernels fit more than one block (few ranks): a fused kernel that needed more registers
// would make every fused call of such a communicator fail.
func TestFusedOccupancy(t *testing.T) {
	ptxas := ptxasPath(t)
	blocksPerSM := func(regs int) int { return 65536 / ((regs + 7) / 8 * 8 * ThreadsPerBlock) }
	for _, target := range []Target{SM80, SM90} {
		for _, scope := range Scopes {
			for ws := 2; ws <= 4; ws++ {
				t.Run(fmt.Sprintf("%s/%s/w%d", target, scope, ws), func(t *testing.T) {
					t.Parallel()
					plain := 1 << 30
					for _, algo := range Algorithms {
						for _, dt := range dtype.All {
							rep, err := assemble(ptxas, target.String(), mustGenerate(t, Spec{algo, dt, ws, target, ScopeSystem}.Generate), t.TempDir())
							require.NoError(t, err)
							plain = min(plain, blocksPerSM(rep.Registers))
						}
					}
					for _, algo := range Algorithms {
						if algo == Push {
							// push's grid is its own (Options.PushBlocks), and collective
							// launches the fused push only where that grid of every rank
							// sharing the GPU fits at the kernel's occupancy
							continue
						}
						for _, dt := range dtype.All {
							for _, cache := range []bool{false, algo == OneShot} {
								s := FusedSpec{algo, dt, ws, target, scope, cache}
								rep, err := assemble(ptxas, target.String(), mustGenerate(t, s.Generate), t.TempDir())
								require.NoError(t, err)
								assert.GreaterOrEqual(t, blocksPerSM(rep.Registers), plain, "%s: %d registers", s.EntryName(), rep.Registers)
							}
						}
					}
				})
			}
		}
	}
}

// TestFusedPush reads the fused push kernels: push's protocol (sends to every rank's slot,
// rank-order sums of the polled slots, re-arm, call header, parts, the deferred re-arm of a
// plain push call before with three parts), a block a row with the loads that go out before
// the first wait, and PDL.
func TestFusedPush(t *testing.T) {
	accRE := regexp.MustCompile(`shl\.b32 %x, %(v|o|rs)(\d+), 16;\s+add\.rn\.f32 %acc0, %acc0, %x;`)
	for _, s := range allFusedSpecs() {
		if s.Algo != Push {
			continue
		}
		name := s.EntryName() + "_" + s.Target.String()
		src := string(mustGenerate(t, s.Generate))
		text := code([]byte(src))
		ws, parts := s.WorldSize, PushParts(s.WorldSize)
		assert.False(t, has(src, "barrier ===="), name)
		assert.False(t, has(text, "p_inputs"), name)
		assert.Equal(t, ws, strings.Count(text, fmt.Sprintf("st.volatile.global.v4.b32 [%%a+%d], {%%v0, %%v1, %%v2, %%v3};", PushHeaderBytes)), "%s: one send per rank", name)
		assert.True(t, has(text, "st.volatile.global.v4.b32 [%q], {%c0, %c1, %c2, %c3};"), "%s: call header sent", name)
		assert.True(t, has(src, "==== call check: rank s's header"), name)
		// a block a row; the thread's vectors: the first, the second (its slots loaded ahead of
		// the first's wait up to MaxRowCacheRanks ranks), then a loop
		assert.True(t, has(text, "mov.u32 %row, %block;"), name)
		receive := strings.Index(text, "mov.u32 %row, %block;")
		firstWait := receive + strings.Index(text[receive:], "\n\tld.volatile.global.v4.b32 {%v")
		loads := 2 * ws
		if ws > MaxRowCacheRanks {
			loads = 3 * ws
		} else {
			assert.Equal(t, ws, strings.Count(text, "@%ahead ld.volatile.global.v4.b32 {%y"), name)
			assert.Less(t, strings.LastIndex(text, "@%ahead ld.volatile.global.v4.b32 {%y"), firstWait, name)
		}
		assert.Equal(t, loads, strings.Count(text, "\n\tld.volatile.global.v4.b32 {%v"), "%s: every slot loaded once before its wait", name)
		for u := range 2 {
			// the residual of the first two vectors, before the first wait
			load := fmt.Sprintf("@%%ahead ld.global.v4.b32 {%%rs%d, %%rs%d, %%rs%d, %%rs%d}, [%%a];", 4*u, 4*u+1, 4*u+2, 4*u+3)
			assert.Equal(t, 1, strings.Count(text, load), name)
			assert.Less(t, strings.Index(text, load), firstWait, name)
		}
		if s.DType == dtype.BFloat16 {
			// rank order 0..ws-1 (vector 0 starts the sums), then the residual: loaded ahead
			// (%rs) for the first two vectors, with the slots in the loop (%o)
			var order []string
			for _, m := range accRE.FindAllStringSubmatch(text, -1) {
				order = append(order, m[1]+m[2])
			}
			var want []string
			for _, res := range []string{"rs0", "rs4", "o0"} {
				for r := 1; r < ws; r++ {
					want = append(want, fmt.Sprintf("v%d", 4*r))
				}
				want = append(want, res)
			}
			assert.Equal(t, want, order, name)
			assert.Equal(t, 3, strings.Count(text, "shl.b32 %acc0, %v0, 16;"), name)
		}
		rearm := strings.Count(text, "st.global.v4.b32 [%a], {%zero, %zero, %zero, %zero};")
		pending := fmt.Sprintf("[%%pend+%d]", PushPendingOffset)
		if ws >= DeferRearmMinRanks {
			assert.Equal(t, 4*ws, rearm, "%s: re-arm of the slots read (three places), and the plain call's deferred one", name)
			assert.True(t, has(text, "ld.global.v2.u32 {%pnvec, %pntid}, "+pending+";"), name)
			assert.True(t, has(text, fmt.Sprintf("st.global.v2.u32 [%%ep+%d], {%%zero, %%zero};", PushPendingOffset)), "%s: nothing left to re-arm", name)
		} else {
			assert.Equal(t, 3*ws, rearm, name)
			assert.False(t, has(text, "%pend"), name)
		}
		assert.True(t, has(text, "st.global.v4.b32 [%q], {%zero, %zero, %zero, %zero};"), "%s: header re-armed", name)
		epoch := regexp.MustCompile(fmt.Sprintf(`add\.u32 %%epoch, %%epoch, 1;\s+setp\.ge\.u32 %%p0, %%epoch, %d;\s+@%%p0 mov\.u32 %%epoch, 0;\s+st\.global\.u32 \[%%ep\+%d\], %%epoch;`, parts, PushEpochOffset))
		assert.True(t, epoch.MatchString(text), "%s: the next part", name)
		if s.Target == SM90 {
			first := strings.Index(text, "griddepcontrol.wait;")
			assert.True(t, first >= 0 && first < strings.Index(text, "ld.global"), "%s: griddepcontrol.wait before any load", name)
			trigger := strings.Index(text, "@%early griddepcontrol.launch_dependents;")
			assert.True(t, trigger > strings.Index(text, "HEADERSENT:") && trigger < strings.Index(text, "ROW:"), "%s: early trigger after the sends", name)
		} else {
			assert.False(t, has(text, "griddepcontrol"), name)
		}
	}
}

// TestFusedRowSync reads the row loops of the fused two-shot kernel (one-shot, Columns and
// push keep a block per row): both passes over a row step by the row's virtual threads (so that a row
// spread over several blocks keeps the reference's threads), and each row sum either is the
// block's or meets the row's other blocks on fused_rows (counted arrivals that wrap to 0,
// acquire) with the warp sums in fused_sums (strong loads); the two-shot keeps one inv per
// piece.
func TestFusedRowSync(t *testing.T) {
	sync := fmt.Sprintf("[%%ctr+%d]", FusedRowSyncOffset)
	for _, s := range allFusedSpecs() {
		name := s.EntryName() + "_" + s.Target.String()
		text := code(mustGenerate(t, s.Generate))
		loops, passes := 2, 4 // stage 1 and stage 2 through tmp, and direct
		switch s.Algo {
		case OneShot, Columns, Push:
			// one block per row: no spread rows
			assert.False(t, has(text, "mov.u32 %vi, %vt;"), name)
			assert.False(t, has(text, sync), name)
			continue
		}
		assert.Equal(t, loops, strings.Count(text, "atom.acq_rel.gpu.global.inc.u32 %old, "+sync+", %last;"), name)
		assert.Equal(t, loops, strings.Count(text, "ld.acquire.gpu.global.u32 %old, "+sync+";"), name)
		row := "%j" // the band's row
		sums := fmt.Sprintf("add.u64 %%sa, %%sa, %d;\n\tmad.wide.u32 %%sa, %s, %d, %%sa;", FusedSumsOffset, row, 4*MaxPieces)
		assert.Equal(t, loops, strings.Count(text, sums), name)
		assert.Equal(t, loops, strings.Count(text, "@%l0 ld.relaxed.gpu.global.f32 %ss, [%a];"), name)
		assert.Equal(t, passes, strings.Count(text, "add.u32 %vi, %vi, %T;"), name)
		assert.Equal(t, passes, strings.Count(text, "mov.u32 %vi, %vt;"), name)
		assert.False(t, has(text, "add.u32 %vi, %vi, %bthreads;"), name)
		assert.Equal(t, loops, strings.Count(text, "mad.wide.u32 %ctr, "+row+", 4, %ctr;"), name)
		assert.Equal(t, 2, strings.Count(text, "selp.b32 %t0, %block, %j, %p0;"), "%s: the inv of this block's piece, stored and loaded", name)
	}
}

// TestNormPrefetch: the single-rank RMSNorm kernel's sum pass prefetches the thread's next
// vector of its input and of the residual into L1, within the row; the fused kernels do not.
func TestNormPrefetch(t *testing.T) {
	for _, dt := range dtype.All {
		for _, target := range []Target{SM80, SM90} {
			s := NormSpec{DType: dt, Target: target}
			text := code(mustGenerate(t, s.Generate))
			// the input's and the residual's: in each of the sum pass's copies of its vector's
			// work (the row cache's two vectors, then the loop)
			assert.Equal(t, 2*3, strings.Count(text, "prefetch.global.L1 [%a];"), s.EntryName())
			assert.Contains(t, text, "add.u32 %t1, %vi, %bthreads;\n\tsetp.lt.u32 %more, %t1, %hvec;\n\t@!%more bra PREFETCHED;", s.EntryName())
			// issued after the loads of the vector being summed, so that those go out first
			load := strings.Index(text, "ld.global.v4.b32 {%v0, %v1, %v2, %v3}")
			assert.Positive(t, load, s.EntryName())
			assert.Less(t, load, strings.Index(text, "prefetch.global.L1"), s.EntryName())
		}
	}
	for _, s := range allFusedSpecs() {
		assert.NotContains(t, string(mustGenerate(t, s.Generate)), "prefetch", s.EntryName())
	}
}

// TestFusedPieces: the rows are spread over the grid in whole warps of the reference's
// threads, and every vector of every row is received by exactly one thread, whose vectors
// are those of the reference's thread of the same index (kernel mapping mirrored here).
func TestFusedPieces(t *testing.T) {
	for _, tc := range []struct {
		rows, hvec, blocks, min, pieces, threads int
	}{
		{1, 1024, 16, 64, 8, 64},
		{2, 1024, 16, 64, 8, 64},
		{3, 1024, 16, 64, 4, 128},
		{8, 1024, 16, 64, 2, 256},
		{9, 1024, 16, 64, 1, 512},
		{40, 1024, 16, 64, 1, 512},
		{1, 1024, 16, 32, 16, 32},
		{1, 257, 16, 64, 3, 96}, // 288 threads: 9 warps
		{1, 256, 8, 64, 4, 64},
		{1, 4096, 64, 64, 8, 64},
		{33, 256, 64, 32, 1, 256},
	} {
		p, th := FusedPieces(tc.rows, tc.hvec, tc.blocks, tc.min)
		assert.Equal(t, [2]int{tc.pieces, tc.threads}, [2]int{p, th}, "%+v", tc)
		T := FusedThreads(tc.hvec)
		require.Equal(t, T, p*th)
		seen := make([]int, tc.rows*tc.hvec)
		for b := range tc.blocks {
			for u := b; u < tc.rows*p; u += tc.blocks {
				row, k := u/p, u%p
				for tid := range th {
					vt := k*th + tid
					for vi := vt; vi < tc.hvec; vi += T {
						require.Equal(t, vt, vi%T, "the reference's thread of vector %d", vi)
						seen[row*tc.hvec+vi]++
					}
				}
			}
		}
		for i, n := range seen {
			require.Equal(t, 1, n, "%+v: vector %d", tc, i)
		}
	}
	assert.Equal(t, CallOffset+MaxBlocks*16, FusedRowSyncOffset, "right after the call's 64 reserved vectors")
	assert.Equal(t, FusedRowSyncOffset+4*MaxSplitRows, FusedSumsOffset, "right after fused_rows")
	assert.LessOrEqual(t, FusedSumsOffset+4*MaxPieces*MaxSplitRows, SignalBytes)
}

// TestRowCache: the fused one-shot built with RowCache and the single-rank RMSNorm kernel keep
// the thread's first two vectors of a row in registers for the norm pass, with gamma's loaded
// before the block sum: the norm pass reads memory only past them. The other fused kernels do
// not; RowCache is refused past MaxRowCacheRanks and for the other algorithms; only the cached
// one-shot of 3 and 4 ranks carries a register limit.

func TestRowCache(t *testing.T) {
	cached := func(name, text string) {
		t.Helper()
		for u := range 2 {
			gamma := fmt.Sprintf("@%%gin ld.global.v4.b32 {%%gc%d, %%gc%d, %%gc%d, %%gc%d}, [%%a];", 4*u, 4*u+1, 4*u+2, 4*u+3)
			assert.Equal(t, 1, strings.Count(text, gamma), name)
			// between the sum pass and the block sum
			assert.Less(t, strings.Index(text, "SUMMED:"), strings.Index(text, gamma), name)
			assert.Less(t, strings.Index(text, gamma), strings.Index(text, "==== the row's sum of squares"), name)
			for w := range 4 {
				// kept after the sum pass, taken back by the norm pass
				assert.Equal(t, 1, strings.Count(text, fmt.Sprintf("mov.b32 %%rc%d, ", 4*u+w)), name)
				assert.Equal(t, 1, strings.Count(text, fmt.Sprintf("mov.b32 %%o%d, %%rc%d;", w, 4*u+w)), name)
				assert.Equal(t, 1, strings.Count(text, fmt.Sprintf("mov.b32 %%v%d, %%gc%d;", w, 4*u+w)), name)
			}
		}
		// the vectors past the cache: the loop still reads ResidualOut and gamma back
		assert.Equal(t, 1, strings.Count(text, "add.u64 %a, %rout, %a;\n\tld.global.v4.b32 {%o0, %o1, %o2, %o3}, [%a];"), name)
	}
	for _, dt := range dtype.All {
		for _, target := range []Target{SM80, SM90} {
			s := NormSpec{DType: dt, Target: target}
			cached(s.EntryName(), string(mustGenerate(t, s.Generate)))
		}
	}
	for _, s := range allFusedSpecs() {
		text := string(mustGenerate(t, s.Generate))
		assert.Equal(t, (s.RowCache || s.Algo == Columns) && s.WorldSize >= 3 && s.WorldSize <= 4, strings.Contains(text, "\n.maxnreg 64\n"), s.EntryName())
		if s.Algo == Columns {
			columnsCached(t, s.EntryName(), text)
			continue
		}
		if s.RowCache {
			assert.Contains(t, s.EntryName(), "_oneshot_rc_", s.EntryName())
		}
		if s.RowCache || s.Algo == Push {
			cached(s.EntryName(), text)
			continue
		}
		assert.False(t, strings.Contains(text, "%rc") || strings.Contains(text, "%gc"), "%s keeps no row cache", s.EntryName())
	}
	for _, bad := range []FusedSpec{
		{Algo: OneShot, DType: dtype.BFloat16, WorldSize: MaxRowCacheRanks + 1, Target: SM90, RowCache: true},
		{Algo: TwoShot, DType: dtype.BFloat16, WorldSize: 2, Target: SM90, RowCache: true},
		{Algo: Push, DType: dtype.BFloat16, WorldSize: 2, Target: SM90, RowCache: true},
	} {
		_, err := bad.Generate()
		assert.ErrorContains(t, err, "RowCache is for the one-shot", "%v of %d", bad.Algo, bad.WorldSize)
	}
}

// columnsCached checks the Columns kernel's row cache: stage 2 reads each of a thread's first
// two vectors of the row once, for its squares, keeps them for the norm pass (with gamma's,
// loaded after the squares and before the block sum), and reads back only the vectors past
// them.
func columnsCached(t *testing.T, name, text string) {
	t.Helper()
	squared := strings.Index(text, "SQUARED:")
	require.Positive(t, squared, name)
	for u := range 2 {
		gamma := fmt.Sprintf("@%%gin ld.global.v4.b32 {%%gc%d, %%gc%d, %%gc%d, %%gc%d}, [%%a];", 4*u, 4*u+1, 4*u+2, 4*u+3)
		assert.Equal(t, 1, strings.Count(text, gamma), name)
		assert.Less(t, squared, strings.Index(text, gamma), name)
		assert.Less(t, strings.Index(text, gamma), strings.Index(text, "==== the row's sum of squares"), name)
		// one row at a time, and two (columnpair: both rows' vectors, then gamma's, loaded
		// before any squares, and each row normed from its cache)
		for w := range 4 {
			assert.Equal(t, 2, strings.Count(text, fmt.Sprintf("mov.b32 %%rc%d, ", 4*u+w)), name)
			assert.Equal(t, 2, strings.Count(text, fmt.Sprintf("mov.b32 %%o%d, %%rc%d;", w, 4*u+w)), name)
			assert.Equal(t, 1, strings.Count(text, fmt.Sprintf("mov.b32 %%o%d, %%rd%d;", w, 4*u+w)), name)
		}
		pair := strings.Index(text, "==== two rows at once")
		require.Positive(t, pair, name)
		squares := pair + strings.Index(text[pair:], "mul.rn.f32 %x, %x, %x;")
		for _, c := range []string{"%rc", "%rd"} {
			load := fmt.Sprintf("@%%pv%d ld.global.v4.b32 {%%%s%d, %%%s%d, %%%s%d, %%%s%d}, [", u, c[1:], 4*u, c[1:], 4*u+1, c[1:], 4*u+2, c[1:], 4*u+3)
			// direct, and through tmp
			assert.Equal(t, 2, strings.Count(text, load), name)
			assert.Less(t, strings.LastIndex(text, load), squares, name)
		}
		pairGamma := fmt.Sprintf("@%%pv%d ld.global.v4.b32 {%%gc%d, %%gc%d, %%gc%d, %%gc%d}, [%%a];", u, 4*u, 4*u+1, 4*u+2, 4*u+3)
		assert.Equal(t, 1, strings.Count(text, pairGamma), name)
		assert.Less(t, strings.Index(text, pairGamma), squares, name)
	}
	// the squares read the row in three places (two cached vectors, then the loop), each from
	// the own ResidualOut (direct) or from the owner's tmp, stored into the own ResidualOut
	// (through tmp); the norm pass reads back once (past the cache)
	assert.Equal(t, 3, strings.Count(text, "add.u64 %a, %rout, %off;\n\tld.global.v4.b32 {"), name)
	assert.Equal(t, 3, strings.Count(text, "mad.wide.u32 %q, %slot, 16, %q;\n\tld.global.v4.b32 {"), name)
	assert.Equal(t, 3, strings.Count(text, "add.u64 %a, %rout, %off;\n\tst.global.v4.b32 [%a], {"), name)
	assert.Equal(t, 1, strings.Count(text, "add.u64 %a, %rout, %a;\n\tld.global.v4.b32 {"), name)
}

// TestSplitExitBarrier: the fused one-shot's row-cache build splits its exit barrier. The block
// checks the peers' calls and arrives right after the sum pass of its last row (before the
// block sum), or at the end if it had no row or a failed slot check, and waits for the peers
// once, at the end, after the PDL trigger. The other fused kernels keep the whole barrier.
func TestSplitExitBarrier(t *testing.T) {
	for _, s := range allFusedSpecs() {
		text := string(mustGenerate(t, s.Generate)) // the markers are comments
		name := s.EntryName()
		if !s.RowCache {
			assert.NotContains(t, text, "exit barrier, arrive", name)
			assert.NotContains(t, text, "exit barrier, wait", name)
			continue
		}
		assert.NotContains(t, text, "==== exit barrier:", name)
		arrive := "==== exit barrier, arrive"
		require.Equal(t, 2, strings.Count(text, arrive), name)
		require.Equal(t, 1, strings.Count(text, "==== exit barrier, wait"), name)
		first := strings.Index(text, arrive)
		second := first + len(arrive) + strings.Index(text[first+len(arrive):], arrive)
		wait := strings.Index(text, "==== exit barrier, wait")
		// after the sum pass, before the block sum; the call check right before each arrival
		assert.Less(t, strings.Index(text, "SUMMED:"), first, name)
		assert.Less(t, first, strings.Index(text, "==== the row's sum of squares"), name)
		check := "==== call check, second half"
		assert.Equal(t, 2, strings.Count(text, check), name)
		assert.Less(t, strings.Index(text, check), first, name)
		assert.Less(t, strings.LastIndex(text, check), second, name)
		assert.Less(t, first, strings.LastIndex(text, check), name)
		// the late arrival and the wait at the end, the PDL trigger between them
		assert.Less(t, strings.Index(text, "DONE:"), second, name)
		assert.Less(t, second, wait, name)
		if s.Target == SM90 {
			trigger := strings.LastIndex(text, "griddepcontrol.launch_dependents")
			assert.Less(t, second, trigger, name)
			assert.Less(t, trigger, wait, name)
		}
		// the arrive half advances the round and tells the peers; the wait half only polls
		half := text[wait:]
		assert.NotContains(t, half, "add.u32 %round, %round, 1;", name)
		assert.NotContains(t, half, "red.relaxed.gpu.global.add.u32", name)
		assert.NotContains(t, half, "st.volatile.global.u32 [%flag+", name)
		assert.Contains(t, half, "SPIN:", name)
		between := text[first:second]
		assert.Equal(t, 1, strings.Count(between, "add.u32 %round, %round, 1;"), name)
		assert.NotContains(t, between, "SPIN:", name)
	}
}
