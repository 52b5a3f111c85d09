package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/dtype"
)

func TestParseTune(t *testing.T) {
	c, err := parseArgs([]string{"--tune"})
	require.NoError(t, err)
	require.NotNil(t, c.tune)
	assert.Equal(t, tuneConfig{}, *c.tune)
	assert.Equal(t, tuneIters, c.iters, "-n defaults to --tune's")
	assert.Equal(t, tuneWarmup, c.warmup)
	assert.Len(t, c.sizes(), 14)

	c, err = parseArgs(strings.Fields("--tune --quick --worlds 8,2,4,2 -o /tmp/t.json -e 1M -d f16 --device 0"))
	require.NoError(t, err)
	assert.Equal(t, tuneConfig{quick: true, worlds: []int{2, 4, 8}, output: "/tmp/t.json"}, *c.tune)
	assert.Equal(t, tuneQuickIters, c.iters)
	assert.Equal(t, tuneQuickWarmup, c.warmup)
	assert.Equal(t, dtype.Float16, c.dtype)
	assert.Equal(t, 0, c.device)

	c, err = parseArgs(strings.Fields("--tune --quick -n 7 -w 0 --ranks 8 --device 0"))
	require.NoError(t, err)
	assert.Equal(t, 7, c.iters, "an explicit -n wins")
	assert.Equal(t, 0, c.warmup)
	assert.Equal(t, 8, c.ranks)

	c, err = parseArgs(strings.Fields("--tune --procs 4 --worlds 4"))
	require.NoError(t, err)
	assert.Equal(t, []int{4}, c.tune.worlds)

	c, err = parseArgs(nil)
	require.NoError(t, err)
	assert.Nil(t, c.tune, "no --tune: no tuneConfig")

	for args, want := range map[string]string{
		"--quick":                          "--quick is a flag of --tune",
		"--worlds 2,4":                     "--worlds is a flag of --tune",
		"-o t.json":                        "-o is a flag of --tune",
		"--tune -a oneshot":                "-a oneshot: --tune measures every algorithm",
		"--tune -g":                        "-g: --tune measures captured and eager calls both",
		"--tune -c 0":                      "-c 0: --tune checks every result",
		"--tune --backend nccl":            "--backend nccl",
		"--tune --backend both":            "--backend both: --tune measures goccl's kernels",
		"--tune --json":                    "--json",
		"--tune --topo":                    "--topo and --tune exclude each other",
		"--tune --fused":                   "--fused and --tune exclude each other",
		"--tune --worlds 1,2":              `--worlds "1,2": want world sizes 2 to 16`,
		"--tune --worlds 2,x":              `--worlds "2,x"`,
		"--tune --worlds 17":               `--worlds "17"`,
		"--tune --worlds=":                 `--worlds "": want world sizes 2 to 16`,
		"--tune --worlds 2,4 --ranks 4":    "--ranks and --worlds exclude each other",
		"--tune --worlds 2,4 --procs 4":    "--procs 4 tunes 4 ranks",
		"--tune --worlds 2 --procs 4 -o x": "--procs 4 tunes 4 ranks",
	} {
		_, err := parseArgs(strings.Fields(args))
		assert.ErrorContains(t, err, want, args)
	}
}

func TestTuneWorlds(t *testing.T) {
	parse := func(args string) config {
		c, err := parseArgs(strings.Fields(args))
		require.NoError(t, err)
		return c
	}
	assert.Equal(t, []int{2, 4, 8}, tuneWorlds(parse("--tune"), 1), "one GPU: virtual ranks")
	assert.Equal(t, []int{2, 4, 8}, tuneWorlds(parse("--tune --device 1"), 4), "--device: virtual ranks")
	assert.Equal(t, []int{2, 3, 4}, tuneWorlds(parse("--tune"), 4), "several GPUs: 2..N")
	assert.Len(t, tuneWorlds(parse("--tune"), 20), 15, "at most 16 ranks")
	assert.Equal(t, []int{8}, tuneWorlds(parse("--tune --ranks 8 --device 0"), 1))
	assert.Equal(t, []int{3}, tuneWorlds(parse("--tune --procs 3"), 8))
	assert.Equal(t, []int{2, 16}, tuneWorlds(parse("--tune --worlds 16,2 --device 0"), 1))
}

// h200Target is what a communicator of ws virtual ranks on an H200 says of itself.
func h200Target(ws int) collective.TuneTarget {
	limit := min(64, 132/ws)
	return collective.TuneTarget{
		Key:       collective.TuneKey{GPU: "NVIDIA H200", Capability: "9.0", Driver: 12080},
		Topology:  collective.TuneTopology{GPUs: 1, RanksPerGPU: ws, Processes: 1},
		WorldSize: ws, Scope: collective.TuneScopeGPU, MaxBlocks: limit,
		Blocks: min(collective.DefaultBlocks, limit), PushBlocks: min(collective.DefaultPushBlocks, limit), PushMaxBytes: 512 << 10,
	}
}

func TestPlanTune(t *testing.T) {
	sizes := []int64{1 << 10, 1 << 20, 8 << 20}
	// 8 virtual ranks on an H200 keep 16 blocks each: one pull grid, two push grids, each
	// with automatic and 256-thread blocks.
	p := planTune(h200Target(8), sizes, false)
	assert.Equal(t, []tuneGrid{
		{Blocks: 16, PushBlocks: 8, Threads: 0, Pull: true, Push: true},
		{Blocks: 16, PushBlocks: 16, Threads: 0, Pull: false, Push: true},
		{Blocks: 16, PushBlocks: 8, Threads: 256, Pull: true, Push: true},
		{Blocks: 16, PushBlocks: 16, Threads: 256, Pull: false, Push: true},
	}, p.grids)
	// 4 ranks: 33 blocks, the communicator's own grid (36 capped to 33) among them.
	p = planTune(h200Target(4), sizes, false)
	var pull []int
	for _, g := range p.grids {
		if g.Pull && g.Threads == 0 {
			pull = append(pull, g.Blocks)
		}
	}
	assert.Equal(t, []int{16, 24, 32, 33}, pull)
	assert.Len(t, planTune(h200Target(2), sizes, false).grids, 12, "6 pull grids x 2 block sizes")
	q := planTune(h200Target(2), sizes, true)
	assert.Equal(t, []tuneGrid{
		{Blocks: 16, PushBlocks: 16, Pull: true, Push: true},
		{Blocks: 36, PushBlocks: 16, Pull: true},
		{Blocks: 64, PushBlocks: 16, Pull: true},
	}, q.grids)

	// Every mode measures both pull algorithms at every size; push up to PushMaxBytes, and
	// once for the eager modes.
	cases := p.cases(tuneGrid{Pull: true, Push: true})
	count := map[tuneMode]map[collective.Algorithm]int{}
	for _, c := range cases {
		if count[c.Mode] == nil {
			count[c.Mode] = map[collective.Algorithm]int{}
		}
		count[c.Mode][c.Algo]++
		if c.Algo == collective.Push {
			assert.LessOrEqual(t, c.Bytes, int64(512<<10))
		}
	}
	assert.Equal(t, map[tuneMode]map[collective.Algorithm]int{
		modeGraph:       {collective.OneShot: 3, collective.TwoShot: 3, collective.Push: 1},
		modeEagerDirect: {collective.OneShot: 3, collective.TwoShot: 3, collective.Push: 1},
		modeEager:       {collective.OneShot: 3, collective.TwoShot: 3},
	}, count)
	assert.Len(t, p.cases(tuneGrid{Push: true}), 2)
	assert.Equal(t, 8*18+6*2, p.steps(), "8 grids measure pull algorithms, 6 push")
}

// model is a machine whose times are known: push is cheap and slow per byte, oneshot in the
// middle, twoshot dear and fast; 8 push blocks beat 16, oneshot likes 16 blocks, twoshot 24,
// and from 2 MiB on blocks of 256 threads; staging costs eager calls on plain buffers a
// microsecond.
func model(tc tuneCase, blocks, threads int) time.Duration {
	b := float64(tc.Bytes)
	var ns float64
	switch tc.Algo {
	case collective.Push:
		ns = 3000 + b/4
		if blocks == 8 {
			ns *= 0.9
		}
	case collective.OneShot:
		ns = 4000 + b/16
		if blocks != 16 {
			ns *= 1.05
		}
	case collective.TwoShot:
		ns = 6000 + b/64
		if blocks == 24 {
			ns *= 0.9
		}
		if threads == 256 && tc.Bytes >= 2<<20 {
			ns *= 0.95
		}
	}
	if tc.Mode == modeEager && tc.Algo != collective.Push {
		ns += 1000
	}
	return time.Duration(ns)
}

// measureModel measures plan p on model (or m where given).
func measureModel(p tunePlan, m func(tuneCase, int, int) time.Duration) []tuneSample {
	var out []tuneSample
	for _, g := range p.grids {
		for _, tc := range p.cases(g) {
			blocks := g.Blocks
			if tc.Algo == collective.Push {
				blocks = g.PushBlocks
			}
			out = append(out, tuneSample{tuneCase: tc, Blocks: blocks, Threads: g.Threads, Time: m(tc, blocks, g.Threads)})
		}
	}
	return out
}

// builtinH200 is a stand-in for the built-in selection: push up to 16 KiB, oneshot up to
// 256 KiB, then twoshot.
func builtinH200(_ tuneMode, n int64) collective.Algorithm {
	switch {
	case n <= 16<<10:
		return collective.Push
	case n <= 256<<10:
		return collective.OneShot
	}
	return collective.TwoShot
}

func TestDeriveSection(t *testing.T) {
	target := h200Target(4)
	sizes := (config{minBytes: 1 << 10, maxBytes: 8 << 20, factor: 2}).sizes()
	p := planTune(target, sizes, false)
	sec, rows := deriveSection(target, measureModel(p, model), sizes, builtinH200)

	assert.Equal(t, 8, sec.PushBlocks, "the faster push grid")
	assert.Equal(t, 4, sec.WorldSize)
	assert.Equal(t, target.Topology, sec.Topology)
	assert.Equal(t, collective.TuneScopeGPU, sec.Scope)
	// Graph and eager on registered buffers measure alike in the model. Push wins to 4 KiB,
	// and keeps 8 KiB (4543 ns, within 1% of oneshot's 4512: the band below stays); oneshot
	// with 16 blocks to 16 KiB (5024 against twoshot's 5630; at 32 KiB 6048 against 5861),
	// then twoshot with 24 blocks, of 256 threads from 2 MiB.
	want := []collective.TuneBand{
		{UpTo: 8 << 10, Algorithm: "push"},
		{UpTo: 16 << 10, Algorithm: "oneshot", Blocks: 16},
		{UpTo: 1 << 20, Algorithm: "twoshot", Blocks: 24},
		{Algorithm: "twoshot", Blocks: 24, Threads: 256},
	}
	require.Len(t, sec.Entries, 3)
	assert.Equal(t, collective.TuneEntry{Mode: "graph", Direct: true, Bands: want}, sec.Entries[0])
	assert.Equal(t, collective.TuneEntry{Mode: "eager", Direct: true, Bands: want}, sec.Entries[1])
	// Staging makes oneshot and twoshot a microsecond dearer: the same bands, push now
	// winning 8 KiB outright (4543 against 5512).
	assert.Equal(t, collective.TuneEntry{Mode: "eager", Direct: false, Bands: want}, sec.Entries[2])
	tab := collective.TuneTable{Format: collective.TuneFormat, Version: collective.TuneVersion, TuneKey: target.Key,
		Sections: []collective.TuneSection{sec}}
	require.NoError(t, tab.Validate(), "what --tune derives is a valid table")

	require.Len(t, rows, 3*len(sizes))
	r := rows[0]
	assert.Equal(t, tuneRow{Mode: modeGraph, Bytes: 1 << 10, Chosen: tuneChoice{collective.Push, 8, 0}, ChosenTime: model(tuneCase{modeGraph, collective.Push, 1 << 10}, 8, 0),
		Builtin: tuneChoice{collective.Push, 16, 0}, BuiltinTime: model(tuneCase{modeGraph, collective.Push, 1 << 10}, 16, 0)}, r)
	assert.InDelta(t, 1/0.9-1, r.gain(), 1e-3)
	r = rows[len(sizes)*2+9] // eager on plain buffers, 512 KiB: built-in twoshot with 33 blocks
	assert.Equal(t, int64(512<<10), r.Bytes)
	assert.Equal(t, tuneChoice{collective.TwoShot, 33, 0}, r.Builtin)
	assert.Equal(t, tuneChoice{collective.TwoShot, 24, 0}, r.Chosen)
	tc := tuneCase{modeEager, collective.TwoShot, 512 << 10}
	assert.Equal(t, model(tc, 33, 0), r.BuiltinTime)
	assert.InDelta(t, float64(model(tc, 33, 0))/float64(model(tc, 24, 0))-1, r.gain(), 1e-9)
}

// TestDeriveSectionKeepsNearChoices: within tuneTolerance the band below, then the built-in
// choice, win over a marginally faster one; a lone size that flips between equal neighbours
// follows them.
func TestDeriveSectionKeepsNearChoices(t *testing.T) {
	target := h200Target(2)
	sizes := []int64{1 << 20, 2 << 20, 4 << 20, 8 << 20}
	s := func(n int64, algo collective.Algorithm, blocks int, ns int) tuneSample {
		return tuneSample{tuneCase: tuneCase{modeGraph, algo, n}, Blocks: blocks, Time: time.Duration(ns)}
	}
	samples := []tuneSample{
		// 1M: the built-in oneshot with 64 blocks is 1% slower than 48 blocks: it stays.
		s(1<<20, collective.OneShot, 64, 1010), s(1<<20, collective.OneShot, 48, 1000), s(1<<20, collective.TwoShot, 64, 2000),
		// 2M: 48 blocks 5% faster: it wins.
		s(2<<20, collective.OneShot, 64, 1050), s(2<<20, collective.OneShot, 48, 1000), s(2<<20, collective.TwoShot, 64, 2000),
		// 4M: twoshot 3% faster, but oneshot 48 on both sides and within 2x the tolerance.
		s(4<<20, collective.OneShot, 64, 1100), s(4<<20, collective.OneShot, 48, 1030), s(4<<20, collective.TwoShot, 64, 1000),
		// 8M: oneshot 48 again.
		s(8<<20, collective.OneShot, 64, 1100), s(8<<20, collective.OneShot, 48, 1000), s(8<<20, collective.TwoShot, 64, 1050),
	}
	builtin := func(tuneMode, int64) collective.Algorithm { return collective.OneShot }
	sec, rows := deriveSection(target, samples, sizes, builtin)
	require.Len(t, sec.Entries, 1, "only graphs were measured")
	assert.Equal(t, []collective.TuneBand{
		{UpTo: 1 << 20, Algorithm: "oneshot", Blocks: 64},
		{Algorithm: "oneshot", Blocks: 48},
	}, sec.Entries[0].Bands)
	assert.Equal(t, 16, sec.PushBlocks, "no push measured: the communicator's grid")
	assert.Equal(t, time.Duration(1030), rows[2].ChosenTime)
	assert.InDelta(t, 1100.0/1030-1, rows[2].gain(), 1e-9)
}

// TestSameLaunch: OneShot limits at or above what a message needs are one launch; TwoShot's
// and push's limits, and other block sizes, always count.
func TestSameLaunch(t *testing.T) {
	one := func(blocks, threads int) tuneChoice { return tuneChoice{collective.OneShot, blocks, threads} }
	// 64 KiB: 4096 vectors, 8 blocks of 512 threads
	assert.True(t, sameLaunch(one(16, 0), one(64, 0), 64<<10))
	assert.True(t, sameLaunch(one(8, 0), one(36, 0), 64<<10))
	assert.False(t, sameLaunch(one(4, 0), one(36, 0), 64<<10))
	assert.False(t, sameLaunch(one(16, 0), one(16, 256), 64<<10), "other threads")
	// 8 MiB: 1024 blocks' worth, every limit counts
	assert.False(t, sameLaunch(one(48, 0), one(64, 0), 8<<20))
	two := tuneChoice{collective.TwoShot, 16, 0}
	assert.False(t, sameLaunch(two, tuneChoice{collective.TwoShot, 64, 0}, 64<<10))
}

func TestMergeTune(t *testing.T) {
	target := h200Target(4)
	key := target.Key
	sec := func(ws int, ps int) collective.TuneSection {
		tg := h200Target(ws)
		return collective.TuneSection{WorldSize: ws, Topology: tg.Topology, Scope: tg.Scope, PushBlocks: ps,
			Entries: []collective.TuneEntry{{Mode: "eager", Direct: true, Bands: []collective.TuneBand{{Algorithm: "oneshot"}}}}}
	}
	old := &collective.TuneTable{Format: collective.TuneFormat, Version: collective.TuneVersion, TuneKey: key,
		Sections: []collective.TuneSection{sec(8, 8), sec(4, 8), sec(2, 8)}}
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	merged, kept := mergeTune(old, key, "test", now, []collective.TuneSection{sec(4, 16)})
	assert.Equal(t, 2, kept)
	assert.Equal(t, []collective.TuneSection{sec(2, 8), sec(4, 16), sec(8, 8)}, merged.Sections)
	assert.Equal(t, now, merged.Created)
	assert.Equal(t, "test", merged.Tool)
	require.NoError(t, merged.Validate())

	other := key
	other.Driver = 12090
	merged, kept = mergeTune(old, other, "test", now, []collective.TuneSection{sec(4, 16)})
	assert.Zero(t, kept, "another machine's sections are dropped")
	assert.Equal(t, []collective.TuneSection{sec(4, 16)}, merged.Sections)
}

// fakeTuner is a tuneRunner whose times come from model.
type fakeTuner struct {
	target collective.TuneTarget
	grid   tuneGrid
	open   bool
	fail   func(tuneCase) error
	closed *int
}

func (f *fakeTuner) Target() collective.TuneTarget { return f.target }

func (f *fakeTuner) Builtin(m tuneMode, n int64) collective.Algorithm { return builtinH200(m, n) }

func (f *fakeTuner) Open(_ context.Context, g tuneGrid) error {
	f.grid, f.open = g, true
	return nil
}

func (f *fakeTuner) Time(_ context.Context, tc tuneCase) (time.Duration, error) {
	if !f.open {
		return 0, errors.New("no grid open")
	}
	if f.fail != nil {
		if err := f.fail(tc); err != nil {
			return 0, err
		}
	}
	blocks := f.grid.Blocks
	if tc.Algo == collective.Push {
		blocks = f.grid.PushBlocks
	}
	return model(tc, blocks, f.grid.Threads), nil
}

func (f *fakeTuner) Close() error {
	fakeTunerMu.Lock()
	defer fakeTunerMu.Unlock()
	*f.closed++
	return nil
}

// fakeTunerMu guards what the fake runners of one test share: ranks of a --procs run tune
// from goroutines of their own.
var fakeTunerMu sync.Mutex

// useFakeTuner makes run() see visible GPUs and tune with fake runners.
func useFakeTuner(t *testing.T, visible int, fail func(tuneCase) error) (worlds *[]engineConfig, closed *int) {
	t.Helper()
	old, oldCount := newTuneRunner, countDevices
	t.Cleanup(func() { newTuneRunner, countDevices = old, oldCount })
	countDevices = func() (int, error) { return visible, nil }
	worlds, closed = new([]engineConfig), new(int)
	newTuneRunner = func(_ context.Context, cfg engineConfig, dt dtype.DType, iters, warmup int) (tuneRunner, error) {
		fakeTunerMu.Lock()
		*worlds = append(*worlds, cfg)
		fakeTunerMu.Unlock()
		n := len(cfg.Devices)
		if cfg.Proc != nil {
			n = cfg.Proc.World
		}
		return &fakeTuner{target: h200Target(n), fail: fail, closed: closed}, nil
	}
	return worlds, closed
}

func TestRunTune(t *testing.T) {
	worlds, closed := useFakeTuner(t, 1, nil)
	out := filepath.Join(t.TempDir(), "sub", "tune.json")
	var stdout, stderr bytes.Buffer
	code := run(strings.Fields("--tune --worlds 2,4 -e 1M -o "+out), &stdout, &stderr)
	require.Equal(t, exitPass, code, stderr.String())
	assert.Equal(t, "arsmoke: --tune: 2 ranks (1 GPU, 2 ranks in 1 process): 12 communicators, 912 cases, each timed 3 times (the fastest counts)\n"+
		"arsmoke: --tune: 4 ranks (1 GPU, 4 ranks in 1 process): 8 communicators, 648 cases, each timed 3 times (the fastest counts)\n", stderr.String())
	require.Len(t, *worlds, 2)
	assert.Equal(t, []int{0, 0}, (*worlds)[0].Devices, "virtual ranks on the lone GPU")
	assert.Equal(t, int64(1<<20), (*worlds)[1].MaxBytes)
	assert.Equal(t, 2, *closed)

	tab, err := collective.ReadTuneTable(out)
	require.NoError(t, err)
	require.Len(t, tab.Sections, 2)
	assert.Equal(t, 2, tab.Sections[0].WorldSize)
	assert.Equal(t, 4, tab.Sections[1].WorldSize)
	assert.Contains(t, tab.Tool, "arsmoke --tune")
	text := stdout.String()
	for _, want := range []string{
		"# goccl tuning: NVIDIA H200 (compute capability 9.0, CUDA driver 12.8)",
		"## 2 ranks: 1 GPU, 2 ranks in 1 process; gpu-scope barriers; grids of up to 64 blocks; 12 communicators",
		"## 4 ranks: 1 GPU, 4 ranks in 1 process",
		"push blocks: 8 (built-in 16)",
		"graph: push 8xauto up to 8K, oneshot 16xauto up to 16K, twoshot 24xauto above",
		"eager: push 8xauto up to 8K",
		"gain over the built-in choice:",
		"arsmoke: wrote " + out + ": 2 sections",
	} {
		assert.Contains(t, text, want)
	}

	// A second run for 8 ranks keeps the two sections already there.
	stdout.Reset()
	code = run(strings.Fields("--tune --ranks 8 --device 0 -e 64K --quick -o "+out), &stdout, &stderr)
	require.Equal(t, exitPass, code, stderr.String())
	assert.Contains(t, stdout.String(), "1 section (kept 2 sections of the table there)")
	tab, err = collective.ReadTuneTable(out)
	require.NoError(t, err)
	assert.Len(t, tab.Sections, 3)

	// A file goccl could not use is replaced, and the summary says so.
	require.NoError(t, os.WriteFile(out, []byte("{"), 0o644))
	stdout.Reset()
	code = run(strings.Fields("--tune --ranks 2 -e 16K --quick -o "+out), &stdout, &stderr)
	require.Equal(t, exitPass, code, stderr.String())
	assert.Contains(t, stdout.String(), "replacing a table that goccl could not use")
}

// spikyTuner is a fakeTuner whose first timing of every OneShot case of 16 KiB in each grid
// takes a millisecond more, as a host-side delay does, and which counts its timings.
type spikyTuner struct {
	*fakeTuner
	seen  map[tuneCase]bool
	calls int
}

func (s *spikyTuner) Open(ctx context.Context, g tuneGrid) error {
	s.seen = map[tuneCase]bool{}
	return s.fakeTuner.Open(ctx, g)
}

func (s *spikyTuner) Time(ctx context.Context, tc tuneCase) (time.Duration, error) {
	s.calls++
	d, err := s.fakeTuner.Time(ctx, tc)
	if tc.Algo == collective.OneShot && tc.Bytes == 16<<10 && !s.seen[tc] {
		d += time.Millisecond
	}
	s.seen[tc] = true
	return d, err
}

// TestRunTuneRepeats: every case is timed tuneRepeats times, a pass over the grid's cases each,
// and the fastest counts, so that one delayed timing decides no band (the bands are those of
// TestRunTune, whose times have no delay); --quick times each case once, and the delay shows.
func TestRunTuneRepeats(t *testing.T) {
	useFakeTuner(t, 1, nil)
	inner := newTuneRunner
	var tuners []*spikyTuner
	newTuneRunner = func(ctx context.Context, cfg engineConfig, dt dtype.DType, iters, warmup int) (tuneRunner, error) {
		r, err := inner(ctx, cfg, dt, iters, warmup)
		if err != nil {
			return nil, err
		}
		s := &spikyTuner{fakeTuner: r.(*fakeTuner)}
		tuners = append(tuners, s)
		return s, nil
	}
	var stdout, stderr bytes.Buffer
	code := run(strings.Fields("--tune --ranks 2 --device 0 -e 1M -o "+filepath.Join(t.TempDir(), "tune.json")), &stdout, &stderr)
	require.Equal(t, exitPass, code, stderr.String())
	require.Len(t, tuners, 1)
	assert.Equal(t, 3*912, tuners[0].calls, "912 cases, each timed 3 times")
	assert.Contains(t, stdout.String(), "graph: push 8xauto up to 8K, oneshot 16xauto up to 16K, twoshot 24xauto above")

	stdout.Reset()
	code = run(strings.Fields("--tune --ranks 2 --device 0 -e 1M --quick -o "+filepath.Join(t.TempDir(), "tune.json")), &stdout, &stderr)
	require.Equal(t, exitPass, code, stderr.String())
	require.Len(t, tuners, 2)
	quick, err := parseArgs(strings.Fields("--tune --ranks 2 --device 0 -e 1M --quick"))
	require.NoError(t, err)
	assert.Equal(t, planTune(h200Target(2), quick.sizes(), true).steps(), tuners[1].calls, "--quick: once each")
	assert.NotContains(t, stdout.String(), "oneshot 16xauto up to 16K", "one delayed timing decides the band")
}

func TestRunTuneDefaultPath(t *testing.T) {
	useFakeTuner(t, 2, nil)
	dir := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", dir)
	var stdout, stderr bytes.Buffer
	code := run(strings.Fields("--tune -e 8K --quick"), &stdout, &stderr)
	require.Equal(t, exitPass, code, stderr.String())
	path := filepath.Join(dir, "goccl", "tune-nvidia-h200-sm90-cuda12080.json")
	assert.FileExists(t, path)
	assert.Contains(t, stdout.String(), "wrote "+path+": 1 section", "two GPUs: world size 2")
}

func TestRunTuneFails(t *testing.T) {
	useFakeTuner(t, 1, func(tc tuneCase) error {
		if tc.Algo == collective.TwoShot && tc.Bytes == 4<<10 {
			return errors.New("3 wrong elements; first: rank 1, element 7: expected 1 (0x3f80), got NaN (0xffff)")
		}
		return nil
	})
	out := filepath.Join(t.TempDir(), "tune.json")
	var stdout, stderr bytes.Buffer
	code := run(strings.Fields("--tune --ranks 4 --device 0 -o "+out), &stdout, &stderr)
	assert.Equal(t, exitFail, code)
	assert.Contains(t, stderr.String(), "arsmoke: --tune: 4 ranks, 1 process, virtual ranks on GPU 0: 4 ranks, graph, twoshot 16xauto, 4K: 3 wrong elements")
	assert.NoFileExists(t, out, "no table from a run with wrong results")
	assert.Empty(t, stdout.String())

	_, err := parseArgs(strings.Fields("--tune --ranks 4 --device 3"))
	require.NoError(t, err)
	code = run(strings.Fields("--tune --ranks 4 --device 3"), &stdout, &stderr)
	assert.Equal(t, exitFail, code, "a GPU that is not there fails as a run without --tune does")
	assert.Contains(t, stderr.String(), "fewer GPUs than asked: --device 3")
}

// TestRunTuneProcsChild: in a --procs child only rank 0 writes the table and prints; the
// processes, each timing its own rank, combine every case's time.
func TestRunTuneProcsChild(t *testing.T) {
	worlds, _ := useFakeTuner(t, 1, nil)
	out := filepath.Join(t.TempDir(), "tune.json")
	c, err := parseArgs(strings.Fields("--tune --procs 2 --device 0 -e 8K --quick -o " + out))
	require.NoError(t, err)
	codes, stdouts, stderrs := runTuneProcs(t, c)
	require.Equal(t, [2]int{exitPass, exitPass}, codes, "%s\n%s", stderrs[0], stderrs[1])
	require.Len(t, *worlds, 2)
	for _, w := range *worlds {
		assert.Equal(t, []int{0}, w.Devices, "a child drives its own rank")
	}
	assert.FileExists(t, out)
	assert.Contains(t, stdouts[0], "## 2 ranks: 1 GPU, 2 ranks in 1 process")
	assert.Empty(t, stdouts[1])
}

// TestRunTuneProcsFailure: a case that fails on rank 1 alone (wrong results, say) fails every
// rank at that case, and rank 0 writes no table.
func TestRunTuneProcsFailure(t *testing.T) {
	useFakeTuner(t, 1, nil)
	inner := newTuneRunner
	newTuneRunner = func(ctx context.Context, cfg engineConfig, dt dtype.DType, iters, warmup int) (tuneRunner, error) {
		r, err := inner(ctx, cfg, dt, iters, warmup)
		if err == nil && cfg.Proc.Rank == 1 {
			r.(*fakeTuner).fail = func(tc tuneCase) error {
				if tc.Bytes == 4096 {
					return errors.New("3 wrong elements")
				}
				return nil
			}
		}
		return r, err
	}
	out := filepath.Join(t.TempDir(), "tune.json")
	c, err := parseArgs(strings.Fields("--tune --procs 2 --device 0 -e 8K --quick -o " + out))
	require.NoError(t, err)
	codes, _, stderrs := runTuneProcs(t, c)
	assert.Equal(t, [2]int{exitFail, exitFail}, codes)
	for r := range 2 {
		assert.Contains(t, stderrs[r], "rank 1: 3 wrong elements", "rank %d", r)
	}
	assert.NoFileExists(t, out)
}

// runTuneProcs runs runTune as both ranks of a two-process run, each from its own goroutine
// with the socket folder a parent would make.
func runTuneProcs(t *testing.T, c config) (codes [2]int, stdouts, stderrs [2]string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "boot.sock")
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var stdout, stderr bytes.Buffer
			codes[r] = runTune(context.Background(), c, &procInfo{Rank: r, World: 2, Socket: sock}, &stdout, &stderr)
			stdouts[r], stderrs[r] = stdout.String(), stderr.String()
		}()
	}
	wg.Wait()
	return codes, stdouts, stderrs
}

// TestSaveTuneConcurrent: two runs merging their sections into one table at once both end
// up in it (the merge holds a lock on the table from its read to its write).
func TestSaveTuneConcurrent(t *testing.T) {
	result := func(ws int) tuneResult {
		tg := h200Target(ws)
		sec := collective.TuneSection{WorldSize: ws, Topology: tg.Topology, Scope: tg.Scope,
			Entries: []collective.TuneEntry{{Mode: "eager", Direct: true, Bands: []collective.TuneBand{{Algorithm: "twoshot"}}}}}
		return tuneResult{Target: tg, Section: sec}
	}
	for i := range 50 {
		path := filepath.Join(t.TempDir(), "sub", "t.json")
		var wg sync.WaitGroup
		for _, ws := range []int{2, 4} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := saveTune([]tuneResult{result(ws)}, path, "test", time.Now())
				assert.NoError(t, err)
			}()
		}
		wg.Wait()
		tab, err := collective.ReadTuneTable(path)
		require.NoError(t, err)
		require.Len(t, tab.Sections, 2, "run %d lost a section", i)
	}
}
