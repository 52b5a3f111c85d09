package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

// fakeFused, when set, replaces the fake engine's fused time model; fakeFusedCases records
// the fused cases the fake engines ran. useFakeFused resets both for a test.
var (
	fakeFused      func(FusedCase) (FusedMeasurement, error)
	fakeFusedCases []FusedCase
)

func useFakeFused(t *testing.T, measure func(FusedCase) (FusedMeasurement, error)) {
	t.Helper()
	fakeFused, fakeFusedCases = measure, nil
	t.Cleanup(func() { fakeFused, fakeFusedCases = nil, nil })
}

// RunFused replays a time model: the fused call 6 us plus the bytes at 300 GB/s, the pair
// 9 us plus the bytes at 200 GB/s (through NCCL 20 us plus 150 GB/s); paths as a
// communicator of 8 ranks would pick them.
func (f *fakeEngine) RunFused(_ context.Context, c FusedCase) (FusedMeasurement, error) {
	fakeFusedCases = append(fakeFusedCases, c)
	if fakeFused != nil {
		return fakeFused(c)
	}
	return recordedFused(c), nil
}

func recordedFused(c FusedCase) FusedMeasurement {
	bytes := int64(c.Rows * c.Hidden * c.DType.Size())
	m := FusedMeasurement{Fused: time.Duration(6000 + bytes/300), Unfused: time.Duration(9000 + bytes/200), AllReduce: time.Duration(7000 + bytes/250),
		Path: c.Algo, PairPath: c.Algo}
	if c.Algo == "auto" {
		m.Path, m.PairPath = "oneshot", "oneshot"
		if c.Rows >= 8 && bytes > 256<<10 {
			m.Path = "twoshot"
		}
		switch {
		case bytes <= 16<<10:
			m.PairPath = "push"
		case bytes > 256<<10:
			m.PairPath = "twoshot"
		}
	}
	if c.Backend == backendNCCL {
		m.Fused, m.Unfused, m.AllReduce, m.Path, m.PairPath = 0, time.Duration(20000+bytes/150), time.Duration(18000+bytes/180), "", "nccl"
	}
	return m
}

func TestParseFused(t *testing.T) {
	c, err := parseArgs([]string{"--fused"})
	require.NoError(t, err)
	require.NotNil(t, c.fused)
	assert.Equal(t, fusedConfig{hidden: 8192, rows: []int{1, 8, 32, 128, 512}}, *c.fused)
	assert.Equal(t, []string{"auto"}, c.algos)
	assert.Equal(t, []int64{16 << 10, 128 << 10, 512 << 10, 2 << 20, 8 << 20}, c.sizes())
	assert.Equal(t, [2]int64{16 << 10, 8 << 20}, [2]int64{c.minBytes, c.maxBytes}, "the header's byte range is the rows'")

	c, err = parseArgs(strings.Fields("--fused --hidden 5120 --rows 7 -d f32 -a all -g"))
	require.NoError(t, err)
	assert.Equal(t, fusedConfig{hidden: 5120, rows: []int{7}}, *c.fused)
	assert.Equal(t, []string{"oneshot", "twoshot"}, c.algos, "push takes only calls up to PushMaxBytes")
	assert.Equal(t, []int64{7 * 5120 * 4}, c.sizes())
	assert.True(t, c.graph)

	c, err = parseArgs(strings.Fields("--fused --backend nccl --procs 2 -a auto"))
	require.NoError(t, err)
	assert.Equal(t, []string{"nccl"}, c.algos)

	c, err = parseArgs(nil)
	require.NoError(t, err)
	assert.Nil(t, c.fused, "without --fused the sweep is over message sizes")
}

func TestParseRows(t *testing.T) {
	for _, tc := range []struct {
		in     string
		factor int64
		want   []int
	}{
		{"1,8,32,128,512", 2, []int{1, 8, 32, 128, 512}},
		{"1-512", 2, []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}},
		{"1-512", 4, []int{1, 4, 16, 64, 256}},
		{"3-100", 2, []int{3, 6, 12, 24, 48, 96}},
		{"512, 1,8,8", 2, []int{1, 8, 512}},
		{"1-4,3,100-100", 2, []int{1, 2, 3, 4, 100}},
		{"16777215", 2, []int{16777215}},
		// a factor past what int64 holds after one step ends the range, never wraps
		{"2-8", 1 << 62, []int{2}},
		{"1-16777215", 1 << 40, []int{1}},
	} {
		got, err := parseRows(tc.in, tc.factor)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, "%s x%d", tc.in, tc.factor)
	}
	for in, want := range map[string]string{
		"":         `"" is not a row count`,
		"0":        "0 rows: the fused call takes 1 to 16777215",
		"16777216": "16777216 rows",
		"x":        `"x" is not a row count`,
		"1,,2":     `"" is not a row count`,
		"5-2":      "range 5-2: 5 is more than 2",
		"1-":       `"" is not a row count`,
		"-3":       `"" is not a row count`,
		"1.5":      `"1.5" is not a row count`,
	} {
		_, err := parseRows(in, 2)
		assert.ErrorContains(t, err, want, in)
	}
}

// TestFusedUsageErrors: every bad fused command line exits with 2 and names the flag, before
// touching the GPU.
func TestFusedUsageErrors(t *testing.T) {
	assertUsageErrors(t, map[string]string{
		"--hidden 4096":                               "--hidden sets the rows of the fused call: add --fused",
		"--rows 1,2":                                  "--rows sets the rows of the fused call: add --fused",
		"--fused -b 1K":                               "-b sets message sizes, but --fused sweeps row counts",
		"--fused -e 8M":                               "-e sets message sizes",
		"--fused --hidden 1024":                       "--hidden 1024: the fused call takes a multiple of 8 elements in 2048..16384",
		"--fused --hidden 4100":                       "--hidden 4100",
		"--fused --hidden 16392":                      "--hidden 16392",
		"--fused --rows 0":                            `--rows "0": 0 rows`,
		"--fused --rows 1,x":                          `--rows "1,x": "x" is not a row count`,
		"--fused --rows 8-1":                          `--rows "8-1": range 8-1: 8 is more than 1`,
		"--fused --backend both":                      "--backend both with --fused",
		"--fused --backend nccl -a all":               "-a all picks goccl's kernels",
		"--fused -f 1":                                "-f 1: must be at least 2",
		"--fused --backend nccl --ranks 2 --device 0": "--backend nccl: the 2 ranks would be virtual ranks",
	})
}

// wrongFusedAt8: 5 wrong elements in the unfused pair's NormOut at 8 rows.
func wrongFusedAt8(c FusedCase) (FusedMeasurement, error) {
	m := recordedFused(c)
	if c.Rows == 8 {
		m.UnfusedWrong = 5
		m.First = &FusedMismatch{Call: "unfused", Output: "NormOut", Mismatch: Mismatch{Rank: 2, Index: 8200, Expected: "1 (0x3f80)", Got: "NaN (0xffff)"}}
	}
	return m, nil
}

func TestFusedGolden(t *testing.T) {
	for _, tc := range []struct {
		name    string
		visible int
		args    []string
		measure func(FusedCase) (FusedMeasurement, error)
		code    int
		stderr  string
	}{
		{name: "fused", visible: 1, args: []string{"--fused"}},
		{name: "fused-json", visible: 1, args: []string{"--fused", "--json"}},
		{name: "fused-all-graph", visible: 4, args: []string{"--fused", "-a", "all", "-g", "--hidden", "5120", "--rows", "1-64", "-f", "4", "-d", "f16"}},
		{name: "fused-nccl", visible: 2, args: []string{"--fused", "--backend", "nccl", "--rows", "1,128"}},
		{name: "fused-unchecked", visible: 2, args: []string{"--fused", "-c", "0", "--rows", "4"}},
		{name: "fused-wrong", visible: 1, args: []string{"--fused", "--rows", "1,8"}, measure: wrongFusedAt8, code: 1},
		{name: "fused-wrong-json", visible: 1, args: []string{"--fused", "--rows", "1,8", "--json"}, measure: wrongFusedAt8, code: 1,
			stderr: "arsmoke: FAIL — 8 ranks, bf16, fused, hidden 8192, 2 row counts, 5 wrong; first: auto, 8 rows, unfused call, NormOut, rank 2, element 8200: expected 1 (0x3f80), got NaN (0xffff)\n"},
		{name: "fused-timeout", visible: 8, args: []string{"--fused", "-a", "twoshot"}, code: 1,
			measure: func(c FusedCase) (FusedMeasurement, error) {
				if c.Rows == 32 {
					return FusedMeasurement{}, errors.New("collective: rank 3 timed out in the entry barrier waiting for rank 5 (block 0)")
				}
				return recordedFused(c), nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			useFakeFused(t, tc.measure)
			f := &fakeEngine{measure: func(c Case) (Measurement, error) {
				t.Errorf("a fused run measured an all-reduce case: %+v", c)
				return recorded(c), nil
			}}
			code, stdout, stderr, _ := runFake(t, tc.visible, f, tc.args...)
			assert.Equal(t, tc.code, code, "stderr: %s", stderr)
			assert.Equal(t, tc.stderr, stderr)
			assert.True(t, f.closed, "the engine must be closed")
			golden(t, tc.name, stdout)
		})
	}
}

// TestFusedCases: the flags reach the engine as the right cases, in order, and the
// communicators are planned for the largest rows*hidden, on the kernels alone.
func TestFusedCases(t *testing.T) {
	useFakeFused(t, nil)
	f := &fakeEngine{}
	code, _, stderr, cfg := runFake(t, 4, f, "--fused", "-a", "all", "-g", "-d", "f32", "--hidden", "16384", "--rows", "1,4096",
		"-n", "7", "-w", "3", "--ranks", "2", "-c", "0")
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, f.cases, "no all-reduce case")
	assert.Equal(t, []int{0, 1}, cfg.Devices)
	largest := int64(4096 * 16384 * 4) // 256 MiB
	assert.Equal(t, largest, cfg.MaxBytes)
	require.NotNil(t, cfg.Goccl)
	assert.Equal(t, largest, cfg.Goccl.MaxBytes, "the fused call has no NCCL path: the kernels take every size")
	assert.False(t, cfg.NCCL)
	var got []string
	for _, c := range fakeFusedCases {
		assert.Equal(t, FusedCase{Rows: c.Rows, Hidden: 16384, DType: dtype.Float32, Eps: fusedEps, Backend: backendGoccl, Algo: c.Algo,
			Graph: true, Iters: 7, Warmup: 3}, c)
		got = append(got, fmt.Sprintf("%s %d", c.Algo, c.Rows))
	}
	assert.Equal(t, []string{"oneshot 1", "oneshot 4096", "twoshot 1", "twoshot 4096"}, got)

	useFakeFused(t, nil)
	code, _, stderr, cfg = runFake(t, 2, &fakeEngine{}, "--fused", "--backend", "nccl", "--rows", "2")
	require.Equal(t, 0, code, stderr)
	assert.True(t, cfg.NCCL)
	assert.Nil(t, cfg.Goccl)
	require.Len(t, fakeFusedCases, 1)
	assert.Equal(t, backendNCCL, fakeFusedCases[0].Backend)
	assert.Equal(t, backendNCCL, fakeFusedCases[0].Algo)
	assert.True(t, fakeFusedCases[0].Check)
}

// TestFusedJSONParsesBack reads a fused report as a program would.
func TestFusedJSONParsesBack(t *testing.T) {
	useFakeFused(t, nil)
	code, stdout, _, _ := runFake(t, 2, &fakeEngine{}, "--fused", "--json", "--rows", "1,512")
	require.Equal(t, 0, code)
	var r report
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&r))
	assert.True(t, r.Verdict.Pass)
	assert.Empty(t, r.Blocks)
	require.NotNil(t, r.Fused)
	assert.Equal(t, 8192, r.Fused.Hidden)
	assert.Equal(t, []int{1, 512}, r.Fused.Rows)
	require.Len(t, r.Fused.Blocks, 1)
	b := r.Fused.Blocks[0]
	require.Len(t, b.Rows, 2)
	row := b.Rows[1]
	assert.Equal(t, int64(512*8192*2), row.Bytes)
	assert.Equal(t, "twoshot", row.Path)
	assert.InDelta(t, 6+float64(8<<20/300)/1e3, row.FusedUS, 1e-9)
	assert.InDelta(t, row.FusedUS/row.UnfusedUS, row.Ratio, 1e-12)
	assert.InDelta(t, math.Sqrt(b.Rows[0].Ratio*row.Ratio), b.AvgRatio, 1e-12)
}

// TestFusedNeedsFusedEngine: an engine that cannot run the fused call fails the run with a
// message, not a panic.
func TestFusedNeedsFusedEngine(t *testing.T) {
	useFake(t, 2, func(engineConfig) (engine, error) { return plainEngine{}, nil })
	var out, errOut bytes.Buffer
	assert.Equal(t, exitFail, run([]string{"--fused"}, &out, &errOut))
	assert.Contains(t, out.String(), "this engine cannot run the fused call")
}

// plainEngine runs no case at all.
type plainEngine struct{}

func (plainEngine) Describe() Header { return Header{Host: "h", Driver: "12.8"} }
func (plainEngine) Run(context.Context, Case) (Measurement, error) {
	return Measurement{}, errors.New("no all-reduce here")
}
func (plainEngine) Close() error { return nil }

// TestProcsFused: a --procs run of the fused mode, rank 0 printing the table.
func TestProcsFused(t *testing.T) {
	code, stdout, stderr, _ := runProcs(t, "ok", "--procs", "2", "--fused", "--rows", "1,8")
	require.Equal(t, exitPass, code, stderr)
	assert.Empty(t, stderr)
	assert.Equal(t, 1, strings.Count(stdout, "# Algorithm: auto (fused call and pair all-reduce)"), stdout)
	assert.True(t, strings.HasSuffix(stdout, "arsmoke: PASS — 2 ranks, bf16, fused, hidden 8192, 2 row counts, 0 wrong\n"), stdout)
}
