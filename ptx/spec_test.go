package ptx

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

// allSpecs lists every kernel goccl ships: 3 x 3 x 15 x 2 x 2 = 540 (fewer world sizes under
// the race detector: testWorldSizes).
func allSpecs() []Spec {
	var specs []Spec
	for _, scope := range Scopes {
		for _, target := range []Target{SM80, SM90} {
			for _, algo := range Algorithms {
				for _, dt := range dtype.All {
					for _, ws := range testWorldSizes {
						specs = append(specs, Spec{Algo: algo, DType: dt, WorldSize: ws, Target: target, Scope: scope})
					}
				}
			}
		}
	}
	return specs
}

// code returns the instructions of a PTX text: comments removed, so that
// counting an instruction does not count the prose about it.
func code(src []byte) string { return lineCommentRE.ReplaceAllString(string(src), "") }

// has reports whether text contains sub, without printing a whole kernel
// when an assertion on it fails.
func has(text, sub string) bool { return strings.Contains(text, sub) }

func variantName(s Spec) string { return s.EntryName() + "_" + s.Target.String() }

func generate(t *testing.T, s Spec) []byte {
	t.Helper()
	src, err := s.Generate()
	require.NoError(t, err, variantName(s))
	return src
}

func TestAllSpecsCount(t *testing.T) {
	specs := allSpecs()
	require.Len(t, specs, 3*3*len(testWorldSizes)*2*len(Scopes))
	names := map[string]bool{}
	for _, s := range specs {
		require.NoError(t, s.Validate())
		names[variantName(s)] = true
	}
	assert.Len(t, names, 3*3*len(testWorldSizes)*2*len(Scopes), "every variant has its own name and target")
}

// TestEntrySignature checks the catalog against the PTX: the .entry of every
// generated kernel has the name EntryName and exactly the parameters of
// Params, so the launcher packs what the kernel reads.
func TestEntrySignature(t *testing.T) {
	for _, s := range allSpecs() {
		entry, params, err := ParseEntryParams(generate(t, s))
		require.NoError(t, err, variantName(s))
		assert.Equal(t, s.EntryName(), entry, variantName(s))
		assert.Equal(t, Params(s.WorldSize), params, variantName(s))
	}
}

func TestParams(t *testing.T) {
	p := Params(8)
	require.Len(t, p, 13)
	var names []string
	for _, q := range p {
		names = append(names, q.Name)
		assert.Zero(t, q.Size%q.Align, "%s: size is a multiple of its alignment", q.Name)
	}
	assert.Equal(t, []string{"p_inputs", "p_outputs", "p_out", "p_nvec", "p_rank", "p_err", "p_timeout", "p_sig", "p_buf", "p_slot", "p_flags", "p_tail", "p_call"}, names)
	assert.Equal(t, Param{"p_tail", 4, 4}, p[11])
	assert.Equal(t, Param{"p_call", 8, 8}, p[12])
	assert.Equal(t, Param{"p_sig", 64, 8}, p[7])
	assert.Equal(t, Param{"p_buf", 24, 8}, Params(3)[8])
	assert.Equal(t, Param{"p_nvec", 4, 4}, p[3])
}

func TestParseEntryParams(t *testing.T) {
	src := []byte(`.version 7.8
.visible .entry k( // a comment with ( and )
	.param .u64 a,
	.param .align 16 .b8 arr[48],
	.param .f32 x, .param .u16 h
)
{ ret; }`)
	entry, params, err := ParseEntryParams(src)
	require.NoError(t, err)
	assert.Equal(t, "k", entry)
	assert.Equal(t, []Param{{"a", 8, 8}, {"arr", 48, 16}, {"x", 4, 4}, {"h", 2, 2}}, params)

	entry, params, err = ParseEntryParams([]byte(".entry empty()\n{ ret; }"))
	require.NoError(t, err)
	assert.Equal(t, "empty", entry)
	assert.Empty(t, params)

	for name, bad := range map[string]string{
		"no entry":    ".version 7.8\n.func f() { ret; }",
		"two entries": ".entry a(.param .u32 x) {ret;}\n.entry b(.param .u32 y) {ret;}",
		"bad type":    ".entry a(.param .pred p) {ret;}",
		"no name":     ".entry a(.param .u32) {ret;}",
	} {
		_, _, err := ParseEntryParams([]byte(bad))
		assert.Error(t, err, name)
	}
}

func TestGenerate(t *testing.T) {
	for _, s := range allSpecs() {
		src := generate(t, s)
		name := variantName(s)
		again, err := s.Generate()
		require.NoError(t, err)
		require.True(t, bytes.Equal(src, again), "%s: Generate is deterministic", name)
		text := string(src)
		instr := code(src)

		assert.False(t, has(text, "\x00"), name)
		// The driver's JIT (CUDA 13) rejects any non-ASCII byte, even in comments, where
		// Debian's ptxas 11.8 accepts it.
		for i, b := range src {
			if b >= 0x80 {
				t.Fatalf("%s: non-ASCII byte %#x at offset %d: the driver's JIT rejects it", name, b, i)
			}
		}
		assert.False(t, has(text, "<no value>"), name)
		assert.True(t, has(text, "\n.version 7.8\n"), name)
		assert.True(t, has(text, "\n.target "+s.Target.String()+"\n"), name)
		assert.True(t, has(text, "\n.address_size 64\n"), name)
		assert.True(t, has(text, "\n.maxntid 512, 1, 1\n"), name)
		assert.Equal(t, 1, strings.Count(instr, ".entry "), name)
		// PDL only where the ISA has it. Every kernel has one trigger that FlagEarlyTrigger
		// alone guards (before its last wait on a peer, %early); the kernels with an entry
		// barrier one right after it, for FlagEarlyTrigger with FlagEntryTrigger (%p0);
		// two-shot one more, after its middle barrier, where the entry trigger did not come
		// (!%p0); push one after a thread's first receive, once a thread. None is unguarded.
		pdl := s.Target == SM90
		assert.Equal(t, pdl, has(instr, "griddepcontrol.wait;"), name)
		assert.Equal(t, pdl, has(instr, "ld.param.u32 %t0, [p_flags];"), name)
		guarded, entry, middle, received := 0, 0, 0, 0
		if pdl {
			guarded = 1
			switch s.Algo {
			case OneShot:
				entry = 1
			case TwoShot:
				entry, middle = 1, 1
			case Push:
				received = 1
			}
		}
		assert.Equal(t, guarded, strings.Count(instr, "@%early griddepcontrol.launch_dependents;"), name)
		assert.Equal(t, entry, strings.Count(instr, "@%p0 griddepcontrol.launch_dependents;"), name)
		assert.Equal(t, middle, strings.Count(instr, "@!%p0 griddepcontrol.launch_dependents;"), name)
		assert.Equal(t, 0, strings.Count(instr, "\tgriddepcontrol.launch_dependents;"), name)
		assert.Equal(t, received, strings.Count(instr, "@%untriggered griddepcontrol.launch_dependents;"), name)
	}
}

// TestArithmetic checks the rules of the element path in the text: no FMA,
// exactly ws-1 round-to-nearest f32 adds per element, one conversion to the
// element type per pair of sums.
func TestArithmetic(t *testing.T) {
	for _, s := range allSpecs() {
		text := code(generate(t, s))
		name := variantName(s)
		elems := VectorBytes / s.DType.Size()
		assert.False(t, has(text, "fma"), name)
		assert.False(t, has(text, "mad.rn"), name)
		assert.Equal(t, (s.WorldSize-1)*elems, strings.Count(text, "add.rn.f32"), name)
		assert.False(t, has(text, "add.f32"), name)
		switch s.DType {
		case dtype.BFloat16:
			assert.Equal(t, 4, strings.Count(text, "cvt.rn.bf16x2.f32 "), name)
			// the high element (odd sum) goes first: it lands in the upper half
			assert.True(t, has(text, "cvt.rn.bf16x2.f32 %o0, %acc1, %acc0;"), name)
		case dtype.Float16:
			assert.Equal(t, 4, strings.Count(text, "cvt.rn.f16x2.f32 "), name)
			assert.True(t, has(text, "cvt.rn.f16x2.f32 %o3, %acc7, %acc6;"), name)
		case dtype.Float32:
			assert.False(t, has(text, "cvt.rn."), name)
		}
	}
}

// TestMemoryOrder checks the flag rule of docs/kernel-abi.md in the text:
// release/acquire only in the two-shot middle barrier and its direct path's
// delivered barrier (and the error record's completion), and in the one-shot entry
// barrier when the kernel stages its input, volatile (or relaxed) flags elsewhere,
// volatile data only in push and the call check. System scope
// stores round numbers into the flags; GPU scope counts arrivals with atomic adds
// and stores no flag.
func TestMemoryOrder(t *testing.T) {
	for _, s := range allSpecs() {
		text := code(generate(t, s))
		name := variantName(s)
		flagStores := strings.Count(text, "st.volatile.global.u32")
		release := strings.Count(text, "st.release.sys.global.u32 [%flag")
		// every error record ends with two system-scope release stores (done, then the code)
		records := strings.Count(text, fmt.Sprintf("atom.global.cas.b32 %%old, [%%err+%d], 0, 1;", 4*ErrWordClaim))
		relaxedAdds := strings.Count(text, "red.relaxed."+s.Scope.PTX()+".global.add.u32")
		acquire := strings.Count(text, "ld.acquire."+s.Scope.PTX()+".global.u32")
		if s.Scope.Counted() {
			release = strings.Count(text, "red.release."+s.Scope.PTX()+".global.add.u32")
			assert.Zero(t, flagStores, name)
			flagStores = relaxedAdds
		} else {
			assert.Zero(t, strings.Count(text, "\tred."), name)
		}
		// and no release or acquire of another kind or scope
		assert.Equal(t, release+2*records, strings.Count(text, ".release."), name)
		assert.Equal(t, acquire, strings.Count(text, "ld.acquire."), name)
		barSync := strings.Count(text, "bar.sync 0;")
		barRed := strings.Count(text, "bar.red.or.pred %timedout, 0, %timedout;")
		// a counting entry barrier polls once before its spin loop, and its second load is
		// volatile (the entry barrier orders nothing), so acquire counts are the same
		got := [5]int{release, acquire, flagStores, barSync, barRed}
		switch s.Algo {
		// the call check's words are volatile: one store (publish), a load after the entry
		// barrier and one in its retry loop
		case OneShot:
			// entry and exit (no (6)) barriers. The entry barrier has no (1) of its own: the
			// staging copy's bar.sync is its (1), and with FlagStageInput its polls acquire
			// (predicated, beside the volatile ones) after a fence before the flag (TestStageText);
			// a counting one polls once before its spin loop too
			acquires := 1
			if s.Scope.Counted() {
				acquires = 2
			}
			assert.Equal(t, [5]int{0, acquires, 2, 2, 1}, got, name)
			assert.Equal(t, 2, strings.Count(text, "ld.volatile.global.v4.b32"), name)
			assert.Equal(t, 1, strings.Count(text, "st.volatile.global.v4.b32"), name)
		case TwoShot: // entry barrier, then the middle one (tmp) or the delivered one (direct, no (6))
			assert.Equal(t, [5]int{2, 2, 1, 2, 2}, got, name)
			assert.Equal(t, 2, strings.Count(text, "ld.volatile.global.v4.b32"), name)
			assert.Equal(t, 1, strings.Count(text, "st.volatile.global.v4.b32"), name)
		case Push: // no barrier; data polled with volatile loads, and the call header
			assert.Equal(t, [5]int{0, 0, 0, 0, 1}, got, name)
			assert.Equal(t, 2*s.WorldSize+3, strings.Count(text, "ld.volatile.global.v4.b32"), name)
			assert.Equal(t, s.WorldSize+1, strings.Count(text, "st.volatile.global.v4.b32"), name)
		}
		// the round counter is read from memory once per kernel: a later barrier continues from
		// the round the lane holds, and every barrier stores its round back
		if s.Algo != Push {
			assert.Equal(t, 1, strings.Count(text, "ld.global.u32 %round,"), name)
			barriers := 2
			if s.Algo == TwoShot {
				barriers = 3 // the middle and the delivered barrier are alternatives
			}
			assert.Equal(t, barriers, strings.Count(text, "add.u32 %round, %round, 1;"), name)
		}
		// every spin loop has a watchdog, every watchdog can claim the record, and every one
		// gives up early once the record is set
		spins := strings.Count(text, "mov.u64 %wd_start, %globaltimer;")
		assert.Equal(t, spins, strings.Count(text, "setp.gt.u64 %p1, %wd_now, %timeout;"), name)
		assert.GreaterOrEqual(t, records, spins, name)
		// (at most once per StaleAfterNs and thread: the next check is due at %wd_next)
		assert.Equal(t, spins, strings.Count(text, fmt.Sprintf("mov.u64 %%wd_next, %d;", StaleAfterNs)), name)
		assert.Equal(t, spins, strings.Count(text, "setp.lt.u64 %p1, %wd_now, %wd_next;"), name)
		assert.Equal(t, spins, strings.Count(text, fmt.Sprintf("add.u64 %%wd_next, %%wd_now, %d;", StaleAfterNs)), name)
		assert.Equal(t, spins, strings.Count(text, "ld.volatile.global.u32 %code, [%err];"), name)
	}
}

// TestTwoShotRotation checks that two-shot takes its inputs in the order
// rank, rank+1, ... and one-shot in rank order 0, 1, ...
func TestTwoShotRotation(t *testing.T) {
	for ws := 2; ws <= MaxRanks; ws++ {
		two := string(generate(t, Spec{TwoShot, dtype.BFloat16, ws, SM90, ScopeSystem}))
		one := string(generate(t, Spec{OneShot, dtype.BFloat16, ws, SM90, ScopeSystem}))
		for i := range ws {
			assert.True(t, has(two, fmt.Sprintf("\tadd.u32 %%src, %%rank, %d;\n\tsetp.ge.u32 %%p0, %%src, %d;\n\t@%%p0 sub.u32 %%src, %%src, %d;\n\tmad.wide.u32 %%a, %%src, 8, %%tab;\n\tld.global.u64 %%in%d, [%%a];", i, ws, ws, i)), "ws %d: %%in%d is rank rank+%d", ws, i, i)
			assert.True(t, has(one, fmt.Sprintf("\tmov.u32 %%src, %d;\n\tmad.wide.u32 %%a, %%src, 8, %%tab;\n\tld.global.u64 %%in%d, [%%a];", i, i)), "ws %d: %%in%d is rank %d", ws, i, i)
		}
	}
}

// TestZeroLanes checks the bit trick of the zerolanes piece with the masks
// the kernels use: the result has the sign bit of exactly the all-zero
// elements of a word.
func TestZeroLanes(t *testing.T) {
	masks := func(k *kernel) (lane, sign uint32) {
		_, err := fmt.Sscanf(k.LaneMask+" "+k.SignMask, "0x%x 0x%x", &lane, &sign)
		require.NoError(t, err)
		return lane, sign
	}
	zerolanes := func(w, lane, sign uint32) uint32 { return ^(((w & lane) + lane) | w) & sign }

	lane, sign := masks(newKernel(Spec{Push, dtype.BFloat16, 2, SM80, ScopeSystem}))
	for lo := range uint32(1 << 16) {
		for _, hi := range []uint32{0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, lo} {
			w := hi<<16 | lo
			var want uint32
			if lo == 0 {
				want |= 0x8000
			}
			if hi == 0 {
				want |= 0x80000000
			}
			if got := zerolanes(w, lane, sign); got != want {
				t.Fatalf("word %#08x: zerolanes gives %#08x, want %#08x", w, got, want)
			}
		}
	}
	lane, sign = masks(newKernel(Spec{Push, dtype.Float32, 2, SM80, ScopeSystem}))
	for _, w := range []uint32{0, 1, 0x80000000, 0x7fffffff, 0xffffffff, 0x00010000, 0x3f800000} {
		want := uint32(0)
		if w == 0 {
			want = 0x80000000
		}
		assert.Equal(t, want, zerolanes(w, lane, sign), "word %#08x", w)
	}
}

// TestAnyZero checks the test of the "missing" piece: (w - low) & ^w, masked with the sign
// bits, is non-zero exactly when some element of the word is all-zero bits.
func TestAnyZero(t *testing.T) {
	anyZero := func(k *kernel, w uint32) bool {
		var low, sign uint32
		_, err := fmt.Sscanf(k.LowOnes+" "+k.SignMask, "0x%x 0x%x", &low, &sign)
		require.NoError(t, err)
		return (w-low)&^w&sign != 0
	}
	half := newKernel(Spec{Push, dtype.BFloat16, 2, SM80, ScopeSystem})
	for lo := range uint32(1 << 16) {
		for _, hi := range []uint32{0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, lo} {
			w := hi<<16 | lo
			if got, want := anyZero(half, w), lo == 0 || hi == 0; got != want {
				t.Fatalf("word %#08x: any-zero test gives %v, want %v", w, got, want)
			}
		}
	}
	full := newKernel(Spec{Push, dtype.Float32, 2, SM80, ScopeSystem})
	for _, w := range []uint32{0, 1, 0x80000000, 0x7fffffff, 0xffffffff, 0x00010000, 0x3f800000} {
		assert.Equal(t, w == 0, anyZero(full, w), "word %#08x", w)
	}
}

func TestValidate(t *testing.T) {
	good := Spec{OneShot, dtype.BFloat16, 8, SM90, ScopeSystem}
	require.NoError(t, good.Validate())
	cases := []struct {
		spec Spec
		want string
	}{
		{Spec{0, dtype.BFloat16, 8, SM90, ScopeSystem}, "unknown algorithm 0"},
		{Spec{Push + 1, dtype.BFloat16, 8, SM90, ScopeSystem}, "unknown algorithm 4"},
		{Spec{OneShot, dtype.Invalid, 8, SM90, ScopeSystem}, "unsupported element type"},
		{Spec{OneShot, dtype.BFloat16, 1, SM90, ScopeSystem}, "world size 1 out of range"},
		{Spec{OneShot, dtype.BFloat16, 17, SM90, ScopeSystem}, "world size 17 out of range"},
		{Spec{OneShot, dtype.BFloat16, 8, 75, ScopeSystem}, "unknown target 75"},
		{Spec{OneShot, dtype.BFloat16, 8, SM90, ScopeSystemCounted + 1}, "unknown scope 3"},
	}
	for _, c := range cases {
		err := c.spec.Validate()
		require.Error(t, err, "%+v", c.spec)
		assert.Contains(t, err.Error(), c.want)
		src, err := c.spec.Generate()
		assert.Error(t, err, "Generate validates too")
		assert.Nil(t, src)
	}
}

func TestEntryName(t *testing.T) {
	assert.Equal(t, "goccl_oneshot_bf16_w8", Spec{OneShot, dtype.BFloat16, 8, SM90, ScopeSystem}.EntryName())
	assert.Equal(t, "goccl_twoshot_f32_w3", Spec{TwoShot, dtype.Float32, 3, SM80, ScopeSystem}.EntryName())
	assert.Equal(t, "goccl_push_f16_w16", Spec{Push, dtype.Float16, 16, SM90, ScopeSystem}.EntryName())
	assert.Equal(t, "goccl_twoshot_bf16_w8_gpu", Spec{TwoShot, dtype.BFloat16, 8, SM90, ScopeGPU}.EntryName())
	assert.Equal(t, "goccl_oneshot_f16_w4_syscount", Spec{OneShot, dtype.Float16, 4, SM90, ScopeSystemCounted}.EntryName())
	assert.Equal(t, []string{"sys", "gpu", "syscount"}, []string{ScopeSystem.String(), ScopeGPU.String(), ScopeSystemCounted.String()})
	assert.Equal(t, []string{"sys", "gpu", "sys"}, []string{ScopeSystem.PTX(), ScopeGPU.PTX(), ScopeSystemCounted.PTX()})
}

// TestScope checks that the scope changes only the barriers: push is the same instructions
// in every scope, the data path of one-shot and two-shot is, and the counted system-scope
// kernels are the GPU-scope ones with their scope qualifiers widened to the system.
func TestScope(t *testing.T) {
	// the instructions only: comments are removed and the lines they leave blank dropped
	instructions := func(s Spec) []string {
		var lines []string
		for _, l := range strings.Split(code(generate(t, s)), "\n") {
			if strings.TrimSpace(l) != "" {
				lines = append(lines, l)
			}
		}
		return lines
	}
	// the data path: every vector load and store, and the arithmetic
	data := func(lines []string) []string {
		var out []string
		for _, l := range lines {
			if strings.Contains(l, ".v4.") || strings.Contains(l, "add.rn.") || strings.Contains(l, "cvt.rn.") {
				out = append(out, l)
			}
		}
		return out
	}
	for _, s := range allSpecs() {
		if s.Scope != ScopeSystem {
			continue
		}
		gpu := s
		gpu.Scope = ScopeGPU
		sys, other := instructions(s), instructions(gpu)
		for i := range other {
			other[i] = strings.ReplaceAll(other[i], gpu.EntryName(), s.EntryName())
		}
		if s.Algo == Push {
			// no barrier: nothing depends on the scope
			assert.Equal(t, sys, other, variantName(s))
			continue
		}
		// the scope changes the barriers only; the GPU-scope kernel has nothing of system scope
		// but the error record's completion, which the host reads
		assert.Equal(t, data(sys), data(other), variantName(s))
		for _, l := range other {
			if strings.Contains(l, ".sys.") && !strings.Contains(l, "[%err") {
				t.Errorf("%s: system scope outside the error record: %s", variantName(gpu), l)
			}
		}
		// the counted system-scope kernel is the GPU-scope one with every scope qualifier
		// widened to the system: the same protocol, instruction for instruction
		counted := s
		counted.Scope = ScopeSystemCounted
		widened := instructions(counted)
		for i := range widened {
			widened[i] = strings.ReplaceAll(widened[i], counted.EntryName(), s.EntryName())
		}
		for i := range other {
			other[i] = strings.ReplaceAll(other[i], ".gpu.", ".sys.")
			other[i] = strings.ReplaceAll(other[i], "fence.acq_rel.gpu;", "fence.acq_rel.sys;")
		}
		assert.Equal(t, other, widened, variantName(counted))
	}
}

func TestAlgorithm(t *testing.T) {
	for _, a := range Algorithms {
		got, err := ParseAlgorithm(strings.ToUpper(a.String()))
		require.NoError(t, err)
		assert.Equal(t, a, got)
	}
	assert.Equal(t, []string{"oneshot", "twoshot", "push"}, []string{OneShot.String(), TwoShot.String(), Push.String()})
	_, err := ParseAlgorithm("ring")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"ring"`)
	assert.Contains(t, err.Error(), "oneshot, twoshot or push")
	assert.Equal(t, "algorithm(9)", Algorithm(9).String())
}

func TestTargetFor(t *testing.T) {
	for _, c := range []struct {
		major, minor int
		want         Target
	}{{8, 0, SM80}, {8, 6, SM80}, {8, 9, SM80}, {9, 0, SM90}, {10, 0, SM90}, {12, 0, SM90}} {
		got, err := TargetFor(c.major, c.minor)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "%d.%d", c.major, c.minor)
	}
	_, err := TargetFor(7, 5)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrUnsupportedArch))
	assert.Contains(t, err.Error(), "7.5")
	assert.Equal(t, "sm_80", SM80.String())
	assert.Equal(t, "sm_90", SM90.String())
	assert.Equal(t, "target(75)", Target(75).String())
}

// TestABILayout checks that the regions of the signal layout fit and do not
// overlap, and that the generated kernels use the offsets of abi.go.
func TestABILayout(t *testing.T) {
	assert.LessOrEqual(t, SelfCounterOffset+4*MaxBlocks*MaxRanks, PeerCounterOffset)
	assert.LessOrEqual(t, PeerCounterOffset+4*2*MaxBlocks*MaxRanks, PushEpochOffset)
	assert.LessOrEqual(t, PushEpochOffset+4*MaxBlocks, PushPendingOffset)
	assert.LessOrEqual(t, PushPendingOffset+8*MaxBlocks, CallOffset)
	assert.Zero(t, CallOffset%VectorBytes, "call is one 16-byte vector")
	assert.LessOrEqual(t, CallOffset+VectorBytes*MaxBlocks, SignalBytes)
	assert.Equal(t, 16*4, ErrRecordBytes)
	assert.Less(t, ErrWordClaim, ErrRecordBytes/4)

	two := generate(t, Spec{TwoShot, dtype.Float32, 4, SM80, ScopeSystem})
	assert.True(t, bytes.Contains(two, []byte(fmt.Sprintf("[%%flag+%d]", PeerCounterOffset))))
	assert.True(t, bytes.Contains(two, []byte(fmt.Sprintf("mul.lo.u32 %%k, %%k, %d;", MaxBlocks*MaxRanks))))
	push := generate(t, Spec{Push, dtype.Float32, 4, SM80, ScopeSystem})
	assert.True(t, bytes.Contains(push, []byte(fmt.Sprintf("[%%ep+%d]", PushEpochOffset))))
	// the deferred re-arm's record: only where the kernel may defer, with three parts
	assert.False(t, bytes.Contains(push, []byte("%pend")))
	assert.True(t, bytes.Contains(push, []byte("setp.ge.u32 %p0, %epoch, 2;")))
	deferring := generate(t, Spec{Push, dtype.Float32, DeferRearmMinRanks, SM80, ScopeSystem})
	assert.True(t, bytes.Contains(deferring, []byte(fmt.Sprintf("[%%pend+%d]", PushPendingOffset))))
	assert.True(t, bytes.Contains(deferring, []byte("setp.ge.u32 %p0, %epoch, 3;")))
	for ws := 2; ws <= MaxRanks; ws++ {
		want := 2
		if ws >= DeferRearmMinRanks {
			want = 3
		}
		assert.Equal(t, want, PushParts(ws), "ws %d", ws)
	}
	assert.True(t, bytes.Contains(push, []byte(fmt.Sprintf("[%%err+12], %%peer;\n\tst.global.u32 [%%err+16], %d;", PhasePush))))
	one := generate(t, Spec{OneShot, dtype.Float32, 4, SM80, ScopeSystem})
	assert.True(t, bytes.Contains(one, []byte(fmt.Sprintf("st.volatile.global.v4.b32 [%%mine+%d]", CallOffset))))
	assert.True(t, bytes.Contains(one, []byte(fmt.Sprintf("[%%cp+%d]", CallOffset))))
}
