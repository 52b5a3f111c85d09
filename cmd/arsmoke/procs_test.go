package main

import (
	"bytes"
	"strings"
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

func TestProcsOneFails(t *testing.T) {
	code, _, stderr, took := runProcs(t, "fail1", "--procs", "2", "-b", "1K", "-e", "4K", "--timeout", "30s")
	assert.Equal(t, exitFail, code)
	assert.Less(t, took, 20*time.Second, "a failed rank stops the others at once, not after --timeout")
	assert.Contains(t, stderr, "rank 1: arsmoke: FAIL — 2 ranks, bf16, 3 sizes: set up 2 ranks, 2 processes, all on GPU 0: fake child: rank 1 cannot join\n")
	assert.Contains(t, stderr, "arsmoke: --procs 2: rank 1 failed (exit status 1)")
}

func TestProcsOneHangs(t *testing.T) {
	code, stdout, stderr, took := runProcs(t, "hang0", "--procs", "2", "-b", "1K", "-e", "4K", "--timeout", "1s")
	assert.Equal(t, exitFail, code)
	assert.Less(t, took, 20*time.Second)
	assert.Empty(t, stdout)
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
