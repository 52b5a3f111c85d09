package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/gputest"
	"github.com/goccl/goccl/nccl"
)

// requireGPU skips the test without a usable GPU (see internal/gputest).
func requireGPU(t *testing.T) { gputest.Require(t) }

// requireNCCL skips without a usable GPU or libnccl.
func requireNCCL(t *testing.T) {
	t.Helper()
	requireGPU(t)
	if err := nccl.Load(); err != nil {
		t.Skipf("no usable libnccl: %v", err)
	}
}

// runGPU runs arsmoke for real and logs what it printed, for the notes.
func runGPU(t *testing.T, args ...string) (code int, stdout string) {
	t.Helper()
	var out, errOut bytes.Buffer
	start := time.Now()
	code = run(args, &out, &errOut)
	t.Logf("arsmoke %s: exit %d in %v\n%s%s", strings.Join(args, " "), code, time.Since(start).Round(time.Millisecond), out.String(), errOut.String())
	return code, out.String()
}

// TestGPUDefault is the run users start with: it must pass, within a
// minute on one H200.
func TestGPUDefault(t *testing.T) {
	requireGPU(t)
	start := time.Now()
	code, stdout := runGPU(t)
	assert.Equal(t, exitPass, code)
	assert.Contains(t, stdout, "arsmoke: PASS — ")
	assert.Less(t, time.Since(start), time.Minute)
}

func TestGPUAllAlgorithmsGraph(t *testing.T) {
	requireGPU(t)
	code, stdout := runGPU(t, "-a", "all", "-g")
	assert.Equal(t, exitPass, code)
	for _, a := range algorithms {
		assert.Contains(t, stdout, "# Algorithm: "+a+"\n")
	}
}

func TestGPUProcs(t *testing.T) {
	requireGPU(t)
	code, stdout := runGPU(t, "--procs", "4", "-e", "1M")
	assert.Equal(t, exitPass, code)
	assert.Contains(t, stdout, "arsmoke: PASS — 4 ranks, ")
}

func TestGPUJSON(t *testing.T) {
	requireGPU(t)
	code, stdout := runGPU(t, "--json", "-d", "f16", "-e", "64K")
	require.Equal(t, exitPass, code)
	var r report
	require.NoError(t, json.Unmarshal([]byte(stdout), &r))
	assert.True(t, r.Verdict.Pass)
	assert.GreaterOrEqual(t, r.Ranks, minWorld)
	assert.Len(t, r.Devices, r.Ranks)
	require.Len(t, r.Blocks, 1)
	require.Len(t, r.Blocks[0].Rows, 7)
	for _, row := range r.Blocks[0].Rows {
		assert.Positive(t, row.OutOfPlace.TimeUS)
		assert.Positive(t, row.InPlace.TimeUS)
		assert.Zero(t, row.OutOfPlace.Wrong+row.InPlace.Wrong)
	}
}

func TestGPUTopo(t *testing.T) {
	requireGPU(t)
	code, stdout := runGPU(t, "--topo")
	assert.Equal(t, exitPass, code)
	assert.NotEmpty(t, stdout)
}

// TestGPUOddSizes: any whole number of elements, through every kernel, on virtual ranks.
func TestGPUOddSizes(t *testing.T) {
	requireGPU(t)
	code, stdout := runGPU(t, "--ranks", "4", "-a", "all", "-b", "2", "-e", "300000", "-f", "7", "-n", "5", "-w", "1")
	assert.Equal(t, exitPass, code)
	assert.Contains(t, stdout, "arsmoke: PASS — 4 ranks, bf16, 3 algorithms x 7 sizes, 0 wrong")
}

// TestGPUProcsBoth compares goccl with NCCL in processes that share one GPU: NCCL takes each
// process for a host of its own (NCCL_HOSTID) and connects them over sockets, while goccl's
// kernels-only communicator shares memory through IPC. Every result must pass its check:
// goccl's bitwise, NCCL's within its tolerance.
func TestGPUProcsBoth(t *testing.T) {
	requireNCCL(t)
	code, stdout := runGPU(t, "--procs", "2", "--backend", "both", "-b", "1K", "-e", "4M", "-f", "4", "-n", "20")
	assert.Equal(t, exitPass, code)
	assert.Contains(t, stdout, "NCCL sees each process as a host of its own")
	assert.Contains(t, stdout, "# Algorithm: auto (goccl) vs nccl\n")
	assert.Contains(t, stdout, "arsmoke: PASS — 2 ranks, bf16, 7 sizes, goccl beside NCCL, 0 wrong")
}

// TestGPUProcsBothGraphJSON: the same in CUDA graphs, every type's tolerance, read as JSON.
func TestGPUProcsBothGraphJSON(t *testing.T) {
	requireNCCL(t)
	for _, dt := range []string{"f32", "f16"} {
		code, stdout := runGPU(t, "--procs", "2", "--backend", "both", "-g", "-d", dt, "-b", "1K", "-e", "256K", "-f", "16", "-n", "10", "--json")
		require.Equal(t, exitPass, code, dt)
		var r report
		require.NoError(t, json.Unmarshal([]byte(stdout), &r))
		require.Len(t, r.Blocks, 1)
		for _, row := range r.Blocks[0].Rows {
			for _, res := range []result{row.OutOfPlace, row.InPlace} {
				require.NotNil(t, res.NCCL)
				assert.Equal(t, "nccl", res.NCCL.Path)
				assert.Positive(t, res.NCCL.TimeUS)
				assert.Positive(t, res.Speedup)
			}
		}
	}
}

// TestGPUProcsNCCL runs every call through NCCL, odd sizes included.
func TestGPUProcsNCCL(t *testing.T) {
	requireNCCL(t)
	code, stdout := runGPU(t, "--procs", "3", "--backend", "nccl", "-d", "f16", "-b", "6", "-e", "1M", "-f", "9", "-n", "10")
	assert.Equal(t, exitPass, code)
	assert.Contains(t, stdout, "arsmoke: PASS — 3 ranks, f16, 6 sizes through NCCL, 0 wrong")
}

// TestGPUNCCLVirtualRanks: NCCL cannot serve ranks sharing a GPU in one process; the run is
// refused as a usage error before anything starts.
func TestGPUNCCLVirtualRanks(t *testing.T) {
	requireGPU(t)
	code, _ := runGPU(t, "--backend", "both", "--device", "0", "--ranks", "2")
	assert.Equal(t, exitUsage, code)
}

// TestGPULargeOnOneGPU: past the 64 MiB at which NCCL would take over, the kernels take every
// size when the communicator cannot have NCCL (virtual ranks).
func TestGPULargeOnOneGPU(t *testing.T) {
	requireGPU(t)
	code, stdout := runGPU(t, "--ranks", "2", "-b", "96M", "-e", "128M", "-n", "3", "-w", "1")
	assert.Equal(t, exitPass, code)
	assert.NotContains(t, stdout, " nccl ")
}

// TestGPULargeThroughNCCL: with one rank per GPU and libnccl, sizes past 64 MiB go to NCCL
// and pass its check.
func TestGPULargeThroughNCCL(t *testing.T) {
	requireNCCL(t)
	gputest.RequireDevices(t, 2)
	code, stdout := runGPU(t, "--ranks", "2", "-b", "32M", "-e", "128M", "-n", "3", "-w", "1")
	assert.Equal(t, exitPass, code)
	assert.Contains(t, stdout, "     nccl ")
	assert.Contains(t, stdout, "goccl's kernels up to 64M")
}
