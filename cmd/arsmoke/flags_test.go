package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

func TestParseDefaults(t *testing.T) {
	c, err := parseArgs(nil)
	require.NoError(t, err)
	assert.Equal(t, config{
		minBytes: 1 << 10, maxBytes: 8 << 20, factor: 2, dtype: dtype.BFloat16, algos: []string{"auto"}, backend: "goccl",
		iters: 100, warmup: 10, check: true, device: -1, timeout: 10 * time.Second,
	}, c)
	assert.Len(t, c.sizes(), 14)
}

func TestParseEveryFlag(t *testing.T) {
	c, err := parseArgs(strings.Fields("-b 64MiB -e 1G -f 4 -d f32 -a all --backend both -g -n 5 -w 0 -c 0 --ranks 4 --device 1 --timeout 3s --json"))
	require.NoError(t, err)
	assert.Equal(t, config{
		minBytes: 64 << 20, maxBytes: 1 << 30, factor: 4, dtype: dtype.Float32, algos: []string{"oneshot", "twoshot", "push"},
		backend: "both", graph: true, iters: 5, warmup: 0, ranks: 4, device: 1, timeout: 3 * time.Second, json: true,
	}, c)

	c, err = parseArgs(strings.Fields("--procs 4 --device 0 --topo -a push -d half"))
	require.NoError(t, err)
	assert.Equal(t, 4, c.procs)
	assert.Equal(t, 0, c.device)
	assert.True(t, c.topo)
	assert.Equal(t, []string{"push"}, c.algos)
	assert.Equal(t, dtype.Float16, c.dtype)
	assert.Equal(t, "goccl", c.backend)

	// --backend nccl measures one block, NCCL's.
	c, err = parseArgs(strings.Fields("--backend nccl --procs 2"))
	require.NoError(t, err)
	assert.Equal(t, []string{"nccl"}, c.algos)
	assert.Equal(t, "nccl", c.backend)
}

// Any whole number of elements is a size: the kernels take any count.
func TestParseOddSizes(t *testing.T) {
	c, err := parseArgs(strings.Fields("-b 6 -e 100 -f 4"))
	require.NoError(t, err)
	assert.Equal(t, []int64{6, 24, 96}, c.sizes())
	c, err = parseArgs(strings.Fields("-d f32 -b 4 -e 4"))
	require.NoError(t, err)
	assert.Equal(t, []int64{4}, c.sizes())
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"16": 16, "4096B": 4096, "1K": 1 << 10, "1k": 1 << 10, "2KiB": 2 << 10, "8M": 8 << 20, "8MB": 8 << 20,
		"64MiB": 64 << 20, "1G": 1 << 30, "3gib": 3 << 30,
	} {
		var b byteSize
		require.NoError(t, b.Set(in), in)
		assert.Equal(t, want, int64(b), in)
	}
	for _, in := range []string{"", "K", "1Q", "1I", "1.5M", "-16", "1KK", "99999999999G"} {
		var b byteSize
		assert.Error(t, b.Set(in), in)
	}
	assert.Equal(t, "1K", byteSize(1024).String())
	assert.Equal(t, "8M", byteSize(8<<20).String())
	assert.Equal(t, "1536K", byteSize(1536<<10).String())
	assert.Equal(t, "1000", byteSize(1000).String())
	assert.Equal(t, "0", byteSize(0).String())
}

// TestUsageErrors checks that every bad command line exits with 2 and a
// message naming the flag, before touching the GPU.
func TestUsageErrors(t *testing.T) {
	assertUsageErrors(t, map[string]string{
		"-b 101":                 "-b 101: must be a whole number of bf16 elements, at least one: a positive multiple of 2 bytes",
		"-b 0":                   "-b 0: must be a whole number of bf16 elements",
		"-b 16 -e 1002 -d f32":   "-e 1002: must be a whole number of f32 elements, at least one: a positive multiple of 4 bytes",
		"-b 2 -d f32":            "-b 2: must be a whole number of f32 elements",
		"-b 8M -e 1M":            "-b 8M is larger than -e 1M",
		"-b 1Q":                  `invalid value "1Q" for flag -b: not a size`,
		"-f 1":                   "-f 1: must be at least 2",
		"-d int8":                `-d: unknown element type "int8"`,
		"-a ring":                `-a "ring": unknown algorithm`,
		"--backend mpi":          `--backend "mpi": unknown backend: use goccl, nccl or both`,
		"--backend nccl -a push": "-a push picks goccl's kernels, but --backend nccl runs every call through NCCL: drop -a, or use --backend both",
		"--backend nccl -a all":  "-a all picks goccl's kernels",
		// One GPU visible: the default ranks are virtual ranks, which NCCL cannot serve.
		"--backend nccl":                      "--backend nccl: the 8 ranks would be virtual ranks sharing GPU 0 in one process, and NCCL takes one rank per GPU: add --procs 8",
		"--backend both --ranks 2 --device 0": "--backend both: the 2 ranks would be virtual ranks sharing GPU 0 in one process",
		"-n 0":                                "-n 0: must be at least 1",
		"-n many":                             `invalid value "many" for flag -n`,
		"-w -1":                               "-w -1: must not be negative",
		"-c 2":                                "-c 2: use 1 to check the results or 0 not to",
		"--ranks 1":                           "--ranks 1: must be between 2 and 16",
		"--ranks 17":                          "--ranks 17: must be between 2 and 16",
		"--ranks 0":                           "--ranks 0: must be between 2 and 16",
		"--device=":                           `--device "": want a GPU index`,
		"--procs 0":                           "--procs 0: must be between 2 and 16",
		"--timeout 5":                         `invalid value "5" for flag -timeout`,
		"--fused --backend nccl -a push":      "-a push picks goccl's kernels, but --backend nccl runs every all-reduce through NCCL: drop -a, or run -a push with --backend goccl",
		"--device x":                          `--device "x": want a GPU index`,
		"--device -1":                         `--device "-1": want a GPU index`,
		"--procs 1":                           "--procs 1: must be between 2 and 16",
		"--procs 2 --ranks 2":                 "--ranks and --procs exclude each other",
		"--timeout 0s":                        "--timeout 0s: must be positive",
		"--timeout soon":                      `invalid value "soon" for flag -timeout`,
		"--topo --json":                       "--topo prints text only",
		"-n 5 extra":                          `unexpected argument "extra"`,
		"--bogus":                             "flag provided but not defined: -bogus",
	})
}

// assertUsageErrors runs each command line (a key of cases) and checks that it exits with 2,
// prints nothing on stdout and names its mistake (the value) on stderr, without building an
// engine.
func assertUsageErrors(t *testing.T, cases map[string]string) {
	t.Helper()
	useFake(t, 1, func(engineConfig) (engine, error) {
		t.Fatal("a usage error must not build an engine")
		return nil, nil
	})
	for args, want := range cases {
		var out, errOut bytes.Buffer
		assert.Equal(t, exitUsage, run(strings.Fields(args), &out, &errOut), args)
		assert.Empty(t, out.String(), args)
		assert.Contains(t, errOut.String(), "arsmoke: "+want, args)
	}
}

func TestHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, exitPass, run([]string{"-h"}, &out, &errOut))
	assert.Empty(t, errOut.String())
	for _, f := range []string{"-b size", "-e size", "-ranks N", "-procs N", "-device D", "-timeout duration", "a duration such as 10s", "-c 0|1"} {
		assert.Contains(t, out.String(), f)
	}
	assert.NotContains(t, out.String(), "(default -1)", "an unset --device has no default to show")
}

func TestSizes(t *testing.T) {
	for _, tc := range []struct {
		min, max, factor int64
		want             []int64
	}{
		{16, 100, 2, []int64{16, 32, 64}},
		{1024, 1024, 2, []int64{1024}},
		{1024, 4095, 4, []int64{1024}},
		{64 << 10, 1 << 20, 4, []int64{64 << 10, 256 << 10, 1 << 20}},
		{1 << 61, 1 << 62, 4, []int64{1 << 61}}, // the next step would overflow
	} {
		c := config{minBytes: tc.min, maxBytes: tc.max, factor: tc.factor}
		assert.Equal(t, tc.want, c.sizes(), "%d..%d x%d", tc.min, tc.max, tc.factor)
	}
}
