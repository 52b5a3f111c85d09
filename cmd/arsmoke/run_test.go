package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/dtype"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// runFake runs arsmoke with args against a fake engine on visible GPUs.
func runFake(t *testing.T, visible int, f *fakeEngine, args ...string) (code int, stdout, stderr string, cfg engineConfig) {
	t.Helper()
	useFake(t, visible, func(c engineConfig) (engine, error) {
		cfg, f.cfg = c, c
		return f, nil
	})
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String(), cfg
}

// golden compares got with testdata/name.json (a case named ...json) or testdata/name.txt,
// or rewrites it under -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	ext := ".txt"
	if strings.HasSuffix(name, "json") {
		ext = ".json"
	}
	path := filepath.Join("testdata", name+ext)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -run %s -update to create it", t.Name())
	assert.Equal(t, string(want), got, "output differs from %s (go test -update rewrites it)", path)
}

// wrongAt4K reports 3 wrong elements for the 4 KiB in-place case.
func wrongAt4K(c Case) (Measurement, error) {
	m := recorded(c)
	if c.Bytes == 4096 && c.InPlace {
		m.Wrong = 3
		m.First = &Mismatch{Rank: 3, Index: 17, Expected: "1 (0x3f80)", Got: "0 (0x0000)"}
	}
	return m, nil
}

func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name    string
		visible int
		args    []string
		measure func(Case) (Measurement, error)
		code    int
		stderr  string // a part of stderr; "" means it must be empty
	}{
		{name: "default", visible: 1},
		{name: "default-json", visible: 1, args: []string{"--json"}},
		{name: "all-graph", visible: 4, args: []string{"-a", "all", "-g", "-b", "1K", "-e", "16K"}},
		{name: "unchecked", visible: 2, args: []string{"-c", "0", "-d", "f32", "-b", "64K", "-e", "1M", "-f", "4"}},
		{name: "wrong", visible: 1, args: []string{"-e", "8K"}, measure: wrongAt4K, code: 1},
		{name: "wrong-json", visible: 1, args: []string{"-e", "8K", "--json"}, measure: wrongAt4K, code: 1,
			stderr: "arsmoke: FAIL — 8 ranks, bf16, 4 sizes, 3 wrong; first: auto, 4096 B in-place, rank 3, element 17: expected 1 (0x3f80), got 0 (0x0000)\n"},
		{name: "both", visible: 2, args: []string{"--backend", "both", "-e", "8K"}},
		{name: "both-all-json", visible: 4, args: []string{"--backend", "both", "-a", "all", "-b", "1K", "-e", "2K", "--json"}},
		{name: "nccl", visible: 2, args: []string{"--backend", "nccl", "-d", "f16", "-b", "1K", "-e", "64K", "-f", "8"}},
		{name: "large", visible: 2, args: []string{"-b", "16M", "-e", "256M", "-f", "4"}},
		{name: "large-one-gpu", visible: 1, args: []string{"--ranks", "2", "-b", "16M", "-e", "256M", "-f", "4"}},
		{name: "odd-sizes", visible: 2, args: []string{"-d", "f32", "-b", "12", "-e", "10000", "-f", "10"}},
		{name: "both-wrong", visible: 2, args: []string{"--backend", "both", "-a", "all", "-b", "1K", "-e", "2K"}, code: 1,
			measure: func(c Case) (Measurement, error) {
				m := recorded(c)
				if c.Backend == backendNCCL && c.Bytes == 2048 && c.InPlace {
					m.Wrong = 2
					m.First = &Mismatch{Rank: 1, Index: 5, Expected: "3.5 ± 0.109375 (NCCL's tolerance)", Got: "NaN (0x7fc0)"}
				}
				return m, nil
			}},
		{name: "timeout", visible: 8, args: []string{"-a", "oneshot", "-e", "16K"}, code: 1,
			measure: func(c Case) (Measurement, error) {
				if c.Bytes == 8192 && !c.InPlace {
					return Measurement{}, errors.New("collective: timeout: rank 3 waited 10s for rank 5 at the entry barrier")
				}
				return recorded(c), nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeEngine{measure: tc.measure}
			code, stdout, stderr, _ := runFake(t, tc.visible, f, tc.args...)
			assert.Equal(t, tc.code, code, "stderr: %s", stderr)
			if tc.stderr == "" {
				assert.Empty(t, stderr)
			} else {
				assert.Equal(t, tc.stderr, stderr)
			}
			assert.True(t, f.closed, "the engine must be closed")
			golden(t, tc.name, stdout)
		})
	}
}

// TestRunCases checks that the flags reach the engine as the right cases,
// in the documented order.
func TestRunCases(t *testing.T) {
	f := &fakeEngine{}
	code, _, stderr, cfg := runFake(t, 4, f, "-a", "all", "-g", "-d", "f16", "-b", "4K", "-e", "64K", "-f", "4",
		"-n", "7", "-w", "3", "--ranks", "3", "--device", "2", "--timeout", "2s")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, []int{2, 2, 2}, cfg.Devices)
	assert.Nil(t, cfg.Proc)
	assert.Equal(t, int64(64<<10), cfg.MaxBytes)
	assert.Equal(t, "2s", cfg.Timeout.String())
	var got []string
	for _, c := range f.cases {
		require.Equal(t, dtype.Float16, c.DType)
		require.True(t, c.Graph)
		require.True(t, c.Check)
		require.Equal(t, 7, c.Iters)
		require.Equal(t, 3, c.Warmup)
		got = append(got, fmt.Sprintf("%s %d %v", c.Algo, c.Bytes, c.InPlace))
	}
	var want []string
	for _, a := range []string{"oneshot", "twoshot", "push"} {
		for _, b := range []int64{4096, 16384, 65536} {
			want = append(want, fmt.Sprintf("%s %d false", a, b), fmt.Sprintf("%s %d true", a, b))
		}
	}
	assert.Equal(t, want, got)
}

// TestRunCasesBoth: with --backend both, NCCL follows goccl at each size, once per size and
// placement however many blocks show it, and the communicators are planned for both.
func TestRunCasesBoth(t *testing.T) {
	f := &fakeEngine{}
	code, stdout, stderr, cfg := runFake(t, 2, f, "--backend", "both", "-a", "all", "-b", "1K", "-e", "2K")
	require.Equal(t, 0, code, stderr)
	assert.True(t, cfg.NCCL)
	require.NotNil(t, cfg.Goccl)
	assert.Equal(t, collective.NCCLOff, cfg.Goccl.NCCL, "the kernels' communicator takes every size itself")
	var got []string
	for _, c := range f.cases {
		got = append(got, fmt.Sprintf("%s/%s %d %v", c.Backend, c.Algo, c.Bytes, c.InPlace))
	}
	assert.Equal(t, []string{
		"goccl/oneshot 1024 false", "goccl/oneshot 1024 true", "nccl/nccl 1024 false", "nccl/nccl 1024 true",
		"goccl/oneshot 2048 false", "goccl/oneshot 2048 true", "nccl/nccl 2048 false", "nccl/nccl 2048 true",
		"goccl/twoshot 1024 false", "goccl/twoshot 1024 true", "goccl/twoshot 2048 false", "goccl/twoshot 2048 true",
		"goccl/push 1024 false", "goccl/push 1024 true", "goccl/push 2048 false", "goccl/push 2048 true",
	}, got)
	assert.Equal(t, 3, strings.Count(stdout, " (goccl) vs nccl\n"), "every block shows NCCL")
}

// TestSpeedup: NCCL's time over goccl's per placement, their geometric mean per block, and
// NCCL's bus bandwidth beside goccl's.
func TestSpeedup(t *testing.T) {
	r := &report{Ranks: 2, DType: "bf16", Sizes: 1, Check: true, Backend: backendBoth}
	nccl := [2]Measurement{{Time: 4000, Path: "nccl"}, {Time: 1000, Path: "nccl"}}
	got := newRow(1000, dtype.BFloat16, 2, Measurement{Time: 1000, Path: "oneshot"}, Measurement{Time: 2000, Path: "oneshot"}, &nccl)
	assert.InDelta(t, 4, got.OutOfPlace.Speedup, 1e-12)
	assert.InDelta(t, 0.5, got.InPlace.Speedup, 1e-12)
	require.NotNil(t, got.InPlace.NCCL)
	assert.Equal(t, "nccl", got.InPlace.NCCL.Path)
	assert.InDelta(t, 1, got.InPlace.NCCL.TimeUS, 1e-12)
	r.Blocks = []block{{Algo: "auto", Backend: backendBoth, Rows: []row{got}}}
	r.finish(nil)
	b := r.Blocks[0]
	assert.InDelta(t, math.Sqrt(4*0.5), b.AvgSpeedup, 1e-12)
	assert.InDelta(t, (0.25+1)/2, b.NCCLAvgBusBW, 1e-12) // 1000 B in 4 us and 1 us, busbw = algbw for 2 ranks
	assert.InDelta(t, (1+0.5)/2, b.AvgBusBW, 1e-12)
	assert.Equal(t, "arsmoke: PASS — 2 ranks, bf16, 1 sizes, goccl beside NCCL, 0 wrong", r.Verdict.Line)
}

// TestJSONParsesBack reads the JSON output as a program would.
func TestJSONParsesBack(t *testing.T) {
	code, stdout, _, _ := runFake(t, 2, &fakeEngine{}, "--json", "-b", "1K", "-e", "4K")
	require.Equal(t, 0, code)
	var r report
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&r))
	assert.False(t, dec.More(), "one document only")
	assert.True(t, r.Verdict.Pass)
	assert.Equal(t, 2, r.Ranks)
	require.Len(t, r.Blocks, 1)
	require.Len(t, r.Blocks[0].Rows, 3)
	row := r.Blocks[0].Rows[2]
	assert.Equal(t, int64(4096), row.Bytes)
	assert.Equal(t, int64(2048), row.Count)
	// 8 us + 4096/200 ns: algbw = 4096 B / 8020 ns, busbw = algbw for 2 ranks.
	assert.InDelta(t, 8.02, row.OutOfPlace.TimeUS, 1e-9)
	assert.InDelta(t, 4096.0/8020, row.OutOfPlace.AlgBW, 1e-9)
	assert.InDelta(t, row.OutOfPlace.AlgBW, row.OutOfPlace.BusBW, 1e-9)
}

// TestJSONParsesBackBoth: every field of a --backend both report is known to the reader, and
// NCCL's measurements and the speedup sit in each placement.
func TestJSONParsesBackBoth(t *testing.T) {
	code, stdout, _, _ := runFake(t, 2, &fakeEngine{}, "--json", "--backend", "both", "-b", "1K", "-e", "4K")
	require.Equal(t, 0, code)
	var r report
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&r))
	assert.Equal(t, backendBoth, r.Backend)
	assert.Equal(t, "2.21.5", r.NCCL)
	require.Len(t, r.Blocks, 1)
	b := r.Blocks[0]
	assert.Equal(t, backendBoth, b.Backend)
	assert.Positive(t, b.AvgSpeedup)
	assert.Positive(t, b.NCCLAvgBusBW)
	for _, row := range b.Rows {
		for _, res := range []result{row.OutOfPlace, row.InPlace} {
			require.NotNil(t, res.NCCL)
			assert.Equal(t, "oneshot", res.Path)
			assert.Equal(t, "nccl", res.NCCL.Path)
			assert.InDelta(t, res.NCCL.TimeUS/res.TimeUS, res.Speedup, 1e-12)
		}
	}
}

func TestBusBandwidth(t *testing.T) {
	m := Measurement{Time: 1000} // 1 us
	r := newResult(1<<20, 8, m)
	assert.InDelta(t, 1048.576, r.AlgBW, 1e-9)
	assert.InDelta(t, 1048.576*14/8, r.BusBW, 1e-9)
	assert.Zero(t, newResult(1<<20, 8, Measurement{}).AlgBW, "no time, no bandwidth (not +Inf)")
}

func TestVerdict(t *testing.T) {
	base := func() *report {
		return &report{Ranks: 8, DType: "bf16", Sizes: 14, Check: true, Blocks: []block{{Algo: "auto"}}}
	}
	for _, tc := range []struct {
		name string
		edit func(*report)
		err  error
		pass bool
		line string
	}{
		{name: "pass", pass: true, line: "arsmoke: PASS — 8 ranks, bf16, 14 sizes, 0 wrong"},
		{name: "all", edit: func(r *report) { r.Blocks = make([]block, 3) }, pass: true,
			line: "arsmoke: PASS — 8 ranks, bf16, 3 algorithms x 14 sizes, 0 wrong"},
		{name: "unchecked", edit: func(r *report) { r.Check = false }, pass: true,
			line: "arsmoke: DONE — 8 ranks, bf16, 14 sizes, results not checked (-c 0)"},
		{name: "wrong", edit: func(r *report) {
			r.Blocks[0].Rows = []row{{OutOfPlace: result{Wrong: 2}, InPlace: result{Wrong: 5}}}
			r.First = &located{Algo: "push", Bytes: 2048, Mismatch: Mismatch{Rank: 1, Index: 9, Expected: "2 (0x4000)", Got: "-0 (0x8000)"}}
		}, line: "arsmoke: FAIL — 8 ranks, bf16, 14 sizes, 7 wrong; first: push, 2048 B out-of-place, rank 1, element 9: expected 2 (0x4000), got -0 (0x8000)"},
		{name: "error", err: errors.New("auto, 1024 B out-of-place: timeout"),
			line: "arsmoke: FAIL — 8 ranks, bf16, 14 sizes: auto, 1024 B out-of-place: timeout"},
		{name: "no ranks yet", edit: func(r *report) { r.Ranks = 0 }, err: errors.New("find GPUs: no GPU"),
			line: "arsmoke: FAIL — find GPUs: no GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			if tc.edit != nil {
				tc.edit(r)
			}
			r.finish(tc.err)
			assert.Equal(t, verdict{Pass: tc.pass, Line: tc.line}, r.Verdict)
		})
	}
}

// TestRunFailures covers the failures before any all-reduce: exit 1, a
// clear message on stderr, nothing on stdout (a JSON report with --json).
func TestRunFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		count   func() (int, error)
		build   func(engineConfig) (engine, error)
		args    []string
		message string
	}{
		{name: "no driver", count: func() (int, error) { return 0, fmt.Errorf("load libcuda.so.1: %w", errNoDriver) },
			message: "GOCCL_LIBCUDA"},
		{name: "no GPU", count: func() (int, error) { return 0, nil }, message: "no GPU visible"},
		{name: "no device error", count: func() (int, error) { return 0, errors.New("cuInit: CUDA_ERROR_NO_DEVICE") },
			message: "find GPUs: cuInit: CUDA_ERROR_NO_DEVICE"},
		{name: "fewer GPUs", count: func() (int, error) { return 2, nil }, args: []string{"--ranks", "4"},
			message: "fewer GPUs than asked: 4 ranks need 4 GPUs, 2 visible"},
		{name: "no such device", count: func() (int, error) { return 1, nil }, args: []string{"--device", "3"},
			message: "fewer GPUs than asked: --device 3, but only 1 visible"},
		{name: "engine", count: func() (int, error) { return 1, nil },
			build:   func(engineConfig) (engine, error) { return nil, errors.New("collective: peer access 0->1 denied") },
			message: "set up 8 ranks, 1 process, virtual ranks on GPU 0: collective: peer access 0->1 denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := tc.build
			if build == nil {
				build = func(engineConfig) (engine, error) { return nil, errors.New("must not be built") }
			}
			useFake(t, 0, build)
			countDevices = tc.count
			var out, errOut bytes.Buffer
			require.Equal(t, 1, run(tc.args, &out, &errOut))
			assert.Empty(t, out.String())
			assert.Contains(t, errOut.String(), tc.message)
			assert.True(t, strings.HasPrefix(errOut.String(), "arsmoke: FAIL — "), errOut.String())

			out.Reset()
			errOut.Reset()
			require.Equal(t, 1, run(append(tc.args, "--json"), &out, &errOut))
			var r report
			require.NoError(t, json.Unmarshal(out.Bytes(), &r))
			assert.False(t, r.Verdict.Pass)
			assert.Contains(t, r.Error, tc.message)
			assert.Contains(t, errOut.String(), tc.message)
		})
	}
}

func TestTopo(t *testing.T) {
	old := showTopo
	t.Cleanup(func() { showTopo = old })

	var out, errOut bytes.Buffer
	showTopo = func(context.Context, io.Writer) error { return errors.New("load libnvidia-ml.so.1: not found") }
	assert.Equal(t, 1, run([]string{"--topo"}, &out, &errOut))
	assert.Equal(t, "arsmoke: --topo: load libnvidia-ml.so.1: not found\n", errOut.String())

	out.Reset()
	errOut.Reset()
	showTopo = func(_ context.Context, w io.Writer) error {
		_, err := fmt.Fprintln(w, "GPU0 X")
		return err
	}
	assert.Equal(t, 0, run([]string{"--topo"}, &out, &errOut))
	assert.Equal(t, "GPU0 X\n", out.String())
	assert.Empty(t, errOut.String())
}
