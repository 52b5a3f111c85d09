package ptx

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

// allFusedSpecs lists every fused kernel: 2 algorithms x 3 types x 15 world sizes x 2
// targets x 2 scopes = 360.
func allFusedSpecs() []FusedSpec {
	var specs []FusedSpec
	for _, scope := range Scopes {
		for _, target := range []Target{SM80, SM90} {
			for _, algo := range []Algorithm{OneShot, TwoShot} {
				for _, dt := range dtype.All {
					for ws := 2; ws <= MaxRanks; ws++ {
						specs = append(specs, FusedSpec{Algo: algo, DType: dt, WorldSize: ws, Target: target, Scope: scope})
					}
				}
			}
		}
	}
	return specs
}

func TestFusedEntrySignature(t *testing.T) {
	specs := allFusedSpecs()
	require.Len(t, specs, 360)
	names := map[string]bool{}
	for _, s := range specs {
		src, err := s.Generate()
		require.NoError(t, err, s.EntryName())
		entry, params, err := ParseEntryParams(src)
		require.NoError(t, err, s.EntryName())
		assert.Equal(t, s.EntryName(), entry)
		assert.Equal(t, FusedParams(s.WorldSize), params, s.EntryName())
		names[s.EntryName()+s.Target.String()] = true
	}
	assert.Len(t, names, 360)
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
