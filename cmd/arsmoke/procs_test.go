package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runProcs runs a --procs parent in this process; its children are this
// test binary (see TestMain), with a fake engine in the given mode, or the
// real one when mode is "".
func runProcs(t *testing.T, mode string, args ...string) (code int, stdout, stderr string, took time.Duration) {
	t.Helper()
	if mode != "" {
		t.Setenv(envFake, mode)
	}
	var out, errOut bytes.Buffer
	start := time.Now()
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String(), time.Since(start)
}

// TestProcsWithoutGPU runs --procs where no GPU is visible: every child
// fails, and the parent says so and exits 1 quickly instead of hanging.
func TestProcsWithoutGPU(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	code, stdout, stderr, took := runProcs(t, "", "--procs", "2", "-e", "4K", "--timeout", "5s")
	assert.Equal(t, exitFail, code)
	assert.Less(t, took, 20*time.Second)
	assert.Empty(t, stdout)
	assert.Regexp(t, `(?m)^rank [01]: arsmoke: FAIL — `, stderr)
	assert.Regexp(t, `(?m)^arsmoke: --procs 2: rank [01] failed \(exit status 1\)`, stderr)

	// With --json, stdout is one JSON document all the same, whichever rank ends first.
	for range 5 {
		code, r, _ := procsReport(t, "", "--procs", "2", "-e", "4K", "--timeout", "5s")
		assert.Equal(t, exitFail, code)
		assert.False(t, r.Verdict.Pass)
		assert.NotEmpty(t, r.Error)
	}
}

func TestProcsPass(t *testing.T) {
	code, stdout, stderr, _ := runProcs(t, "ok", "--procs", "3", "-b", "1K", "-e", "4K")
	require.Equal(t, exitPass, code, stderr)
	assert.Empty(t, stderr)
	assert.Equal(t, 1, strings.Count(stdout, "# Algorithm: auto"), "only rank 0 prints the table:\n%s", stdout)
	assert.Contains(t, stdout, "# 3 ranks, 3 processes, all on GPU 0\n")
	assert.Contains(t, stdout, "#  Rank  0 Pid    4242 device  0 [0000:18:00.0] NVIDIA H200\n")
	assert.True(t, strings.HasSuffix(stdout, "arsmoke: PASS — 3 ranks, bf16, 3 sizes, 0 wrong\n"), stdout)
}

// TestProcsOneFails: rank 1 cannot set up; every process stops with its reason, which rank 0
// reports once.
func TestProcsOneFails(t *testing.T) {
	code, _, stderr, took := runProcs(t, "fail1", "--procs", "2", "-b", "1K", "-e", "4K", "--timeout", "30s")
	assert.Equal(t, exitFail, code)
	assert.Less(t, took, 20*time.Second, "a failed rank stops the others at once, not after --timeout")
	const verdict = "arsmoke: FAIL — 2 ranks, bf16, 3 sizes: set up 2 ranks, 2 processes, all on GPU 0: rank 1: fake child: rank 1 cannot join\n"
	assert.Contains(t, stderr, "rank 0: "+verdict)
	assert.Equal(t, 1, strings.Count(stderr, verdict), "rank 1 does not repeat what rank 0 said:\n%s", stderr)
	assert.NotContains(t, stderr, "arsmoke: --procs 2:", "the ranks' verdict names rank 1; the parent blames no rank that merely exited first")
}

// TestProcsVerdictBlamesNoRank: with wrong results on rank 1 every rank exits with the run's
// verdict, which rank 0 printed; whichever exits first, the parent does not report it as the
// rank that failed.
func TestProcsVerdictBlamesNoRank(t *testing.T) {
	for range 3 {
		code, stdout, stderr, _ := runProcs(t, "wrong1", "--procs", "2", "-b", "1K", "-e", "4K")
		assert.Equal(t, exitFail, code)
		assert.Contains(t, stdout, "rank 1, element 3")
		assert.NotContains(t, stderr, "failed (exit status", "no rank is blamed for the verdict")
	}
}

// TestProcsJSONWithoutRank0Report: with --json, stdout is one JSON document also when rank 0
// printed none (here rank 0 hangs and is stopped): the parent's, with the failure.
func TestProcsJSONWithoutRank0Report(t *testing.T) {
	code, r, stderr := procsReport(t, "hang0", "--procs", "2", "-b", "1K", "-e", "4K", "--timeout", "1s")
	assert.Equal(t, exitFail, code)
	assert.False(t, r.Verdict.Pass)
	assert.Contains(t, r.Error, "--procs 2: rank 1 failed (exit status 1); stopped ranks 0")
	assert.Equal(t, "arsmoke: FAIL — 2 ranks, bf16, 3 sizes: "+r.Error, r.Verdict.Line)
	assert.Contains(t, stderr, "arsmoke: --procs 2: rank 1 failed (exit status 1); stopped ranks 0\n")
}

// TestProcsOneHangs: rank 0 never finishes its first case; rank 1 waits --timeout for its
// results, then fails naming rank 0, and the parent stops rank 0.
func TestProcsOneHangs(t *testing.T) {
	code, stdout, stderr, took := runProcs(t, "hang0", "--procs", "2", "-b", "1K", "-e", "4K", "--timeout", "1s")
	assert.Equal(t, exitFail, code)
	assert.Less(t, took, 20*time.Second)
	assert.Empty(t, stdout)
	assert.Regexp(t, `rank 1: arsmoke: FAIL — 2 ranks, bf16, 3 sizes: auto, 1024 B out-of-place: combine the results with the other ranks': bootstrap rank 1: AllGather #\d+: gave up after \S+ waiting for rank 0 to answer`, stderr)
	assert.Contains(t, stderr, "arsmoke: --procs 2: rank 1 failed (exit status 1); stopped ranks 0\n")
}

// TestProcsOneDoesNotExit: rank 0 prints its results but its process never exits; once rank
// 1 has finished, the parent gives rank 0 --timeout, then stops it.
func TestProcsOneDoesNotExit(t *testing.T) {
	code, stdout, stderr, took := runProcs(t, "hangexit0", "--procs", "2", "-b", "1K", "-e", "4K", "--timeout", "1s")
	assert.Equal(t, exitFail, code)
	assert.Less(t, took, 20*time.Second)
	assert.True(t, strings.HasSuffix(stdout, "arsmoke: PASS — 2 ranks, bf16, 3 sizes, 0 wrong\n"), stdout)
	assert.Contains(t, stderr, "arsmoke: --procs 2: rank 1 finished, but ranks 0 did not exit within --timeout 1s; stopped ranks 0\n")
}

func TestChildEnvironment(t *testing.T) {
	useFake(t, 1, func(engineConfig) (engine, error) { return &fakeEngine{}, nil })
	var out, errOut bytes.Buffer

	t.Setenv(envRank, "0")
	assert.Equal(t, exitUsage, run(nil, &out, &errOut))
	assert.Contains(t, errOut.String(), `arsmoke: ARSMOKE_RANK="0": arsmoke --procs N sets it`)

	errOut.Reset()
	assert.Equal(t, exitUsage, run([]string{"--procs", "2"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "ARSMOKE_RANK is set but ARSMOKE_SOCKET is not")
	assert.Empty(t, out.String())

	errOut.Reset()
	t.Setenv(envSocket, "/tmp/x.sock")
	t.Setenv(bootstrap.TokenEnv, "")
	assert.Equal(t, exitUsage, run([]string{"--procs", "2"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "ARSMOKE_RANK is set but GOCCL_JOB_TOKEN is not")
	assert.Empty(t, out.String())
}

// Every --procs run gives its ranks a fresh job token, in place of any the user's
// environment holds, so that only its own ranks can join each other.
func TestRankEnvCarriesJobToken(t *testing.T) {
	a, err := newJobToken()
	require.NoError(t, err)
	b, err := newJobToken()
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-f]{64}$`, a)
	assert.NotEqual(t, a, b, "tokens are per run")

	env := rankEnv([]string{"HOME=/home/x", bootstrap.TokenEnv + "=the user's own"}, 1, "/d/bootstrap.sock", a)
	assert.Equal(t, []string{
		"HOME=/home/x", envRank + "=1", envSocket + "=/d/bootstrap.sock", bootstrap.TokenEnv + "=" + a,
		envParent + "=" + strconv.Itoa(os.Getpid()),
	}, env)
}

func TestPrefixWriter(t *testing.T) {
	var out bytes.Buffer
	p := &prefixWriter{out: &lockedWriter{w: &out}, prefix: "rank 2: "}
	for _, s := range []string{"first ", "line\nsecond line\nthi", "rd"} {
		n, err := p.Write([]byte(s))
		require.NoError(t, err)
		require.Equal(t, len(s), n)
	}
	assert.Equal(t, "rank 2: first line\nrank 2: second line\n", out.String(), "a partial line waits")
	p.flush()
	assert.Equal(t, "rank 2: first line\nrank 2: second line\nrank 2: third\n", out.String())
}

// TestChildEnvDropsRaisedConnections: a --procs child runs one rank and must not inherit the
// queue count that arsmoke raised for virtual ranks (under MPS, 4 processes x 32 queues exhaust
// the GPU's pool), but keeps one the user set.
func TestChildEnvDropsRaisedConnections(t *testing.T) {
	t.Setenv(collective.MaxConnectionsEnv, "32")
	prev := raisedConnections
	t.Cleanup(func() { raisedConnections = prev })

	raisedConnections = true
	assert.NotContains(t, childEnv(), collective.MaxConnectionsEnv+"=32")
	raisedConnections = false
	assert.Contains(t, childEnv(), collective.MaxConnectionsEnv+"=32", "the user's own setting is passed on")
}

// procsReport runs a --procs parent with --json and decodes rank 0's stdout.
func procsReport(t *testing.T, mode string, args ...string) (code int, r report, stderr string) {
	t.Helper()
	code, stdout, stderr, _ := runProcs(t, mode, append(args, "--json")...)
	require.NoError(t, json.Unmarshal([]byte(stdout), &r), "stdout is not one JSON document:\n%s\nstderr:\n%s", stdout, stderr)
	return code, r, stderr
}

// TestProcsWrongOnOtherRank: each process checks only its own rank's outputs, so what rank 0
// prints must come from every process's counts: rank 1's wrong elements are in rank 0's
// table, JSON and verdict, and every rank exits 1.
func TestProcsWrongOnOtherRank(t *testing.T) {
	const verdict = "arsmoke: FAIL — 2 ranks, bf16, 3 sizes, 30 wrong; first: auto, 1024 B out-of-place, rank 1, element 3: expected 1 (0x3f80), got 0 (0x0000)"
	code, r, stderr := procsReport(t, "wrong1", "--procs", "2", "-b", "1K", "-e", "4K")
	assert.Equal(t, exitFail, code, stderr)
	assert.False(t, r.Verdict.Pass)
	assert.Equal(t, verdict, r.Verdict.Line)
	require.Len(t, r.Blocks, 1)
	assert.EqualValues(t, 30, r.Blocks[0].Wrong, "5 wrong on rank 1 in each of 6 cases")
	for _, row := range r.Blocks[0].Rows {
		assert.EqualValues(t, 5, row.OutOfPlace.Wrong, "%d B", row.Bytes)
		assert.EqualValues(t, 5, row.InPlace.Wrong, "%d B", row.Bytes)
	}
	require.NotNil(t, r.First)
	assert.Equal(t, 1, r.First.Rank)
	assert.Equal(t, 1, strings.Count(stderr, verdict), "rank 1 prints no second copy of the verdict rank 0 printed:\n%s", stderr)

	code, stdout, stderr, _ := runProcs(t, "wrong1", "--procs", "3", "-b", "1K", "-e", "4K")
	assert.Equal(t, exitFail, code)
	assert.True(t, strings.HasSuffix(stdout, "arsmoke: FAIL — 3 ranks, bf16, 3 sizes, 30 wrong; first: auto, 1024 B out-of-place, rank 1, element 3: expected 1 (0x3f80), got 0 (0x0000)\n"), stdout)
	assert.NotContains(t, stderr, "FAIL —", "rank 0's table says it all")
}

// TestProcsSlowestRank: the time of a case is the slowest rank's, also when that rank is
// another process.
func TestProcsSlowestRank(t *testing.T) {
	code, fast, stderr := procsReport(t, "ok", "--procs", "2", "-b", "1K", "-e", "4K")
	require.Equal(t, exitPass, code, stderr)
	// rank 0's header lists every process's rank and device, not its own alone
	require.Len(t, fast.Devices, 2)
	assert.Equal(t, []int{0, 1}, []int{fast.Devices[0].Rank, fast.Devices[1].Rank})
	code, slow, stderr := procsReport(t, "slow1", "--procs", "2", "-b", "1K", "-e", "4K")
	require.Equal(t, exitPass, code, stderr)
	require.Len(t, slow.Blocks, 1)
	require.Len(t, slow.Blocks[0].Rows, 3)
	for i, row := range slow.Blocks[0].Rows {
		want := fast.Blocks[0].Rows[i]
		assert.InDelta(t, 10*want.OutOfPlace.TimeUS, row.OutOfPlace.TimeUS, 0.01, "%d B out of place", row.Bytes)
		assert.InDelta(t, 10*want.InPlace.TimeUS, row.InPlace.TimeUS, 0.01, "%d B in place", row.Bytes)
	}
}

// TestProcsFusedCombined: the fused mode combines the processes' results as the sweep does.
func TestProcsFusedCombined(t *testing.T) {
	args := []string{"--procs", "2", "--fused", "--rows", "1,8"}
	code, fast, stderr := procsReport(t, "ok", args...)
	require.Equal(t, exitPass, code, stderr)
	code, slow, stderr := procsReport(t, "slow1", args...)
	require.Equal(t, exitPass, code, stderr)
	require.Len(t, slow.Fused.Blocks, 1)
	for i, row := range slow.Fused.Blocks[0].Rows {
		want := fast.Fused.Blocks[0].Rows[i]
		assert.InDelta(t, 10*want.FusedUS, row.FusedUS, 0.01, "%d rows", row.Rows)
		assert.InDelta(t, 10*want.UnfusedUS, row.UnfusedUS, 0.01, "%d rows", row.Rows)
	}

	code, wrong, stderr := procsReport(t, "wrong1", args...)
	assert.Equal(t, exitFail, code, stderr)
	assert.False(t, wrong.Verdict.Pass)
	assert.EqualValues(t, 10, wrong.Fused.Blocks[0].Wrong, "5 wrong on rank 1 at each of 2 row counts")
	require.NotNil(t, wrong.Fused.First)
	assert.Equal(t, 1, wrong.Fused.First.Rank)
	assert.Contains(t, wrong.Verdict.Line, "10 wrong; first: auto, 1 rows, unfused call, sum, rank 1, element 3")
}

// TestProcsErrorOnOtherRank: a case that fails on rank 1 ends the sweep on every rank, and
// rank 0's results say which rank failed and why.
func TestProcsErrorOnOtherRank(t *testing.T) {
	code, r, stderr := procsReport(t, "err1", "--procs", "2", "-b", "1K", "-e", "8K")
	assert.Equal(t, exitFail, code, stderr)
	assert.Equal(t, "auto, 4096 B out-of-place: rank 1: fake child: rank 1's launch failed", r.Error)
	require.Len(t, r.Blocks, 1)
	assert.Len(t, r.Blocks[0].Rows, 2, "the sizes measured before the failure")
	assert.Equal(t, 1, strings.Count(stderr, "FAIL —"), "one verdict, rank 0's:\n%s", stderr)
}

// TestProcsTuneWaitsForTheTable: the ranks of --tune --procs wait for rank 0 to write the
// table, here behind another run's lock for longer than --timeout: the parent must not take
// the other ranks' end for the run's and stop rank 0 halfway.
func TestProcsTuneWaitsForTheTable(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tune.json")
	unlock, err := lockFile(out + ".lock") // another --tune run merging its section
	require.NoError(t, err)
	go func() { time.Sleep(3 * time.Second); unlock() }()
	code, stdout, stderr, _ := runProcs(t, "tune", strings.Fields("--tune --procs 2 --device 0 -e 8K --quick --timeout 1s -o "+out)...)
	require.Equal(t, exitPass, code, stderr)
	assert.FileExists(t, out)
	assert.Contains(t, stdout, "wrote "+out)
}

// TestWatchParent: a --procs child's run is cancelled once its parent is gone (its parent
// process id changes), and not before.
func TestWatchParent(t *testing.T) {
	var ppid atomic.Int32
	ppid.Store(4242)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchParent(ctx, cancel, func() int { return int(ppid.Load()) }, 4242, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, ctx.Err(), "the parent is still there")
	ppid.Store(1) // handed to init
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the run went on after its parent was gone")
	}

	// A child orphaned before it could ask: the parent's id from the environment tells.
	orphan, cancelOrphan := context.WithCancel(context.Background())
	defer cancelOrphan()
	watchParent(orphan, cancelOrphan, func() int { return 1 }, 4242, time.Hour)
	assert.Error(t, orphan.Err(), "an orphan's run is cancelled at once")
}
