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

// instructions returns the PTX text without comments and blank lines.
func instructions(src []byte) string {
	var lines []string
	for _, l := range strings.Split(code(src), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, strings.TrimRight(l, " \t"))
		}
	}
	return strings.Join(lines, "\n")
}

// section returns the text from the first from to the first to after it (both included).
func section(t *testing.T, text, from, to, name string) string {
	t.Helper()
	i := strings.Index(text, from)
	require.GreaterOrEqual(t, i, 0, "%s: no %q", name, from)
	j := strings.Index(text[i:], to)
	require.GreaterOrEqual(t, j, 0, "%s: no %q after %q", name, to, from)
	return text[i : i+j+len(to)]
}

// nextInstruction returns the instruction line that follows the first line containing sub.
func nextInstruction(t *testing.T, text, sub, name string) string {
	t.Helper()
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if !strings.Contains(l, sub) {
			continue
		}
		for _, n := range lines[i+1:] {
			if n = strings.TrimSpace(n); n != "" {
				return n
			}
		}
	}
	require.Failf(t, "instruction not found", "%s: %q", name, sub)
	return ""
}

// TestStageText checks the one-shot kernel's staging (FlagStageInput) in the text: the flag
// picks it at run time; the copy reads the input from p_outputs and writes the buffer of the
// rank's own table entry; it ends with a bar.sync before the entry barrier, whose lanes fence
// right before each flag (or count) with the flag, and poll with acquire loads with the flag
// and volatile ones without; the exit barrier and the other kernels are untouched.
func TestStageText(t *testing.T) {
	for _, s := range allSpecs() {
		text := instructions(generate(t, s))
		name := variantName(s)
		scope := s.Scope.PTX()
		fence := fmt.Sprintf("@%%stage fence.acq_rel.%s;", scope)
		if s.Algo != OneShot {
			assert.NotContains(t, text, "%stage", name)
			assert.NotContains(t, text, "fence.", name)
			continue
		}
		// the predicate, from p_flags, and the copy behind it
		assert.True(t, has(text, fmt.Sprintf("ld.param.u32 %%fl, [p_flags];\n\tand.b32 %%fl, %%fl, %d;\n\tsetp.ne.u32 %%stage, %%fl, 0;", FlagStageInput)), name)
		stage := section(t, text, "@!%stage bra STAGED;", "STAGED:", name)
		assert.True(t, has(stage, "ld.param.u64 %src, [p_outputs];\n\tcvta.to.global.u64 %src, %src;"), name)
		assert.True(t, has(stage, "ld.param.u64 %dst, [p_inputs];\n\tcvta.to.global.u64 %dst, %dst;\n\tmad.wide.u32 %dst, %rank, 8, %dst;\n\tld.global.u64 %dst, [%dst];"), name)
		// a nil entry skips the copy but not the bar.sync, which ends the piece
		assert.True(t, has(stage, "setp.eq.u64 %p0, %dst, 0;\n\t@%p0 bra COPIED;"), name)
		assert.True(t, strings.HasSuffix(stage, "COPIED:\n\tbar.sync 0;\n\t}\nSTAGED:"), name)
		assert.Equal(t, 4, strings.Count(stage, "ld.global.v4.b32 {%c"), name)
		assert.Equal(t, 4, strings.Count(stage, "st.global.v4.b32 [%a], {%c"), name)
		assert.Equal(t, 4, strings.Count(stage, "add.u64 %a, %src, %off;"), name)
		assert.Equal(t, 4, strings.Count(stage, "add.u64 %a, %dst, %off;"), name)
		// every load of a pass before its first store
		assert.Less(t, strings.LastIndex(stage, "ld.global.v4.b32 {%c"), strings.Index(stage, "st.global.v4.b32"), name)
		assert.Equal(t, []int{0, 1, 2, 3}, copyPasses(t, stage, name), name)

		// the copy comes before anything touches a peer, and before the entry barrier; the
		// barriers begin where their lanes are picked
		lanes := fmt.Sprintf("setp.lt.u32 %%lane, %%thread, %d;\n\t@!%%lane bra JOINED;", s.WorldSize)
		entry := strings.Index(text, lanes)
		require.Positive(t, entry, name)
		assert.Less(t, strings.Index(text, "STAGED:"), entry, name)
		assert.Less(t, strings.Index(text, "@!%stage bra STAGED;"), strings.Index(text, "ld.param.u64 %tab, [p_inputs];"), name)

		// one fence, right before the lane tells its peer; the acquiring polls only in the entry
		// barrier, each beside the volatile one it replaces
		assert.Equal(t, 1, strings.Count(text, "fence."), name)
		assert.Equal(t, 1, strings.Count(text, fence), name)
		tell := "st.volatile.global.u32 [%flag+"
		if s.Scope.Counted() {
			tell = "red.relaxed." + scope + ".global.add.u32 [%flag+"
		}
		assert.True(t, strings.HasPrefix(nextInstruction(t, text, fence, name), tell), name)
		exit := strings.LastIndex(text, lanes)
		require.Greater(t, exit, entry, name)
		acquire := fmt.Sprintf("@%%stage ld.acquire.%s.global.u32 %%seen, [%%flag+%d];", scope, PeerCounterOffset)
		volatile := fmt.Sprintf("@!%%stage ld.volatile.global.u32 %%seen, [%%flag+%d];", PeerCounterOffset)
		polls := 1
		if s.Scope.Counted() {
			polls = 2 // the first poll before the spin loop too
		}
		assert.Equal(t, polls, strings.Count(text[entry:exit], acquire), name)
		assert.Equal(t, polls, strings.Count(text[entry:exit], acquire+"\n\t"+volatile), name)
		assert.Zero(t, strings.Count(text[exit:], "%stage"), name)
		assert.NotContains(t, text[exit:], "ld.acquire", name)
		assert.Less(t, strings.Index(text, fence), strings.Index(text[entry:], "SPIN:")+entry, name)
	}
}

// TestStageOnlyInOneShot: the fused kernels, which share the barrier piece, are generated
// without the staging parts.
func TestStageOnlyInOneShot(t *testing.T) {
	for _, algo := range []Algorithm{OneShot, TwoShot} {
		for _, scope := range Scopes {
			s := FusedSpec{Algo: algo, DType: dtype.BFloat16, WorldSize: 8, Target: SM90, Scope: scope}
			src, err := s.Generate()
			require.NoError(t, err)
			assert.NotContains(t, code(src), "%stage", s.EntryName())
			assert.NotContains(t, code(src), "fence.", s.EntryName())
		}
	}
}

var (
	passRE = regexp.MustCompile(`(?m)^\t(?:mov\.u32 %j(\d), %idx|mad\.lo\.u32 %j(\d), %stride, (\d), %idx);$`)
	stepRE = regexp.MustCompile(`shl\.b32 %step, %stride, (\d);`)
)

// copyPasses reads the unrolled copy loop: the multiples of the stride that one pass covers
// (vector idx + u*stride for each u), checked against the loop's step and the predicates that
// guard the vectors past the first, and it runs the loop's index arithmetic for a few grids to
// check that every thread copies exactly the vectors it reduces (idx = gtid, gtid + stride, ..).
func copyPasses(t *testing.T, stage, name string) []int {
	t.Helper()
	var us []int
	for _, m := range passRE.FindAllStringSubmatch(stage, -1) {
		if m[1] != "" {
			us = append(us, 0)
			continue
		}
		j, _ := strconv.Atoi(m[2])
		u, _ := strconv.Atoi(m[3])
		require.Equal(t, j, u, "%s: %%j%d is idx + %d*stride", name, j, u)
		us = append(us, u)
		assert.True(t, has(stage, fmt.Sprintf("setp.lt.u32 %%q%d, %%j%d, %%nvec;", u, u)), "%s: vector %d of a pass is guarded", name, u)
		assert.True(t, has(stage, fmt.Sprintf("@%%q%d ld.global.v4.b32", u)) && has(stage, fmt.Sprintf("@%%q%d st.global.v4.b32", u)), name)
	}
	step := stepRE.FindStringSubmatch(stage)
	require.NotNil(t, step, name)
	shift, _ := strconv.Atoi(step[1])
	require.True(t, has(stage, "mov.u32 %idx, %gtid;"), name)
	require.True(t, has(stage, "setp.ge.u32 %p0, %idx, %nvec;\n\t@%p0 bra COPIED;"), name)
	for _, g := range []struct{ nvec, blocks, threads int }{{1, 36, 512}, {5, 2, 64}, {2049, 36, 512}, {100003, 36, 512}, {4097, 3, 96}, {65536, 64, 512}} {
		stride := g.blocks * g.threads
		for gtid := 0; gtid < stride; gtid += 1 + stride/97 {
			var copied, reduced []int
			for idx := gtid; idx < g.nvec; idx += stride << shift {
				for _, u := range us {
					if v := idx + u*stride; v < g.nvec {
						copied = append(copied, v)
					}
				}
			}
			for idx := gtid; idx < g.nvec; idx += stride {
				reduced = append(reduced, idx)
			}
			slices.Sort(copied)
			require.Equal(t, reduced, copied, "%s: nvec %d, grid %dx%d, thread %d", name, g.nvec, g.blocks, g.threads, gtid)
		}
	}
	return us
}
