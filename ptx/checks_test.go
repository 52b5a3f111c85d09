package ptx

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

func TestCallFingerprint(t *testing.T) {
	c := Call{Op: OpAllReduce, Algo: TwoShot, DType: dtype.BFloat16, Count: 1024}
	fp := c.Fingerprint()
	assert.Equal(t, uint64(1)<<56|uint64(TwoShot)<<48|uint64(dtype.BFloat16)<<40|1024, fp)
	assert.Equal(t, c, DecodeCall(fp))
	assert.Equal(t, "all-reduce of 1024 bf16 elements (twoshot)", c.String())
	assert.Equal(t, "all-reduce of 1 f32 element (push)", Call{Op: OpAllReduce, Algo: Push, DType: dtype.Float32, Count: 1}.String())
	assert.Equal(t, "all-reduce of 7 f16 elements (oneshot, input through the staging buffer)", Call{Op: OpAllReduce, Algo: OneShot, DType: dtype.Float16, Count: 7, Staged: true}.String())
	assert.Equal(t, "all-reduce of 1024 bf16 elements (twoshot, straight into every rank's output)", Call{Op: OpAllReduce, Algo: TwoShot, DType: dtype.BFloat16, Count: 1024, Direct: true}.String())
	assert.Equal(t, uint64(1)<<54|fp, Call{Op: OpAllReduce, Algo: TwoShot, DType: dtype.BFloat16, Count: 1024, Direct: true}.Fingerprint())
	assert.Equal(t, "no call", DecodeCall(0).String())
	assert.Equal(t, "op(9) of 3 f16 elements (oneshot)", Call{Op: 9, Algo: OneShot, DType: dtype.Float16, Count: 3}.String())

	// every field change changes the fingerprint, and no all-reduce fingerprint is 0
	seen := map[uint64]Call{}
	for _, algo := range Algorithms {
		for _, dt := range dtype.All {
			for _, n := range []uint64{0, 1, 2, 1023, 1024, 1 << 32, 1<<40 - 1} {
				for _, staged := range []bool{false, true} {
					for _, direct := range []bool{false, true} {
						c := Call{OpAllReduce, algo, dt, n, staged, direct}
						fp := c.Fingerprint()
						require.NotZero(t, fp)
						require.Equal(t, c, DecodeCall(fp))
						if other, dup := seen[fp]; dup {
							t.Fatalf("%v and %v share fingerprint %#x", c, other, fp)
						}
						seen[fp] = c
					}
				}
			}
		}
	}
	// counts beyond 40 bits keep their low bits
	assert.Equal(t, uint64(5), DecodeCall(Call{Op: OpAllReduce, Algo: Push, DType: dtype.Float32, Count: 1<<40 + 5}.Fingerprint()).Count)
}

func TestErrCodeAndPhaseStrings(t *testing.T) {
	assert.Equal(t, []string{"no error", "timeout", "unfilled registration slot", "call mismatch", "error code 7"},
		[]string{ErrCode(0).String(), ErrCodeTimeout.String(), ErrCodeUnfilledSlot.String(), ErrCodeMismatch.String(), ErrCode(7).String()})
	assert.Equal(t, []string{"none", "entry barrier", "middle barrier", "exit barrier", "push receive", "phase 9"},
		[]string{PhaseNone.String(), PhaseEntry.String(), PhaseMiddle.String(), PhaseExit.String(), PhasePush.String(), Phase(9).String()})
}

func TestPushSlotBytes(t *testing.T) {
	assert.Equal(t, int64(PushHeaderBytes), PushSlotBytes(0))
	assert.Equal(t, int64(PushHeaderBytes), PushSlotBytes(-5))
	assert.Equal(t, int64(PushHeaderBytes+16), PushSlotBytes(2))
	assert.Equal(t, int64(PushHeaderBytes+16), PushSlotBytes(16))
	assert.Equal(t, int64(PushHeaderBytes+512<<10), PushSlotBytes(512<<10))
	// every message the host lets through fits: nvec = ceil(bytes/16) whole vectors after the headers
	for n := int64(1); n <= 100; n++ {
		nvec := (n + VectorBytes - 1) / VectorBytes
		assert.GreaterOrEqual(t, PushSlotBytes(n), PushHeaderBytes+nvec*VectorBytes, "%d bytes", n)
		assert.Zero(t, PushSlotBytes(n)%VectorBytes, "slots stay vector aligned")
	}
}

// callCheck is the decision of the kernels' call check (templates: callcheck, calldiff) on the
// words loaded from a peer: pass, load again, or mismatch.
type callVerdict int

const (
	callSame callVerdict = iota
	callReload
	callMismatch
)

func callCheck(loaded, expected [4]uint32) callVerdict {
	var x uint32
	for i := range loaded {
		x |= loaded[i] ^ expected[i]
	}
	switch {
	case x == 0:
		return callSame
	case x&0xFFFF0000 != 0:
		return callReload
	}
	return callMismatch
}

// TestCallWords checks the call check's encoding: the words round-trip, a peer's words of an
// earlier round (or a torn mix of two writes) are never taken for a call, and the same round
// with another call is always a mismatch.
func TestCallWords(t *testing.T) {
	mine := Call{OpAllReduce, OneShot, dtype.BFloat16, 1000, false, false}.Fingerprint()
	calls := []uint64{
		mine,
		Call{OpAllReduce, OneShot, dtype.BFloat16, 1001, false, false}.Fingerprint(),
		Call{OpAllReduce, OneShot, dtype.Float16, 1000, false, false}.Fingerprint(),
		Call{OpAllReduce, TwoShot, dtype.BFloat16, 1000, false, false}.Fingerprint(),
		Call{OpAllReduce, OneShot, dtype.BFloat16, 1000 + 1<<20, false, false}.Fingerprint(),
		// the same call, its input read through the staging buffer
		Call{OpAllReduce, OneShot, dtype.BFloat16, 1000, true, false}.Fingerprint(),
		// the same call, its sums written straight into every rank's output
		Call{OpAllReduce, OneShot, dtype.BFloat16, 1000, false, true}.Fingerprint(),
	}
	for _, round := range []uint32{1, 2, 3, 0xFFFF, 0x10000, 0x10001, 0xFFFFFFFF} {
		want := CallWords(mine, uint16(round))
		for _, fp := range calls {
			w := CallWords(fp, uint16(round))
			assert.Equal(t, fp, CallFromWords(w))
			verdict := callCheck(w, want)
			if fp == mine {
				assert.Equal(t, callSame, verdict)
			} else {
				assert.Equal(t, callMismatch, verdict, "round %#x, call %v", round, DecodeCall(fp))
			}
			// the peer's previous entry barrier was two rounds back (any earlier one: at least
			// two, and fewer than 2^16); its words and every mix with this round's load again
			for _, back := range []uint32{2, 4, 1000} {
				old := CallWords(calls[int(back)%len(calls)], uint16(round-back))
				for mask := range 16 {
					var torn [4]uint32
					for i := range torn {
						torn[i] = w[i]
						if mask&(1<<i) == 0 {
							torn[i] = old[i]
						}
					}
					if mask == 15 {
						continue // the whole new write, checked above
					}
					assert.Equal(t, callReload, callCheck(torn, want), "round %#x back %d mask %04b", round, back, mask)
				}
			}
		}
	}
	// every word of a push header is non-zero, whatever the call
	for _, fp := range append(calls, 0, 1<<56) {
		for i, w := range CallWords(fp, PushHeaderTag) {
			assert.NotZero(t, w, "word %d of %#x", i, fp)
		}
	}
}

// The lines of a "partial" piece: which bytes of the last vector it stores for a given p_tail.
var (
	partialSetpRE  = regexp.MustCompile(`^setp\.(ge|eq)\.u32 %(full|half), %tl, (\d+);$`)
	partialStoreRE = regexp.MustCompile(`^@%(full|half) st\.global\.b(32|16) \[%a\+(\d+)\], %\w+;$`)
)

// runPartial interprets the first "partial" piece of a kernel for one p_tail and returns the
// bytes it writes.
func runPartial(t *testing.T, text string, tail int) []int {
	t.Helper()
	start := strings.Index(text, "ld.param.u32 %tl, [p_tail];")
	require.GreaterOrEqual(t, start, 0, "no partial store")
	end := start + strings.Index(text[start:], "}")
	preds := map[string]bool{}
	var bytes []int
	for _, l := range strings.Split(text[start:end], "\n")[1:] {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		if m := partialSetpRE.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[3])
			preds[m[2]] = (m[1] == "ge" && tail >= n) || (m[1] == "eq" && tail == n)
			continue
		}
		m := partialStoreRE.FindStringSubmatch(l)
		require.NotNil(t, m, "unexpected line in the partial store: %q", l)
		if !preds[m[1]] {
			continue
		}
		bits, _ := strconv.Atoi(m[2])
		at, _ := strconv.Atoi(m[3])
		for b := range bits / 8 {
			bytes = append(bytes, at+b)
		}
	}
	slices.Sort(bytes)
	return bytes
}

// TestPartialStore runs the tail store of every element type for every legal p_tail: it
// writes exactly the first p_tail bytes of the last vector, each once.
func TestPartialStore(t *testing.T) {
	for _, algo := range Algorithms {
		for _, dt := range dtype.All {
			text := code(generate(t, Spec{algo, dt, 3, SM80, ScopeSystem}))
			for tail := dt.Size(); tail <= VectorBytes; tail += dt.Size() {
				var want []int
				for b := range tail {
					want = append(want, b)
				}
				assert.Equal(t, want, runPartial(t, text, tail), "%v %v, p_tail %d", algo, dt, tail)
			}
			assert.Equal(t, dt.Size() == 2, has(text, "st.global.b16"), "%v %v: half-word stores only for 16-bit elements", algo, dt)
		}
	}
}

// TestTailStores checks where the tail rule applies: every store of the all-reduce's output
// (one-shot's, push's, the two-shot's gather and direct stores) goes through the tail test,
// and a whole message (p_tail 16) never takes it.
func TestTailStores(t *testing.T) {
	for _, s := range allSpecs() {
		text := code(generate(t, s))
		name := variantName(s)
		ws := s.WorldSize
		assert.True(t, has(text, "ld.param.u32 %t1, [p_tail];\n\tadd.u32 %lastvec, %nvec, -1;\n\tsetp.ge.u32 %p0, %t1, 16;\n\t@%p0 mov.u32 %lastvec, 0xFFFFFFFF;"), name)
		outstores := strings.Count(text, "setp.eq.u32 %tailv, ")
		partials := strings.Count(text, "ld.param.u32 %tl, [p_tail];")
		// whole-vector stores of data (the re-arm stores zeros; one-shot's staging copy stores
		// whole vectors into the internal staging buffer, TestStageText)
		staging := strings.Count(text, "st.global.v4.b32 [%a], {%c")
		v4 := strings.Count(text, "st.global.v4.b32 [%a], {%") - strings.Count(text, "st.global.v4.b32 [%a], {%zero") - staging
		if s.Algo == OneShot {
			assert.Equal(t, 4, staging, name)
		} else {
			assert.Zero(t, staging, name)
		}
		switch s.Algo {
		case OneShot, Push:
			assert.Equal(t, [3]int{1, 1, 1}, [3]int{outstores, partials, v4}, name)
		case TwoShot:
			// gather: ws stores and the remainder's, each also in the last-vector path;
			// direct: ws stores behind one compare; tmp: one whole store (internal)
			assert.Equal(t, [3]int{ws + 1, 2*ws + 1, 1 + ws + ws + 1 + ws + 1}, [3]int{outstores, partials, v4}, name)
			assert.Equal(t, 1, strings.Count(text, "setp.eq.u32 %p0, %idx, %lastj;"), name)
			assert.Equal(t, 1, strings.Count(text, "setp.eq.u32 %p0, %idx, %lastvec;"), name)
		}
	}
}

// TestCallCheckText checks the call check of the pull kernels in the text, in block 0 alone:
// thread 0 publishes the call in the entry barrier before telling any peer, lane t loads rank
// t's call right after the barrier and tests it before its next arrival, and a mismatch
// records both calls.
func TestCallCheckText(t *testing.T) {
	for _, s := range allSpecs() {
		if s.Algo == Push {
			continue
		}
		text := code(generate(t, s))
		name := variantName(s)
		publish := strings.Index(text, fmt.Sprintf("@%%first st.volatile.global.v4.b32 [%%mine+%d], {%%c0, %%c1, %%c2, %%c3};", CallOffset))
		require.Positive(t, publish, name)
		assert.Equal(t, 1, strings.Count(text, "%first st."), name)
		// block 0 alone: thread 0 of block 0 publishes, lanes of block 0 load and test
		assert.True(t, has(text, "or.b32 %c0, %thread, %block;\n\tsetp.eq.u32 %first, %c0, 0;"), name)
		assert.Equal(t, 2, strings.Count(text, "setp.lt.u32 %lane, %thread, "+strconv.Itoa(s.WorldSize)+";\n\tsetp.eq.and.u32 %lane, %block, 0, %lane;"), name)
		// thread 0 tags the words with its round, and with system scope publishes before its flag
		// store; with counting it has told the peers already, the check then waits for the words
		round := strings.Index(text, "add.u32 %round, %round, 1;")
		assert.Less(t, round, publish, name)
		assert.True(t, has(text, "prmt.b32 %c0, %lo, %round, 0x5410;"), name)
		if s.Scope == ScopeSystem {
			assert.Less(t, publish, strings.Index(text, "st.volatile.global.u32 [%flag+"), name)
		}
		load := strings.Index(text, fmt.Sprintf("ld.volatile.global.v4.b32 {%%cw0, %%cw1, %%cw2, %%cw3}, [%%cp+%d];", CallOffset))
		entryEnd := strings.Index(text, "@%timedout bra EXIT;")
		assert.Less(t, entryEnd, load, name)
		assert.NotContains(t, text[entryEnd:load], "ld.global", name)
		// the test comes before the next barrier's bar.sync, after the data loop
		check := strings.Index(text, "prmt.b32 %e0, %lo, %round, 0x5410;")
		next := strings.Index(text[entryEnd:], "bar.sync 0;") + entryEnd
		assert.Less(t, load, check, name)
		assert.Less(t, check, next, name)
		loop := "LOOP:"
		if s.Algo == TwoShot {
			loop = "SCATTER:"
		}
		assert.Less(t, strings.Index(text, loop), check, name)
		assert.True(t, has(text, "and.b32 %y, %x, 0xFFFF0000;"), name)
		assert.True(t, has(text, fmt.Sprintf("st.global.u32 [%%err+12], %%thread;\n\tst.global.u32 [%%err+16], %d;\n\tld.param.u64 %%fp, [p_call];\n\tst.global.u64 [%%err+24], %%fp;\n\tst.global.u64 [%%err+32], %%theirs;", PhaseEntry)), name)
		assert.Equal(t, 1, strings.Count(text, fmt.Sprintf("st.release.sys.global.u32 [%%err], %d;", ErrCodeMismatch)), name)
	}
}

// TestPushHeaderText checks the push call header in the text: lane s of block 0 (alone)
// sends this rank's call to header[0] of slot (t, rank) of rank s, the data follows the
// headers, and lane s of block 0 checks and re-arms rank s's header, and watches it while it
// waits for data.
func TestPushHeaderText(t *testing.T) {
	for _, s := range allSpecs() {
		if s.Algo != Push {
			continue
		}
		text := code(generate(t, s))
		name := variantName(s)
		assert.Equal(t, 1, strings.Count(text, "st.volatile.global.v4.b32 [%q], {%c0, %c1, %c2, %c3};"), name)
		assert.True(t, has(text, fmt.Sprintf("mov.u32 %%tag, %d;", PushHeaderTag)), name)
		assert.Equal(t, s.WorldSize, strings.Count(text, fmt.Sprintf("st.volatile.global.v4.b32 [%%a+%d], {%%v0, %%v1, %%v2, %%v3};", PushHeaderBytes)), name)
		assert.True(t, has(text, fmt.Sprintf("add.u64 %%recv, %%recv, %d;", PushHeaderBytes)), name)
		assert.Equal(t, s.WorldSize >= DeferRearmMinRanks, has(text, fmt.Sprintf("add.u64 %%base, %%base, %d;", PushHeaderBytes)), name)
		// the header is loaded before the receive loop, checked after it and while waiting
		first := strings.Index(text, "ld.volatile.global.v4.b32 {%hd0, %hd1, %hd2, %hd3}, [%q];")
		assert.Less(t, first, strings.Index(text, "RECEIVE:"), name)
		assert.Equal(t, 3, strings.Count(text, "ld.volatile.global.v4.b32 {%hd0, %hd1, %hd2, %hd3}, [%q];"), name)
		assert.Equal(t, 2, strings.Count(text, fmt.Sprintf("st.global.u32 [%%err+12], %%thread;\n\tst.global.u32 [%%err+16], %d;\n\tld.param.u64 %%fp, [p_call];\n\tst.global.u64 [%%err+24], %%fp;\n\tst.global.u64 [%%err+32], %%theirs;", PhasePush)), name)
		assert.Equal(t, 1, strings.Count(text, "st.global.v4.b32 [%q], {%zero, %zero, %zero, %zero};"), name)
		// the loop's end checks the header; give-ups skip it
		assert.True(t, has(text, "@%p0 bra HEADER;"), name)
		// block 0's lanes alone: the early load, the send, the check and the poll while waiting
		lane := fmt.Sprintf("setp.eq.u32 %%p0, %%block, 0;\n\tsetp.lt.and.u32 %%p0, %%thread, %d, %%p0;", s.WorldSize)
		assert.Equal(t, 4, strings.Count(text, lane), name)
		assert.NotContains(t, text, "setp.lt.u32 %p0, %thread, "+fmt.Sprint(s.WorldSize)+";", name)
		assert.NotContains(t, text, "mad.wide.u32 %q, %block, 16, %q;", "%s: header[0] only", name)
	}
}

var recordStoreRE = regexp.MustCompile(`^st\.global\.u(32|64) \[%err\+(\d+)\], (\S+);$`)

// TestErrorRecord checks every error record a kernel can write. A record that the host can
// see claimed before its words are there reads as rank 0, peer 0, phase 0; so the claim is a
// compare-and-swap of the claim word, the winner writes every other word, and only then done
// and the code, with system-scope release stores, as the last two stores (nothing else ever
// writes the code or done). Timeouts name the rank waited for and a real phase.
func TestErrorRecord(t *testing.T) {
	claim := fmt.Sprintf("atom.global.cas.b32 %%old, [%%err+%d], 0, 1;", 4*ErrWordClaim)
	for _, s := range allSpecs() {
		text := code(generate(t, s))
		name := variantName(s)
		assert.Equal(t, strings.Count(text, "atom."), strings.Count(text, claim), "%s: every atomic is a record's claim", name)
		lines := strings.Split(text, "\n")
		records := 0
		for i, l := range lines {
			if strings.TrimSpace(l) != claim {
				continue
			}
			records++
			require.Equal(t, "@%lost bra CLAIMED;", strings.TrimSpace(lines[i+2]), name)
			words := map[int]string{}
			var tail []string
			j := i + 3
			for ; strings.TrimSpace(lines[j]) != "CLAIMED:"; j++ {
				l := strings.TrimSpace(lines[j])
				require.False(t, strings.Contains(l, "bra ") || strings.HasSuffix(l, ":"), "%s: a branch or label inside a record: %s", name, l)
				if m := recordStoreRE.FindStringSubmatch(l); m != nil {
					off, _ := strconv.Atoi(m[2])
					words[off] = m[3]
					continue
				}
				if strings.HasPrefix(l, "st.") {
					tail = append(tail, l)
				}
			}
			require.Len(t, tail, 2, "%s: record at line %d", name, i)
			assert.Equal(t, fmt.Sprintf("st.release.sys.global.u32 [%%err+%d], 1;", 4*ErrWordDone), tail[0], name)
			require.True(t, strings.HasPrefix(tail[1], "st.release.sys.global.u32 [%err], "), "%s: the code is the last store: %s", name, tail[1])
			assert.Equal(t, tail[1], strings.TrimSpace(lines[j-1]), "%s: nothing after the code", name)
			codeWord, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(tail[1], "st.release.sys.global.u32 [%err], "), ";"))
			// every word but code, done and claim, and the call words as u64
			for _, off := range []int{4, 8, 12, 16, 24, 32, 44, 48, 56} {
				assert.Contains(t, words, off, "%s: record at line %d does not write byte %d", name, i, off)
			}
			assert.Equal(t, "%rank", words[4], name)
			assert.Equal(t, "%block", words[8], name)
			assert.Equal(t, "%fp", words[24], name)
			phase, _ := strconv.Atoi(words[16])
			peer := words[12]
			switch ErrCode(codeWord) {
			case ErrCodeTimeout:
				if s.Algo == Push {
					assert.Equal(t, int(PhasePush), phase, name)
					assert.Contains(t, []string{"%peer", "%thread"}, peer, name)
				} else {
					assert.Contains(t, []int{int(PhaseEntry), int(PhaseMiddle), int(PhaseExit)}, phase, name)
					assert.Equal(t, "%thread", peer, name)
				}
				assert.Equal(t, "0", words[32], name)
			case ErrCodeUnfilledSlot:
				assert.Equal(t, [2]string{"%badpeer", "0"}, [2]string{peer, words[16]}, name)
			case ErrCodeMismatch:
				assert.Equal(t, "%thread", peer, name)
				assert.Equal(t, "%theirs", words[32], name)
			default:
				t.Errorf("%s: record with code %d", name, codeWord)
			}
		}
		assert.Positive(t, records, name)
		// nothing else writes the code or done
		assert.Equal(t, records, strings.Count(text, "[%err], "), name)
		assert.Equal(t, records, strings.Count(text, fmt.Sprintf("[%%err+%d], ", 4*ErrWordDone)), name)
	}
	// the push watchdog names the lowest missing rank, found from this poll's missing set
	push := code(generate(t, Spec{Push, dtype.BFloat16, 8, SM90, ScopeSystem}))
	assert.True(t, has(push, "brev.b32 %t0, %missing;\n\tclz.b32 %peer, %t0;"))
}
