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
)

// requireGPU skips the test without a usable GPU (see internal/gputest).
func requireGPU(t *testing.T) { gputest.Require(t) }

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
