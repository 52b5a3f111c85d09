package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGPUFused runs the fused mode for real on 4 virtual ranks: both algorithms, eagerly and
// in graphs, every result checked; the JSON report has a time for both calls at every row
// count and nothing wrong.
func TestGPUFused(t *testing.T) {
	requireGPU(t)
	for _, graph := range []bool{false, true} {
		args := []string{"--fused", "--ranks", "4", "--device", "0", "-a", "all", "--rows", "1,7,128", "--hidden", "5120", "-n", "20", "--json"}
		if graph {
			args = append(args, "-g")
		}
		code, stdout := runGPU(t, args...)
		require.Equal(t, exitPass, code)
		var r report
		require.NoError(t, json.Unmarshal([]byte(stdout), &r))
		require.NotNil(t, r.Fused)
		require.Len(t, r.Fused.Blocks, 2)
		for _, b := range r.Fused.Blocks {
			require.Len(t, b.Rows, 3)
			for _, row := range b.Rows {
				assert.Equal(t, b.Algo, row.Path, "a forced algorithm serves the fused call")
				assert.Equal(t, b.Algo, row.PairPath, "and the pair's all-reduce")
				assert.Positive(t, row.FusedUS)
				assert.Positive(t, row.UnfusedUS)
				assert.Zero(t, row.Wrong)
			}
		}
	}
}

// TestGPUFusedProcs: the fused mode across processes on one GPU (the buffers shared through
// CUDA IPC), automatic selection.
func TestGPUFusedProcs(t *testing.T) {
	requireGPU(t)
	code, stdout := runGPU(t, "--fused", "--procs", "2", "--rows", "1,64", "-n", "20")
	assert.Equal(t, exitPass, code)
	assert.Contains(t, stdout, "arsmoke: PASS — 2 ranks, bf16, fused, hidden 8192, 2 row counts, 0 wrong")
}
