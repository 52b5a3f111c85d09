package collective

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/ptx"
)

// The package's tests expect the built-in selection (select_test.go, and the GPU tests, which
// pick sizes per algorithm): a tuning table in the user cache of the machine that runs them
// must not change it. The tests of tables turn them back on and name their files.
func init() {
	if _, set := os.LookupEnv(TuneEnv); !set {
		os.Setenv(TuneEnv, "off")
	}
}

var h200 = TuneKey{GPU: "NVIDIA H200", Capability: "9.0", Driver: 12080}

// sampleTable is a valid table: 4 virtual ranks on one GPU, and 8 GPUs over NVSwitch.
func sampleTable() *TuneTable {
	return &TuneTable{Format: TuneFormat, Version: TuneVersion, TuneKey: h200, Tool: "test",
		Sections: []TuneSection{{
			WorldSize: 4, Topology: TuneTopology{GPUs: 1, RanksPerGPU: 4, Processes: 1}, Scope: TuneScopeGPU, PushBlocks: 8,
			Entries: []TuneEntry{
				{Mode: TuneModeGraph, Direct: true, Bands: []TuneBand{
					{UpTo: 16 << 10, Algorithm: "push", Threads: 128},
					{UpTo: 256 << 10, Algorithm: "oneshot", Blocks: 16, Threads: 256},
					{Algorithm: "twoshot", Blocks: 24}}},
				{Mode: TuneModeEager, Direct: true, Bands: []TuneBand{
					{UpTo: 1 << 20, Algorithm: "oneshot", Blocks: 32},
					{Algorithm: "twoshot"}}},
				{Mode: TuneModeEager, Direct: false, Bands: []TuneBand{
					{UpTo: 32 << 10, Algorithm: "push", Blocks: 8},
					{UpTo: 4 << 20, Algorithm: "oneshot"}}},
			},
		}, {
			WorldSize: 8, Topology: TuneTopology{GPUs: 8, RanksPerGPU: 1, Links: "NV18 x28"}, Scope: TuneScopeSystem,
			Entries: []TuneEntry{{Mode: TuneModeEager, Direct: true, Bands: []TuneBand{{Algorithm: "oneshot"}}}},
		}}}
}

func writeTable(t *testing.T, tab *TuneTable) string {
	t.Helper()
	b, err := json.Marshal(tab)
	require.NoError(t, err)
	return writeFile(t, b)
}

func writeFile(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tune.json")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func TestTuneTableRoundTripAndDefaultPath(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", dir)
	path, err := DefaultTunePath(h200)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "goccl", "tune-nvidia-h200-sm90-cuda12080.json"), path)
	other, err := DefaultTunePath(TuneKey{GPU: "NVIDIA A100-SXM4-80GB", Capability: "8.0", Driver: 12040})
	require.NoError(t, err)
	assert.Equal(t, "tune-nvidia-a100-sxm4-80gb-sm80-cuda12040.json", filepath.Base(other))

	in := sampleTable()
	require.NoError(t, in.Write(path), "Write makes the folder")
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.HasSuffix(raw, []byte("}\n")))
	assert.Contains(t, string(raw), `"format": "goccl-tune"`)
	assert.Contains(t, string(raw), `"gpu": "NVIDIA H200"`, "the key's fields sit at the top level")
	out, err := ReadTuneTable(path)
	require.NoError(t, err)
	assert.Equal(t, in, out)

	bad := sampleTable()
	bad.Sections[0].Entries[0].Bands[1].Threads = 100
	assert.ErrorContains(t, bad.Write(path), "threads 100", "Write refuses what New would ignore")
	still, err := ReadTuneTable(path)
	require.NoError(t, err)
	assert.Equal(t, in, still, "a refused write leaves the file alone")
}

// TestParseTuneTableRefuses: corrupt, foreign or future files and impossible values are
// errors that say what is wrong and where.
func TestParseTuneTableRefuses(t *testing.T) {
	good, err := json.Marshal(sampleTable())
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		text string
		want string
	}{
		"truncated":      {string(good[:len(good)/2]), "not a valid JSON tuning table"},
		"not an object":  {`[1, 2]`, "not a valid JSON tuning table"},
		"foreign":        {`{"format": "nccl-tuner", "version": 1}`, `not a goccl tuning table (format "nccl-tuner"`},
		"future version": {strings.Replace(string(good), `"version":1`, `"version":2`, 1), "format version 2, but this goccl reads version 1"},
		"unknown field":  {strings.Replace(string(good), `"tool":"test"`, `"tool":"test","colour":"blue"`, 1), `unknown field "colour"`},
		"trailing text":  {string(good) + "{}", "after top-level value"},
	} {
		_, err := ParseTuneTable([]byte(tc.text))
		assert.ErrorContains(t, err, tc.want, name)
	}

	for name, tc := range map[string]struct {
		mutate func(*TuneTable)
		want   string
	}{
		"threads not a multiple of 32": {func(t *TuneTable) { t.Sections[0].Entries[0].Bands[1].Threads = 100 }, "sections[0]: entries[0]: bands[1]: threads 100"},
		"threads past 512":             {func(t *TuneTable) { t.Sections[0].Entries[0].Bands[1].Threads = 1024 }, "threads 1024"},
		"threads below 64":             {func(t *TuneTable) { t.Sections[0].Entries[0].Bands[1].Threads = 32 }, "threads 32"},
		"blocks past 64":               {func(t *TuneTable) { t.Sections[0].Entries[0].Bands[2].Blocks = 65 }, "blocks 65"},
		"negative blocks":              {func(t *TuneTable) { t.Sections[0].Entries[0].Bands[2].Blocks = -1 }, "blocks -1"},
		"unsorted": {func(t *TuneTable) { t.Sections[0].Entries[0].Bands[1].UpTo = 8 << 10 },
			"bands[1]: up_to 8192 does not follow 16384"},
		"open band not last":    {func(t *TuneTable) { t.Sections[0].Entries[0].Bands[0].UpTo = 0 }, "bands[0]: only the last band may leave up_to out"},
		"unknown algorithm":     {func(t *TuneTable) { t.Sections[0].Entries[1].Bands[1].Algorithm = "ring" }, `algorithm "ring"`},
		"auto is no algorithm":  {func(t *TuneTable) { t.Sections[0].Entries[1].Bands[1].Algorithm = "auto" }, `algorithm "auto"`},
		"nccl is no kernel":     {func(t *TuneTable) { t.Sections[0].Entries[1].Bands[1].Algorithm = "nccl" }, `algorithm "nccl"`},
		"graph not direct":      {func(t *TuneTable) { t.Sections[0].Entries[0].Direct = false }, "a graph entry must be direct"},
		"unknown mode":          {func(t *TuneTable) { t.Sections[0].Entries[1].Mode = "lazy" }, `mode "lazy"`},
		"no bands":              {func(t *TuneTable) { t.Sections[0].Entries[1].Bands = nil }, "entries[1]: no bands"},
		"duplicate entry":       {func(t *TuneTable) { t.Sections[0].Entries[2].Direct = true }, "entries[2]: the same mode and direct as entries[1]"},
		"duplicate section":     {func(t *TuneTable) { t.Sections = append(t.Sections, t.Sections[1]) }, "sections[2]: the same world size, topology and scope as sections[1]"},
		"push grid":             {func(t *TuneTable) { t.Sections[0].Entries[2].Bands[0].Blocks = 16 }, "push_blocks (8)"},
		"push_blocks past 64":   {func(t *TuneTable) { t.Sections[0].PushBlocks = 65 }, "push_blocks 65"},
		"world size":            {func(t *TuneTable) { t.Sections[1].WorldSize = 17 }, "world_size 17"},
		"gpu scope on 8 GPUs":   {func(t *TuneTable) { t.Sections[1].Scope = TuneScopeGPU }, `scope "gpu" needs every rank on one GPU`},
		"unknown scope":         {func(t *TuneTable) { t.Sections[1].Scope = "node" }, `scope "node"`},
		"shared without procs":  {func(t *TuneTable) { t.Sections[0].Topology.Processes = 0 }, "processes must be 1 to 4"},
		"GPUs without links":    {func(t *TuneTable) { t.Sections[1].Topology.Links = "" }, "8 GPUs need their links"},
		"too few places":        {func(t *TuneTable) { t.Sections[0].Topology.RanksPerGPU = 2 }, "cannot hold 4 ranks"},
		"capability":            {func(t *TuneTable) { t.Capability = "9" }, `capability "9"`},
		"driver":                {func(t *TuneTable) { t.Driver = 0 }, "driver 0"},
		"no GPU":                {func(t *TuneTable) { t.GPU = "" }, "no gpu"},
		"negative up_to":        {func(t *TuneTable) { t.Sections[0].Entries[1].Bands[0].UpTo = -4 }, "up_to -4"},
		"processes without GPU": {func(t *TuneTable) { t.Sections[1].Topology.Processes = 8 }, "processes is only given when ranks share a GPU"},
	} {
		tab := sampleTable()
		tc.mutate(tab)
		b, err := json.Marshal(tab)
		require.NoError(t, err)
		_, err = ParseTuneTable(b)
		assert.ErrorContains(t, err, tc.want, name)
	}
}

// tuneComm is a rank of a communicator of ws ranks on one GPU in one process, with o, whose
// notes are collected in logs.
func tuneComm(t *testing.T, rank, ws int, o Options, logs *[]string) *Comm {
	t.Helper()
	o.Logf = func(format string, args ...any) { *logs = append(*logs, fmt.Sprintf(format, args...)) }
	o, err := o.withDefaults()
	require.NoError(t, err)
	c := &Comm{rank: rank, size: ws, opts: o, major: 9, custom: true, scope: ptx.ScopeGPU, blocks: 33, pushBlocks: 16}
	infos := make([]rankInfo, ws)
	for r := range infos {
		infos[r].UUID, infos[r].PID = [16]byte{7}, 42
	}
	c.tuning.topo, c.tuning.uuids = placement(infos)
	return c
}

func noLinks(t *testing.T) func() string {
	return func() string {
		t.Error("the links were asked for a communicator on one GPU")
		return ""
	}
}

// TestReadTuning: New reads the table it is pointed at and keeps its sections for the
// communicator; anything wrong with it is a note, never an error, and the built-in
// selection stays.
func TestReadTuning(t *testing.T) {
	t.Setenv(TuneEnv, "")
	t.Setenv(TuneFileEnv, "")
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	good := writeTable(t, sampleTable())

	var logs []string
	c := tuneComm(t, 1, 4, Options{TuneFile: good}, &logs)
	d := c.readTuning(h200, noLinks(t))
	assert.NotZero(t, d)
	assert.Empty(t, c.notes)
	assert.Equal(t, good, c.tuning.path)
	require.Len(t, c.tuning.sections, 1)
	assert.Equal(t, 4, c.tuning.sections[0].WorldSize)
	again := tuneComm(t, 3, 4, Options{TuneFile: good}, &logs)
	assert.Equal(t, d, again.readTuning(h200, noLinks(t)), "every rank of the same table gets the same digest")

	ignored := func(name string, o Options, key TuneKey, want ...string) {
		t.Helper()
		var logs []string
		c := tuneComm(t, 2, 4, o, &logs)
		assert.Zero(t, c.readTuning(key, noLinks(t)), name)
		assert.Nil(t, c.tuning.sections, name)
		if len(want) == 0 {
			assert.Empty(t, c.notes, name)
			return
		}
		require.Len(t, c.notes, 1, name)
		for _, w := range want {
			assert.Contains(t, c.notes[0], w, name)
		}
		assert.Equal(t, []string{"goccl: rank 2: " + c.notes[0]}, logs, "%s: the note reaches Logf", name)
	}
	other := h200
	other.GPU = "NVIDIA A100-SXM4-80GB"
	ignored("another GPU", Options{TuneFile: good}, other, "ignored: it was measured on NVIDIA H200", "this is NVIDIA A100-SXM4-80GB", "arsmoke --tune")
	newer := h200
	newer.Driver = 12090
	ignored("another driver", Options{TuneFile: good}, newer, "CUDA driver 12.8", "CUDA driver 12.9")
	ignored("corrupt", Options{TuneFile: writeFile(t, []byte(`{"format": "goccl-tune", "vers`))}, h200, "ignored: not a valid JSON", "built-in selection")
	future := sampleTable()
	future.Version = 2
	ignored("future", Options{TuneFile: writeTable(t, future)}, h200, "format version 2")
	wrong := sampleTable()
	wrong.Sections[0].Entries[0].Bands[1].Threads = 100
	ignored("impossible", Options{TuneFile: writeTable(t, wrong)}, h200, "threads 100")
	ignored("named but missing", Options{TuneFile: filepath.Join(t.TempDir(), "none.json")}, h200, "not read", "none.json")
	ignored("default missing", Options{}, h200)
	ignored("NoTune", Options{TuneFile: good, NoTune: true}, h200)

	t.Setenv(TuneEnv, "off")
	ignored("GOCCL_TUNE=off wins over Options", Options{TuneFile: good}, h200)
	t.Setenv(TuneEnv, "maybe")
	ignored("GOCCL_TUNE not understood", Options{TuneFile: good}, h200, `GOCCL_TUNE="maybe" is not understood`)
	t.Setenv(TuneEnv, "on")

	var none []string
	three := tuneComm(t, 0, 3, Options{TuneFile: good}, &none)
	assert.Zero(t, three.readTuning(h200, noLinks(t)))
	assert.Contains(t, three.notes[0], "has no section for 3 ranks on 1 GPU, 3 ranks in 1 process")

	// GOCCL_TUNE_FILE, then the default path, are used without Options.TuneFile.
	t.Setenv(TuneFileEnv, good)
	fromEnv := tuneComm(t, 0, 4, Options{}, &none)
	assert.Equal(t, d, fromEnv.readTuning(h200, noLinks(t)))
	t.Setenv(TuneFileEnv, "")
	def, err := DefaultTunePath(h200)
	require.NoError(t, err)
	require.NoError(t, sampleTable().Write(def))
	fromCache := tuneComm(t, 0, 4, Options{}, &none)
	assert.Equal(t, d, fromCache.readTuning(h200, noLinks(t)))
	assert.Equal(t, def, fromCache.tuning.path)

	// The caller's grid options are part of the digest: ranks that leave Blocks to the
	// table and ranks that set it would launch different grids.
	fixed := tuneComm(t, 0, 4, Options{TuneFile: good, Blocks: DefaultBlocks}, &none)
	assert.NotEqual(t, d, fixed.readTuning(h200, noLinks(t)))
}

// TestReadTuningLinks: over several GPUs a section applies only to the same links, which are
// learnt only when the table has a section that needs them.
func TestReadTuningLinks(t *testing.T) {
	t.Setenv(TuneEnv, "on")
	good := writeTable(t, sampleTable())
	eight := func(links string) (*Comm, [16]byte, int) {
		var logs []string
		o, err := Options{TuneFile: good, Logf: func(string, ...any) {}}.withDefaults()
		require.NoError(t, err)
		c := &Comm{size: 8, opts: o}
		infos := make([]rankInfo, 8)
		for r := range infos {
			infos[r].UUID, infos[r].PID = [16]byte{byte(r)}, int64(100+r)
		}
		c.tuning.topo, c.tuning.uuids = placement(infos)
		asked := 0
		d := c.readTuning(h200, func() string { asked++; return links })
		_ = logs
		return c, d, asked
	}
	c, d, asked := eight("NV18 x28")
	assert.NotZero(t, d)
	assert.Equal(t, 1, asked)
	assert.Equal(t, TuneTopology{GPUs: 8, RanksPerGPU: 1}, c.tuning.topo, "processes only count where ranks share a GPU")
	assert.Len(t, c.tuning.uuids, 8)
	c, d, _ = eight("PHB x28")
	assert.Zero(t, d)
	assert.Contains(t, c.notes[0], "no section for 8 ranks on 8 GPUs, one rank each")

	tab := sampleTable()
	tab.Sections = tab.Sections[:1]
	only4 := writeTable(t, tab)
	o, err := Options{TuneFile: only4, Logf: func(string, ...any) {}}.withDefaults()
	require.NoError(t, err)
	c = &Comm{size: 8, opts: o}
	c.tuning.topo = TuneTopology{GPUs: 8, RanksPerGPU: 1}
	assert.Zero(t, c.readTuning(h200, func() string { t.Error("links asked with no section to compare"); return "" }))
}

// adopted is a rank of 4 virtual ranks that read the sample table, then adopted it with the
// digests of every rank (the same unless differ names ranks) on a GPU of sms SMs.
func adopted(t *testing.T, rank int, o Options, sms int, differ ...int) *Comm {
	t.Helper()
	t.Setenv(TuneEnv, "on")
	o.TuneFile = writeTable(t, sampleTable())
	var logs []string
	c := tuneComm(t, rank, 4, o, &logs)
	d := c.readTuning(h200, noLinks(t))
	infos := make([]rankInfo, 4)
	for r := range infos {
		infos[r].Tune = d
	}
	for _, r := range differ {
		infos[r].Tune = [16]byte{}
	}
	c.adoptTuning(infos, sms, 1, 4)
	return c
}

func TestAdoptTuning(t *testing.T) {
	c := adopted(t, 1, Options{}, 132)
	require.NotNil(t, c.tuning.table)
	assert.Empty(t, c.notes)
	assert.Equal(t, 33, c.tuning.cap, "132 SMs, one block each, 4 ranks")
	assert.Equal(t, 8, c.pushBlocks, "the section's push grid")
	assert.Equal(t, 32, c.tuning.table.largestGrid())

	// A rank without the table (or another one): every rank falls back, and says so alike.
	r0, r2 := adopted(t, 0, Options{}, 132, 2), adopted(t, 2, Options{}, 132, 2)
	assert.Nil(t, r0.tuning.table)
	assert.Nil(t, r2.tuning.table)
	require.Len(t, r0.notes, 1)
	assert.Equal(t, r0.notes, r2.notes)
	assert.Contains(t, r0.notes[0], "rank 2 loaded another tuning table than rank 0")
	assert.Equal(t, 16, r0.pushBlocks)

	// Grids past what the ranks can keep resident: 64 SMs / 4 ranks = 16 blocks, the table
	// asks for 24 and 32.
	small := adopted(t, 0, Options{}, 64)
	assert.Nil(t, small.tuning.table)
	assert.Contains(t, small.notes[0], "more than the 16 every rank can keep resident here")
	// The caller's Blocks replaces the table's, so the same table fits.
	ok := adopted(t, 0, Options{Blocks: 8}, 64)
	assert.NotNil(t, ok.tuning.table)
	assert.Empty(t, ok.notes)

	sys := adopted(t, 0, Options{}, 132)
	sys.tuning.table, sys.notes = nil, nil
	sys.scope = ptx.ScopeSystem
	infos := make([]rankInfo, 4)
	for r := range infos {
		infos[r].Tune = [16]byte{1}
	}
	sys.adoptTuning(infos, 132, 1, 4)
	assert.Nil(t, sys.tuning.table)
	assert.Contains(t, sys.notes[0], "no section for system-scope barriers")

	none := &Comm{size: 4}
	none.adoptTuning(make([]rankInfo, 4), 132, 1, 4)
	assert.Nil(t, none.tuning.table)
	assert.Empty(t, none.notes, "no table anywhere: nothing to say")
}

// TestTunedSelection: calls follow the table's bands per mode and output, with its grids, and
// the caller's options still win.
func TestTunedSelection(t *testing.T) {
	c := adopted(t, 0, Options{}, 132)
	builtin := func(n int64, direct bool) Algorithm {
		return selectAlgorithm(9, 4, n, c.opts.PushMaxBytes, direct, true)
	}
	// Eager, output registered (direct).
	assert.Equal(t, OneShot, c.selected(16<<10, true))
	assert.Equal(t, OneShot, c.selected(1<<20, true))
	assert.Equal(t, TwoShot, c.selected(1<<20+16, true))
	// Eager, plain output.
	assert.Equal(t, Push, c.selected(32<<10, false))
	assert.Equal(t, OneShot, c.selected(32<<10+16, false))
	assert.Equal(t, builtin(8<<20, false), c.selected(8<<20, false), "past the last band: built in")
	// Captured: the graph entry, for Selected inside Capture and SelectedCaptured.
	assert.Equal(t, Push, c.SelectedCaptured(16<<10))
	assert.Equal(t, OneShot, c.SelectedCaptured(256<<10))
	assert.Equal(t, TwoShot, c.SelectedCaptured(256<<10+16))
	c.capture = newCaptureState()
	assert.Equal(t, Push, c.selected(1<<10, true))
	c.capture = nil

	// Grids: the band's, when its algorithm is the one that runs.
	shape := func(graph bool, algo Algorithm, n int64, direct bool) [2]int {
		if graph {
			c.capture = newCaptureState()
			defer func() { c.capture = nil }()
		}
		b, th := c.shape(algo, int((n+15)/16), n, direct)
		return [2]int{b, th}
	}
	assert.Equal(t, [2]int{16, 256}, shape(true, OneShot, 256<<10, true), "16 blocks of 256 threads (16384 vectors)")
	assert.Equal(t, [2]int{8, 128}, shape(true, Push, 16<<10, true), "the section's push grid, the band's threads")
	assert.Equal(t, [2]int{24, 512}, shape(true, TwoShot, 8<<20, true), "the band's grid limit, automatic threads")
	assert.Equal(t, [2]int{32, 512}, shape(false, OneShot, 1<<20, true))
	own := func(algo Algorithm, n int64) [2]int {
		b, th := launchShape(algo, int(n/16), 4, c.blocks, c.pushBlocks, 0)
		return [2]int{b, th}
	}
	assert.Equal(t, own(TwoShot, 512<<10), shape(false, TwoShot, 512<<10, true), "a forced algorithm outside its band: the communicator's grid")
	assert.Equal(t, own(OneShot, 8<<20), shape(false, OneShot, 8<<20, false), "no band: the communicator's grid")
	assert.Equal(t, [2]int{33, 512}, own(OneShot, 8<<20))
	assert.Equal(t, [2]int{8, 64}, shape(false, Push, 1<<10, false), "push keeps its grid in every band")

	// A Push band past PushMaxBytes falls back to the built-in selection.
	c.opts.PushMaxBytes = 16 << 10
	assert.Equal(t, builtin(24<<10, false), c.selected(24<<10, false))
	assert.NotEqual(t, Push, c.selected(24<<10, false))
	c.opts.PushMaxBytes = DefaultPushMaxBytes

	// Selecting and shaping a call costs no allocation.
	allocs := testing.AllocsPerRun(100, func() {
		a := c.selected(512<<10, true)
		c.shape(a, 32768, 512<<10, true)
	})
	assert.Zero(t, allocs)

	// The caller's options win: Algorithm, Blocks, ThreadsPerBlock, PushBlocks.
	forced := adopted(t, 0, Options{Algorithm: TwoShot}, 132)
	assert.Equal(t, TwoShot, forced.selected(1<<10, true))
	mine := adopted(t, 0, Options{Blocks: 20, ThreadsPerBlock: 128, PushBlocks: 12}, 132)
	mine.blocks, mine.pushBlocks = 20, 12
	require.NotNil(t, mine.tuning.table)
	b, th := mine.shape(OneShot, 32768, 512<<10, true)
	assert.Equal(t, [2]int{20, 128}, [2]int{b, th})
	b, th = mine.shape(Push, 64, 1<<10, false)
	assert.Equal(t, [2]int{12, 128}, [2]int{b, th})
}

func TestTuneTopologyAndLinks(t *testing.T) {
	assert.Equal(t, "NV18 x28", summarizeLinks(slicesRepeat("NV18", 28)))
	assert.Equal(t, "NV12 x1, NV6 x2, SYS x3", summarizeLinks([]string{"NV6", "SYS", "NV12", "SYS", "NV6", "SYS"}))
	assert.Equal(t, linksUnknown, summarizeLinks([]string{"NV18", linksUnknown}))
	assert.Equal(t, "", summarizeLinks(nil))

	assert.Equal(t, "1 GPU, 8 ranks in 1 process", TuneTopology{GPUs: 1, RanksPerGPU: 8, Processes: 1}.String())
	assert.Equal(t, "1 GPU, 4 ranks in 4 processes", TuneTopology{GPUs: 1, RanksPerGPU: 4, Processes: 4}.String())
	assert.Equal(t, "8 GPUs, one rank each, links NV18 x28", TuneTopology{GPUs: 8, RanksPerGPU: 1, Links: "NV18 x28"}.String())
	assert.Equal(t, "2 GPUs, up to 2 ranks each, in 1 process, links NV4 x1", TuneTopology{GPUs: 2, RanksPerGPU: 2, Processes: 1, Links: "NV4 x1"}.String())

	infos := []rankInfo{{rankFacts: rankFacts{UUID: [16]byte{1}, PID: 5, Process: 50}}, {rankFacts: rankFacts{UUID: [16]byte{2}, PID: 5, Process: 50}}, {rankFacts: rankFacts{UUID: [16]byte{1}, PID: 6, Process: 60}}}
	topo, uuids := placement(infos)
	assert.Equal(t, TuneTopology{GPUs: 2, RanksPerGPU: 2, Processes: 2}, topo)
	// processes are told apart by their identity, not their PID (containers may share one)
	infos[2].PID = 5
	topo, _ = placement(infos)
	assert.Equal(t, 2, topo.Processes)
	assert.Equal(t, []string{formatUUID([16]byte{1}), formatUUID([16]byte{2})}, uuids)
}

func slicesRepeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestNotesLoggedOncePerProcess: without Logf a note goes to the standard logger once, however
// many ranks of the process meet it; each rank's Notes still has it.
func TestNotesLoggedOncePerProcess(t *testing.T) {
	var buf bytes.Buffer
	log.SetOutput(&buf)
	defer log.SetOutput(os.Stderr)
	// A message of this run's own: the process logs each one once, also across -count runs.
	msg := fmt.Sprintf("tuning table /nowhere/%s/%d ignored", t.Name(), time.Now().UnixNano())
	a, b := &Comm{rank: 0}, &Comm{rank: 1}
	a.note("%s", msg)
	b.note("%s", msg)
	assert.Equal(t, 1, strings.Count(buf.String(), "goccl: "+msg))
	assert.Equal(t, []string{msg}, a.Notes())
	assert.Equal(t, []string{msg}, b.Notes())
}

func TestRankInfoCarriesTuneDigest(t *testing.T) {
	in := rankInfo{rankFacts: rankFacts{PID: 1, Tune: [16]byte{1, 2, 3, 15: 9}}}
	b, err := in.marshal()
	require.NoError(t, err)
	out, err := unmarshalRankInfo(b)
	require.NoError(t, err)
	assert.Equal(t, in.Tune, out.Tune)
}
