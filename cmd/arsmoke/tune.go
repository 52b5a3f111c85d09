package main

// --tune: measure every algorithm and a few grids on this machine and write the tuning table
// that package collective loads (docs/tuning.md). This file holds the flags, the plan, the
// derivation of the table from the measurements and the summary, none of which needs a GPU;
// tune_gpu.go measures.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/ptx"
	"golang.org/x/sys/unix"
)

// Iterations of --tune where -n and -w are not given: enough to rank candidates a few percent
// apart, few enough to measure hundreds of them in minutes.
const (
	tuneIters       = 50
	tuneWarmup      = 10
	tuneQuickIters  = 20
	tuneQuickWarmup = 5
)

// tuneRepeats is how many times --tune times each case (--quick: once), every repeat a pass
// over the grid's cases, so that a case's times are taken apart from one another; the
// fastest counts. Host-side delays only ever add time: with virtual ranks an eager call's
// time swung by up to 16x between neighbouring sizes of one pass (an H100, 4 ranks: push 63.6
// us at 32 KiB, 3.9 at 64 KiB), and one such time decided a size's band.
const tuneRepeats = 3

// tuneTolerance is how much slower than the fastest candidate a size's choice may be when
// that keeps it in the band below (fewer bands) or on the built-in choice: differences this
// small are within the noise of one measurement.
const tuneTolerance = 0.02

// The grids --tune tries: blocks per launch of OneShot and TwoShot (capped by what the ranks
// can keep resident), Push's fixed grid, and block sizes (0: automatic, as without a table).
var (
	tunePullBlocks      = []int{16, 24, 32, 36, 48, 64}
	tunePushBlocks      = []int{8, 16, 32}
	tuneThreads         = []int{0, 256}
	tuneQuickPullBlocks = []int{16, 36, 64}
	tuneQuickPushBlocks = []int{16}
	tuneQuickThreads    = []int{0}
)

// tuneWorldsDefault are the world sizes tuned on one GPU (virtual ranks) unless --worlds says.
var tuneWorldsDefault = []int{2, 4, 8}

// tuneFlags holds --tune and the flags only it reads, as typed.
type tuneFlags struct {
	on     bool
	quick  bool
	worlds string
	output string
}

// register adds the flags to fs.
func (f *tuneFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "tune", false, "measure every algorithm and grid on this machine and write a tuning table goccl loads")
	fs.BoolVar(&f.quick, "quick", false, "with --tune: fewer grids and iterations")
	fs.StringVar(&f.worlds, "worlds", "", "with --tune: the world `sizes` to tune, e.g. 2,4,8")
	fs.StringVar(&f.output, "o", "", "with --tune: write the table to `file` instead of the one goccl loads by default")
}

// tuneConfig is --tune's part of the validated command line.
type tuneConfig struct {
	quick  bool
	worlds []int  // nil: from the GPUs found (tuneWorlds)
	output string // "": collective.DefaultTunePath
}

// parse validates the flags of --tune into c (c.tune stays nil without --tune). The sweep's
// flags keep their meaning (-b, -e, -f, -d, -n, -w, --ranks, --device, --procs, --timeout);
// those that pick one kind of measurement are refused, since --tune measures them all.
func (f *tuneFlags) parse(fs *flag.FlagSet, c *config, algoName string) error {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if !f.on {
		for _, name := range []string{"quick", "worlds", "o"} {
			if set[name] {
				return fmt.Errorf("%s is a flag of --tune: add --tune, or drop it", dashed(name))
			}
		}
		return nil
	}
	switch {
	case algoName != "auto":
		return fmt.Errorf("-a %s: --tune measures every algorithm: drop -a", algoName)
	case c.graph:
		return errors.New("-g: --tune measures captured and eager calls both: drop -g")
	case c.backend != backendGoccl:
		return fmt.Errorf("--backend %s: --tune measures goccl's kernels: drop --backend", c.backend)
	case !c.check:
		return errors.New("-c 0: --tune checks every result: drop -c")
	case c.json:
		return errors.New("--json: --tune prints a summary and writes the table as JSON (-o names the file): drop --json")
	case c.topo:
		return errors.New("--topo and --tune exclude each other")
	case c.fused != nil:
		return errors.New("--fused and --tune exclude each other: --tune measures AllReduce")
	}
	t := &tuneConfig{quick: f.quick, output: f.output}
	if set["worlds"] {
		var err error
		if t.worlds, err = parseWorlds(f.worlds); err != nil {
			return err
		}
		switch {
		case c.ranks != 0:
			return errors.New("--ranks and --worlds exclude each other: --ranks N tunes N ranks, --worlds several world sizes")
		case c.procs != 0 && !slices.Equal(t.worlds, []int{c.procs}):
			return fmt.Errorf("--worlds %s: --procs %d tunes %d ranks, one per process: drop --worlds", f.worlds, c.procs, c.procs)
		}
	}
	if !set["n"] {
		c.iters = tuneIters
		if t.quick {
			c.iters = tuneQuickIters
		}
	}
	if !set["w"] {
		c.warmup = tuneWarmup
		if t.quick {
			c.warmup = tuneQuickWarmup
		}
	}
	c.tune = t
	return nil
}

// dashed writes a flag's name as the manual does: -o, --tune.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// parseWorlds reads --worlds: world sizes separated by commas, sorted and without repeats.
func parseWorlds(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < minWorld || n > maxWorld {
			return nil, fmt.Errorf("--worlds %q: want world sizes %d to %d separated by commas, e.g. 2,4,8", s, minWorld, maxWorld)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// tuneWorlds is the world sizes to tune with visible GPUs: --procs N or --ranks N: N;
// --worlds; on one GPU (or --device) tuneWorldsDefault; else 2 to the number of GPUs.
func tuneWorlds(c config, visible int) []int {
	switch {
	case c.procs != 0:
		return []int{c.procs}
	case c.ranks != 0:
		return []int{c.ranks}
	case c.tune.worlds != nil:
		return c.tune.worlds
	case visible <= 1 || c.device >= 0:
		return tuneWorldsDefault
	}
	var w []int
	for n := minWorld; n <= min(visible, maxWorld); n++ {
		w = append(w, n)
	}
	return w
}

// tuneMode is one kind of call the table distinguishes.
type tuneMode int

const (
	// modeGraph: calls recorded by Capture and replayed (outputs always shared: direct).
	modeGraph tuneMode = iota
	// modeEagerDirect: eager calls on registered inputs and outputs (zero copy, direct TwoShot).
	modeEagerDirect
	// modeEager: eager calls on unregistered buffers (the input staged, TwoShot through tmp).
	modeEager
)

var tuneModes = []tuneMode{modeGraph, modeEagerDirect, modeEager}

// entry is the mode as the table names it.
func (m tuneMode) entry() (mode string, direct bool) {
	switch m {
	case modeGraph:
		return collective.TuneModeGraph, true
	case modeEagerDirect:
		return collective.TuneModeEager, true
	}
	return collective.TuneModeEager, false
}

func (m tuneMode) String() string {
	switch m {
	case modeGraph:
		return "graph"
	case modeEagerDirect:
		return "eager, registered"
	}
	return "eager"
}

// pushMode is the mode whose Push measurements stand for m's: Push reads its input in place
// and writes its output itself whether or not they are registered, so it is measured once
// for eager calls.
func (m tuneMode) pushMode() tuneMode {
	if m == modeEager {
		return modeEagerDirect
	}
	return m
}

// tuneGrid is the grid of one communicator --tune measures: Options.Blocks, PushBlocks and
// ThreadsPerBlock. Pull and Push say which algorithms are measured with it (grids pair a pull
// grid with a push grid, so that fewer communicators cover them all).
type tuneGrid struct {
	Blocks, PushBlocks, Threads int
	Pull, Push                  bool
}

// blocks is the grid's block count for algo: PushBlocks for Push, else Blocks.
func (g tuneGrid) blocks(algo collective.Algorithm) int {
	if algo == collective.Push {
		return g.PushBlocks
	}
	return g.Blocks
}

func (g tuneGrid) String() string {
	var parts []string
	if g.Pull {
		parts = append(parts, fmt.Sprintf("pull %s", gridName(g.Blocks, g.Threads)))
	}
	if g.Push {
		parts = append(parts, fmt.Sprintf("push %s", gridName(g.PushBlocks, g.Threads)))
	}
	return strings.Join(parts, ", ")
}

// gridName writes blocks x threads, "auto" for automatic threads.
func gridName(blocks, threads int) string {
	if threads == 0 {
		return fmt.Sprintf("%dxauto", blocks)
	}
	return fmt.Sprintf("%dx%d", blocks, threads)
}

// tuneCase is one measurement on the open grid.
type tuneCase struct {
	Mode  tuneMode
	Algo  collective.Algorithm
	Bytes int64
}

// tunePlan is everything --tune measures for one world size.
type tunePlan struct {
	grids []tuneGrid
	sizes []int64
	// pushMax is the largest size Push is measured at (the communicators' PushMaxBytes).
	pushMax int64
}

// planTune lists the grids and sizes for a communicator described by t. Every block count is
// capped by t.MaxBlocks, and the communicator's own grid (t.Blocks, t.PushBlocks, automatic
// threads) is always among them: the built-in choice is measured too.
func planTune(t collective.TuneTarget, sizes []int64, quick bool) tunePlan {
	pull, push, threads := tunePullBlocks, tunePushBlocks, tuneThreads
	if quick {
		pull, push, threads = tuneQuickPullBlocks, tuneQuickPushBlocks, tuneQuickThreads
	}
	capped := func(list []int, own int) []int {
		out := []int{min(own, t.MaxBlocks)}
		for _, b := range list {
			out = append(out, max(1, min(b, t.MaxBlocks)))
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	pull, push = capped(pull, t.Blocks), capped(push, t.PushBlocks)
	p := tunePlan{sizes: sizes, pushMax: t.PushMaxBytes}
	for _, th := range threads {
		for i := range max(len(pull), len(push)) {
			p.grids = append(p.grids, tuneGrid{
				Blocks: pull[min(i, len(pull)-1)], PushBlocks: push[min(i, len(push)-1)], Threads: th,
				Pull: i < len(pull), Push: i < len(push),
			})
		}
	}
	return p
}

// cases lists what grid g measures, in order.
func (p tunePlan) cases(g tuneGrid) []tuneCase {
	var out []tuneCase
	for _, m := range tuneModes {
		if g.Pull {
			for _, a := range []collective.Algorithm{collective.OneShot, collective.TwoShot} {
				for _, s := range p.sizes {
					out = append(out, tuneCase{m, a, s})
				}
			}
		}
		if g.Push && m.pushMode() == m {
			for _, s := range p.sizes {
				if s <= p.pushMax {
					out = append(out, tuneCase{m, collective.Push, s})
				}
			}
		}
	}
	return out
}

// steps counts the cases of the plan.
func (p tunePlan) steps() int {
	n := 0
	for _, g := range p.grids {
		n += len(p.cases(g))
	}
	return n
}

// tuneSample is one measured case: the mean time of one all-reduce, with its grid (for Push,
// Blocks is its grid).
type tuneSample struct {
	tuneCase
	Blocks, Threads int
	Time            time.Duration
}

// tuneChoice is an algorithm with its grid.
type tuneChoice struct {
	Algo            collective.Algorithm
	Blocks, Threads int
}

func (c tuneChoice) String() string { return c.Algo.String() + " " + gridName(c.Blocks, c.Threads) }

// tuneRow is the outcome at one size of one mode: the choice, and the built-in one.
type tuneRow struct {
	Mode                    tuneMode
	Bytes                   int64
	Chosen, Builtin         tuneChoice
	ChosenTime, BuiltinTime time.Duration // BuiltinTime 0: not measured
}

// gain is how much faster the choice is than the built-in one: 0.1 is 10% faster.
func (r tuneRow) gain() float64 {
	if r.BuiltinTime == 0 || r.ChosenTime == 0 {
		return 0
	}
	return float64(r.BuiltinTime)/float64(r.ChosenTime) - 1
}

// deriveSection turns the measurements of one world size into its table section and the
// rows of the summary. builtin is the built-in selection's algorithm for a mode and size;
// its grid is the communicator's own (t.Blocks or t.PushBlocks, automatic threads).
//
// Push's grid is one number for every call of a communicator (collective.TuneSection), so
// it is chosen first: the push grid with which the fastest choice at each size, push or not,
// is the least slower than the fastest of all, summed over every mode and size. Then, at each
// size, the fastest algorithm and grid wins; among those within tuneTolerance of it, the
// previous size's choice (fewer bands) and then the built-in one are kept. A lone size whose
// choice differs from the same choice on both sides, which is nearly as fast there, takes it
// too. OneShot limits that launch the same grid at a size (sameLaunch) count as one choice
// there, whatever their single measurements say. Consecutive sizes with one choice form a
// band; the last band has no upper limit.
func deriveSection(t collective.TuneTarget, samples []tuneSample, sizes []int64, builtin func(tuneMode, int64) collective.Algorithm) (collective.TuneSection, []tuneRow) {
	type key struct {
		mode  tuneMode
		c     tuneChoice
		bytes int64
	}
	times := map[key]time.Duration{}
	var pushGrids []int
	for _, s := range samples {
		times[key{s.Mode, tuneChoice{s.Algo, s.Blocks, s.Threads}, s.Bytes}] = s.Time
		if s.Algo == collective.Push {
			pushGrids = append(pushGrids, s.Blocks)
		}
	}
	slices.Sort(pushGrids)
	pushGrids = slices.Compact(pushGrids)
	// candidates is every measured choice of mode m at size s, push restricted to pushBlocks
	// (0: any), with its time.
	candidates := func(m tuneMode, s int64, pushBlocks int) map[tuneChoice]time.Duration {
		out := map[tuneChoice]time.Duration{}
		for k, d := range times {
			switch {
			case k.bytes != s:
			case k.c.Algo == collective.Push && k.mode == m.pushMode() && (pushBlocks == 0 || k.c.Blocks == pushBlocks):
				out[k.c] = d
			case k.c.Algo != collective.Push && k.mode == m:
				out[k.c] = d
			}
		}
		return out
	}
	fastest := func(cands map[tuneChoice]time.Duration) (tuneChoice, time.Duration) {
		var best tuneChoice
		var bestTime time.Duration
		for c, d := range cands {
			// Ties go to the smaller choice, so that the outcome does not depend on map order.
			if bestTime == 0 || d < bestTime || d == bestTime && lessChoice(c, best) {
				best, bestTime = c, d
			}
		}
		return best, bestTime
	}

	pushBlocks := t.PushBlocks
	if len(pushGrids) > 0 && !slices.Contains(pushGrids, pushBlocks) {
		pushBlocks = pushGrids[0]
	}
	bestScore := math.Inf(1)
	// The communicator's own push grid is scored first: another must do strictly better.
	order := append([]int{pushBlocks}, pushGrids...)
	for _, pb := range order {
		score := 0.0
		for _, m := range tuneModes {
			for _, s := range sizes {
				_, all := fastest(candidates(m, s, 0))
				_, with := fastest(candidates(m, s, pb))
				if all > 0 && with > 0 {
					score += float64(with) / float64(all)
				}
			}
		}
		if score < bestScore*(1-1e-9) {
			pushBlocks, bestScore = pb, score
		}
	}

	sec := collective.TuneSection{WorldSize: t.WorldSize, Topology: t.Topology, Scope: t.Scope, PushBlocks: pushBlocks}
	var rows []tuneRow
	for _, m := range tuneModes {
		var measured []int64
		var choice []tuneChoice
		var cands []map[tuneChoice]time.Duration
		var best []time.Duration
		for _, s := range sizes {
			cs := candidates(m, s, pushBlocks)
			if len(cs) == 0 {
				continue
			}
			b, bt := fastest(cs)
			pick := b
			bi := tuneChoice{Algo: builtin(m, s), Blocks: t.Blocks}
			if bi.Algo == collective.Push {
				bi.Blocks = pushBlocks
			}
			near := func(c tuneChoice) bool {
				d, ok := cs[c]
				return ok && (float64(d) <= float64(bt)*(1+tuneTolerance) || sameLaunch(c, b, s))
			}
			switch {
			case len(choice) > 0 && near(choice[len(choice)-1]):
				pick = choice[len(choice)-1]
			case near(bi):
				pick = bi
			}
			measured, choice, cands, best = append(measured, s), append(choice, pick), append(cands, cs), append(best, bt)
		}
		for i := 1; i+1 < len(choice); i++ {
			if d, ok := cands[i][choice[i-1]]; ok && choice[i-1] == choice[i+1] && choice[i] != choice[i-1] &&
				(float64(d) <= float64(best[i])*(1+2*tuneTolerance) || sameLaunch(choice[i-1], choice[i], measured[i])) {
				choice[i] = choice[i-1]
			}
		}
		if len(choice) == 0 {
			continue
		}
		mode, direct := m.entry()
		e := collective.TuneEntry{Mode: mode, Direct: direct}
		for i, c := range choice {
			if i+1 < len(choice) && choice[i+1] == c {
				continue
			}
			b := collective.TuneBand{UpTo: measured[i], Algorithm: c.Algo.String(), Blocks: c.Blocks, Threads: c.Threads}
			if c.Algo == collective.Push {
				b.Blocks = 0 // the section's push_blocks
			}
			e.Bands = append(e.Bands, b)
		}
		e.Bands[len(e.Bands)-1].UpTo = 0
		sec.Entries = append(sec.Entries, e)
		for i, s := range measured {
			bi := tuneChoice{Algo: builtin(m, s), Blocks: t.Blocks}
			biTime := times[key{m, bi, s}]
			if bi.Algo == collective.Push {
				bi.Blocks = t.PushBlocks
				biTime = times[key{m.pushMode(), bi, s}]
			}
			rows = append(rows, tuneRow{Mode: m, Bytes: s, Chosen: choice[i], ChosenTime: cands[i][choice[i]], Builtin: bi, BuiltinTime: biTime})
		}
	}
	return sec, rows
}

// sameLaunch reports whether two OneShot choices launch the same grid for a message of
// nbytes: OneShot takes as many blocks as the message needs, at most the limit, so limits at or
// above that number are one launch, and whatever their measured times say is noise. (TwoShot
// spreads a small shard over its whole limit, and push's grid is fixed: their limits always
// count.)
func sameLaunch(a, b tuneChoice, nbytes int64) bool {
	if a.Algo != collective.OneShot || b.Algo != collective.OneShot || a.Threads != b.Threads {
		return false
	}
	threads := int64(a.Threads)
	if threads == 0 {
		threads = ptx.ThreadsPerBlock
	}
	nvec := (nbytes + ptx.VectorBytes - 1) / ptx.VectorBytes
	need := int((nvec + threads - 1) / threads)
	return min(a.Blocks, need) == min(b.Blocks, need)
}

// lessChoice orders choices: by algorithm, then blocks, then threads.
func lessChoice(a, b tuneChoice) bool {
	if a.Algo != b.Algo {
		return a.Algo < b.Algo
	}
	if a.Blocks != b.Blocks {
		return a.Blocks < b.Blocks
	}
	return a.Threads < b.Threads
}

// tuneResult is what --tune learnt about one world size.
type tuneResult struct {
	Target  collective.TuneTarget
	Section collective.TuneSection
	Rows    []tuneRow
	Grids   int
	Elapsed time.Duration
}

// mergeTune is the table to write: old's sections (when old is a table of the same machine)
// except those the new sections replace, then the new ones, sorted by world size. kept counts
// old's sections kept.
func mergeTune(old *collective.TuneTable, key collective.TuneKey, tool string, created time.Time, sections []collective.TuneSection) (t *collective.TuneTable, kept int) {
	t = &collective.TuneTable{Format: collective.TuneFormat, Version: collective.TuneVersion, TuneKey: key, Created: created, Tool: tool}
	same := func(a, b collective.TuneSection) bool {
		return a.WorldSize == b.WorldSize && a.Topology == b.Topology && a.Scope == b.Scope
	}
	if old != nil && old.TuneKey == key {
		for _, s := range old.Sections {
			if !slices.ContainsFunc(sections, func(n collective.TuneSection) bool { return same(s, n) }) {
				t.Sections = append(t.Sections, s)
				kept++
			}
		}
	}
	t.Sections = append(t.Sections, sections...)
	slices.SortStableFunc(t.Sections, func(a, b collective.TuneSection) int {
		if a.WorldSize != b.WorldSize {
			return a.WorldSize - b.WorldSize
		}
		return strings.Compare(a.Topology.String()+a.Scope, b.Topology.String()+b.Scope)
	})
	return t, kept
}

// saveTune writes the table of results to path (merged with a table of the same machine
// already there) and says what it did.
func saveTune(results []tuneResult, path, tool string, now time.Time) (string, error) {
	key := results[0].Target.Key
	var sections []collective.TuneSection
	for _, r := range results {
		if r.Target.Key != key {
			return "", fmt.Errorf("the ranks ran on different GPUs or drivers (%v, %v): tune each kind of GPU on its own", key, r.Target.Key)
		}
		sections = append(sections, r.Section)
	}
	// Another arsmoke --tune may be merging into the same table (each world size or GPU of a
	// machine tuned by a run of its own): the read, the merge and the write happen under an
	// exclusive lock, or the later write would drop what the earlier one added.
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return "", fmt.Errorf("lock the table against other arsmoke --tune runs: %w", err)
	}
	defer unlock()
	old, err := collective.ReadTuneTable(path)
	note := ""
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		note = fmt.Sprintf(" (replacing a table that goccl could not use: %v)", err)
	case old.TuneKey != key:
		note = fmt.Sprintf(" (replacing the table of %v)", old.TuneKey)
	}
	t, kept := mergeTune(old, key, tool, now, sections)
	if err := t.Write(path); err != nil {
		return "", err
	}
	if kept > 0 {
		note += fmt.Sprintf(" (kept %s of the table there)", plural(kept, "section", "sections"))
	}
	return fmt.Sprintf("wrote %s: %s%s", path, plural(len(sections), "section", "sections"), note), nil
}

// lockFile takes an exclusive lock (flock) on the file at path, creating it and its folder,
// and returns what releases it. The lock goes with the process if it dies.
func lockFile(path string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return func() { f.Close() }, nil // closing the descriptor releases the lock
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// renderTune prints the summary: per world size the crossovers and grids chosen for each mode,
// and per size the choice against the built-in one.
func renderTune(w io.Writer, c config, results []tuneResult) error {
	var b strings.Builder
	k := results[0].Target.Key
	fmt.Fprintf(&b, "# goccl tuning: %v\n", k)
	fmt.Fprintf(&b, "# %v, %v to %v (factor %d), %d iterations after %d warm-up, out of place, every result checked\n",
		c.dtype, byteSize(c.minBytes), byteSize(c.maxBytes), c.factor, c.iters, c.warmup)
	for _, r := range results {
		t := r.Target
		fmt.Fprintf(&b, "\n## %d ranks: %v; %s-scope barriers; grids of up to %d blocks; %s measured in %v\n",
			t.WorldSize, t.Topology, t.Scope, t.MaxBlocks, plural(r.Grids, "communicator", "communicators"), r.Elapsed.Round(time.Second))
		fmt.Fprintf(&b, "push blocks: %d (built-in %d); pull grid built in: %s\n", r.Section.PushBlocks, t.PushBlocks, gridName(t.Blocks, 0))
		for _, m := range tuneModes {
			var rows []tuneRow
			for _, row := range r.Rows {
				if row.Mode == m {
					rows = append(rows, row)
				}
			}
			if len(rows) == 0 {
				continue
			}
			mode, direct := m.entry()
			i := slices.IndexFunc(r.Section.Entries, func(e collective.TuneEntry) bool { return e.Mode == mode && e.Direct == direct })
			fmt.Fprintf(&b, "\n%s: %s\n", m, describeBands(r.Section.Entries[i].Bands, r.Section.PushBlocks))
			logSum, most, mostAt := 0.0, 0.0, int64(0)
			fmt.Fprintf(&b, "%10s  %-16s %9s  %-16s %9s  %7s\n", "size", "tuned", "us", "built-in", "us", "gain")
			for _, row := range rows {
				bi := "-"
				if row.BuiltinTime > 0 {
					bi = fmt.Sprintf("%.2f", us(row.BuiltinTime))
				}
				fmt.Fprintf(&b, "%10s  %-16s %9.2f  %-16s %9s  %6.1f%%\n", byteSize(row.Bytes), row.Chosen, us(row.ChosenTime), row.Builtin, bi, 100*row.gain())
				logSum += math.Log1p(row.gain())
				if g := row.gain(); g > most {
					most, mostAt = g, row.Bytes
				}
			}
			fmt.Fprintf(&b, "gain over the built-in choice: %.1f%% on average (geometric)", 100*math.Expm1(logSum/float64(len(rows))))
			if most > 0 {
				fmt.Fprintf(&b, ", %.1f%% at most (%v)", 100*most, byteSize(mostAt))
			}
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// describeBands writes the bands as crossovers: "push 16xauto up to 16K, oneshot 16xauto up to
// 128K, twoshot 16x256 above".
func describeBands(bands []collective.TuneBand, pushBlocks int) string {
	parts := make([]string, len(bands))
	for i, bd := range bands {
		blocks := bd.Blocks
		if bd.Algorithm == collective.Push.String() {
			blocks = pushBlocks
		}
		limit := "above"
		if bd.UpTo != 0 {
			limit = "up to " + byteSize(bd.UpTo).String()
		}
		if i == 0 && bd.UpTo == 0 {
			limit = "at every size"
		}
		parts[i] = fmt.Sprintf("%s %s %s", bd.Algorithm, gridName(blocks, bd.Threads), limit)
	}
	return strings.Join(parts, ", ")
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// tuneRunner measures the all-reduces of --tune on the ranks of one world size that this
// process drives (all of them, or one in a --procs child). tune_gpu.go has the real one.
type tuneRunner interface {
	// Target is what the table section of these ranks is keyed by, and their grids' limits.
	Target() collective.TuneTarget
	// Builtin is the built-in selection's algorithm for a call of mode m and bytes.
	Builtin(m tuneMode, bytes int64) collective.Algorithm
	// Open makes the communicators of grid g (replacing the previous grid's), with the
	// inputs and outputs each mode needs.
	Open(ctx context.Context, g tuneGrid) error
	// Time measures one case on the open grid and checks its results: wrong results are an
	// error.
	Time(ctx context.Context, tc tuneCase) (time.Duration, error)
	// Close releases everything.
	Close() error
}

// newTuneRunner builds the runner for the ranks of cfg; tests replace it.
var newTuneRunner = func(ctx context.Context, cfg engineConfig, dt dtype.DType, iters, warmup int) (tuneRunner, error) {
	return newGPUTuner(ctx, cfg, dt, iters, warmup)
}

// tuneWorld measures one world size with the runner built for cfg, saying on stderr what it is
// about to measure (a run takes minutes, and the progress line shows only on a terminal).
// In a --procs child, group combines each case's time with the other processes'.
func tuneWorld(ctx context.Context, cfg engineConfig, c config, group *resultGroup, prog *progress, stderr io.Writer) (res tuneResult, err error) {
	start := time.Now()
	r, err := newTuneRunner(ctx, cfg, c.dtype, c.iters, c.warmup)
	if err != nil {
		return res, err
	}
	if group != nil {
		r = &combinedTuner{tuneRunner: r, group: group}
	}
	defer func() {
		if cerr := r.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	t := r.Target()
	plan := planTune(t, c.sizes(), c.tune.quick)
	repeats := tuneRepeats
	if c.tune.quick {
		repeats = 1
	}
	if cfg.Proc == nil || cfg.Proc.Rank == 0 {
		timed := "each timed once"
		if repeats > 1 {
			timed = fmt.Sprintf("each timed %d times (the fastest counts)", repeats)
		}
		fmt.Fprintf(stderr, "arsmoke: --tune: %d ranks (%v): %s, %d cases, %s\n", t.WorldSize, t.Topology,
			plural(len(plan.grids), "communicator", "communicators"), plan.steps(), timed)
	}
	prog.start(plan.steps() * repeats)
	defer prog.clear()
	var samples []tuneSample
	for _, g := range plan.grids {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("interrupted: %w", err)
		}
		if err := r.Open(ctx, g); err != nil {
			return res, fmt.Errorf("grid %v: %w", g, err)
		}
		cases := plan.cases(g)
		fastest := make([]time.Duration, len(cases))
		for range repeats {
			for i, tc := range cases {
				name := fmt.Sprintf("%d ranks, %s, %s %s, %v", t.WorldSize, tc.Mode, tc.Algo, gridName(g.blocks(tc.Algo), g.Threads), byteSize(tc.Bytes))
				if err := ctx.Err(); err != nil {
					return res, fmt.Errorf("interrupted before %s: %w", name, err)
				}
				prog.step(name)
				d, err := r.Time(ctx, tc)
				if err != nil {
					return res, fmt.Errorf("%s: %w", name, err)
				}
				if fastest[i] == 0 || d < fastest[i] {
					fastest[i] = d
				}
			}
		}
		for i, tc := range cases {
			samples = append(samples, tuneSample{tuneCase: tc, Blocks: g.blocks(tc.Algo), Threads: g.Threads, Time: fastest[i]})
		}
	}
	res.Target, res.Grids = t, len(plan.grids)
	res.Section, res.Rows = deriveSection(t, samples, plan.sizes, r.Builtin)
	res.Elapsed = time.Since(start)
	return res, nil
}

// runTune is arsmoke --tune: it measures every world size, and in the process that prints
// (rank 0 of --procs, or the only one) writes the table and prints the summary.
func runTune(ctx context.Context, c config, proc *procInfo, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "arsmoke: --tune: %s\n", fmt.Sprintf(format, a...))
		return exitFail
	}
	visible, err := countDevices()
	if errors.Is(err, errNoDriver) {
		return fail("find GPUs: %v (set GOCCL_LIBCUDA to the path of libcuda.so.1 if the NVIDIA driver is installed in an unusual place)", err)
	}
	if err != nil {
		return fail("find GPUs: %v", err)
	}
	prog := newProgress(stderr, c)
	var group *resultGroup
	if proc != nil {
		// Every process times its own rank: the table takes each case's slowest rank, and a
		// rank that fails a case fails every rank there (combinedTuner).
		if group, err = joinResults(ctx, proc, c.timeout); err != nil {
			return fail("%v", err)
		}
		defer group.boot.Close()
	}
	var results []tuneResult
	for _, w := range tuneWorlds(c, visible) {
		devices, err := planDevices(visible, w, c.device)
		if err != nil {
			// The machine, not the flags: the exit status of a run that finds too few GPUs.
			return fail("%v", err)
		}
		cfg := engineConfig{Devices: devices, MaxBytes: (c.maxBytes + 15) / 16 * 16, Timeout: c.timeout}
		if proc != nil {
			cfg.Devices, cfg.Proc = devices[proc.Rank:proc.Rank+1], proc
		}
		res, err := tuneWorld(ctx, cfg, c, group, prog, stderr)
		if err != nil {
			return fail("%s: %v", describeMode(devices, c.procs), err)
		}
		results = append(results, res)
	}
	if proc != nil && proc.Rank != 0 {
		// Rank 0 writes the table, perhaps waiting for its lock behind another --tune run:
		// wait for it, so that the parent, once this process has ended, does not give rank 0
		// no more than --timeout to follow and stop it halfway.
		if _, err := group.end(ctx, ""); err != nil {
			return fail("%v", err)
		}
		return exitPass
	}
	if group != nil {
		defer group.end(ctx, "")
	}
	path := c.tune.output
	if path == "" {
		if path, err = collective.DefaultTunePath(results[0].Target.Key); err != nil {
			return fail("%v; or name the file with -o", err)
		}
	}
	tool := fmt.Sprintf("arsmoke --tune (goccl %s): %v, %v to %v, %d iterations", gocclVersion, c.dtype, byteSize(c.minBytes), byteSize(c.maxBytes), c.iters)
	if c.tune.quick {
		tool += ", quick"
	}
	saved, err := saveTune(results, path, tool, time.Now().UTC().Truncate(time.Second))
	if err != nil {
		return fail("write the table: %v", err)
	}
	if err := renderTune(stdout, c, results); err != nil {
		return fail("write the summary: %v", err)
	}
	fmt.Fprintf(stdout, "\narsmoke: %s\n", saved)
	return exitPass
}
