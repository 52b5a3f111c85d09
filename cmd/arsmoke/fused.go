package main

// The fused mode (--fused): the all-reduce + residual add + RMSNorm that ends a
// tensor-parallel layer, in one launch (collective.Comm.AllReduceResidualRMSNorm) and as the
// unfused pair (an all-reduce, then collective.Comm.ResidualRMSNorm), swept over row counts
// instead of message sizes. This file holds the flags, the sweep, the report and its text;
// fused_gpu.go runs the cases on the GPU.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/ptx"
)

// fusedEps is the norm's epsilon in every fused case: the usual 1e-6 of LLM layers.
const fusedEps = 1e-6

// Defaults of the fused flags: a hidden size of the large models, and row counts from one
// decoded token to a prefill chunk.
const (
	defaultHidden = 8192
	defaultRows   = "1,8,32,128,512"
)

// fusedFlags are the fused mode's flags as typed; parse validates them.
type fusedFlags struct {
	on     bool
	hidden int
	rows   string
}

// register adds the fused mode's flags to fs.
func (f *fusedFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "fused", false, "measure the fused all-reduce + residual add + RMSNorm beside the unfused pair, over --rows instead of message sizes")
	fs.IntVar(&f.hidden, "hidden", defaultHidden, "with --fused: `N` elements per row (a multiple of 8 in 2048..16384)")
	fs.StringVar(&f.rows, "rows", defaultRows, "with --fused: row counts, a `list` of N or A-B (A, A*f, ... up to B)")
}

// fusedConfig is the validated fused mode: the rows of each case and the sweep's row counts,
// ascending, without repeats.
type fusedConfig struct {
	hidden int
	rows   []int
}

// sizes returns the bytes of each rank's input at each row count.
func (f *fusedConfig) sizes(dt dtype.DType) []int64 {
	s := make([]int64, len(f.rows))
	for i, rows := range f.rows {
		s[i] = int64(rows) * int64(f.hidden) * int64(dt.Size())
	}
	return s
}

// parse validates the fused flags against the rest of the command line (c, already
// validated; algoName is -a as typed) and, with --fused, sets c.fused, the blocks of -a and
// the byte range of the sweep. fs tells which flags were given.
func (f *fusedFlags) parse(fs *flag.FlagSet, c *config, algoName string) error {
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if !f.on {
		for _, name := range []string{"hidden", "rows"} {
			if given[name] {
				return fmt.Errorf("--%s sets the rows of the fused call: add --fused", name)
			}
		}
		return nil
	}
	for _, name := range []string{"b", "e"} {
		if given[name] {
			return fmt.Errorf("-%s sets message sizes, but --fused sweeps row counts: drop -%s and give --rows (and --hidden)", name, name)
		}
	}
	if h := f.hidden; h < ptx.MinHidden || h > ptx.MaxHidden || h%ptx.HiddenMultiple != 0 {
		return fmt.Errorf("--hidden %d: the fused call takes a multiple of %d elements in %d..%d", h, ptx.HiddenMultiple, ptx.MinHidden, ptx.MaxHidden)
	}
	rows, err := parseRows(f.rows, c.factor)
	if err != nil {
		return fmt.Errorf("--rows %q: %w", f.rows, err)
	}
	switch algoName {
	case "auto", "oneshot", "twoshot", "push":
		// push: the fused push kernel, and the pair's all-reduce push too
		if c.backend != backendNCCL {
			c.algos = []string{algoName}
		}
	case "all":
		// the kernels that take every row count (push takes calls up to PushMaxBytes)
		c.algos = []string{"oneshot", "twoshot"}
	}
	if c.backend == backendBoth {
		return fmt.Errorf("--backend both with --fused: run --backend goccl (the fused call beside goccl's unfused pair) and --backend nccl (the pair through NCCL's all-reduce) one after the other")
	}
	c.fused = &fusedConfig{hidden: f.hidden, rows: rows}
	sizes := c.fused.sizes(c.dtype)
	c.minBytes, c.maxBytes = sizes[0], sizes[len(sizes)-1]
	return nil
}

// parseRows reads a list of row counts: N, or A-B for A, A*factor, ... up to B. The result is
// ascending, without repeats.
func parseRows(s string, factor int64) ([]int, error) {
	var rows []int
	num := func(t string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(t))
		switch {
		case err != nil:
			return 0, fmt.Errorf("%q is not a row count: use N or A-B, separated by commas (e.g. 1,8,32 or 1-512)", t)
		case n < 1 || n >= ptx.MaxFusedRows:
			return 0, fmt.Errorf("%d rows: the fused call takes 1 to %d", n, ptx.MaxFusedRows-1)
		}
		return n, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		a, err := num(lo)
		if err != nil {
			return nil, err
		}
		if !isRange {
			rows = append(rows, a)
			continue
		}
		b, err := num(hi)
		if err != nil {
			return nil, err
		}
		if a > b {
			return nil, fmt.Errorf("range %s: %d is more than %d", strings.TrimSpace(item), a, b)
		}
		for n := int64(a); n <= int64(b); n *= factor {
			rows = append(rows, int(n))
			if n > int64(b)/factor {
				break // the next step passes b (and a huge -f would wrap around)
			}
		}
	}
	slices.Sort(rows)
	return slices.Compact(rows), nil
}

// planFused adjusts the communicators planned for a sweep (planEngine, which sized MaxBytes
// for the largest message, rows*hidden elements) to the fused mode: the fused call runs on
// goccl's kernels only, so they take every size of the sweep, where an all-reduce sweep would
// hand the largest to NCCL.
func planFused(cfg *engineConfig) {
	if g := cfg.Goccl; g != nil {
		g.MaxBytes = cfg.MaxBytes
	}
}

// FusedCase is one row count of the fused sweep.
type FusedCase struct {
	// Rows and Hidden are the shape of every call: Rows rows of Hidden elements.
	Rows, Hidden int
	// DType is the element type.
	DType dtype.DType
	// Eps is the norm's epsilon.
	Eps float32
	// Backend is "goccl": the fused call and the unfused pair on goccl's communicator; or
	// "nccl": the unfused pair only, its all-reduce through NCCL.
	Backend string
	// Algo is, for goccl, "auto" (the communicator's selection for each call) or the
	// algorithm that both the fused call and the pair's all-reduce are forced to: "oneshot"
	// or "twoshot"; for nccl, "nccl".
	Algo string
	// Graph captures the calls in a CUDA graph per rank and replays it.
	Graph bool
	// Iters is the number of timed calls of each kind, after Warmup untimed ones.
	Iters, Warmup int
	// Check asks for the correctness checks (see the manual, "Fused").
	Check bool
}

// FusedMeasurement is the result of one FusedCase.
type FusedMeasurement struct {
	// Fused and Unfused are the mean times of one fused call and of one unfused pair, on the
	// slowest rank; Fused is 0 with the nccl backend.
	Fused, Unfused time.Duration
	// AllReduce is the mean time of the pair's all-reduce alone, timed the same way: Unfused
	// less AllReduce is what the pair's norm kernel adds, the most that fusing the norm into
	// the all-reduce can save.
	AllReduce time.Duration
	// Path is the fused call's algorithm ("" with nccl); PairPath what served the pair's
	// all-reduce (oneshot, twoshot, push or nccl).
	Path, PairPath string
	// FusedWrong and UnfusedWrong count the wrong elements of both outputs (and of the
	// pair's sum), summed over the ranks; 0 when Check is off.
	FusedWrong, UnfusedWrong int64
	// First is the first wrong element; nil when nothing was wrong.
	First *FusedMismatch
}

// FusedMismatch locates one wrong element of the fused mode.
type FusedMismatch struct {
	// Call is "fused" or "unfused".
	Call string `json:"call"`
	// Output is "ResidualOut", "NormOut", or "sum" (the pair's all-reduce).
	Output string `json:"output"`
	Mismatch
}

// fusedEngine is an engine that also runs the fused mode's cases.
type fusedEngine interface {
	// RunFused checks (if asked) and times one FusedCase on every rank this process drives,
	// like engine.Run.
	RunFused(ctx context.Context, c FusedCase) (FusedMeasurement, error)
}

// sweepFused measures every algorithm of c at every row count and adds the rows to r. It
// stops at the first error, which names the case.
func sweepFused(ctx context.Context, eng engine, c config, r *report, prog *progress) error {
	fe, ok := eng.(fusedEngine)
	if !ok {
		return fmt.Errorf("this engine cannot run the fused call")
	}
	f := c.fused
	prog.start(len(c.algos) * len(f.rows))
	defer prog.clear()
	for _, algo := range c.algos {
		r.Fused.Blocks = append(r.Fused.Blocks, fusedBlock{Algo: algo, Backend: c.backend, Rows: []fusedRow{}})
		b := &r.Fused.Blocks[len(r.Fused.Blocks)-1]
		for _, rows := range f.rows {
			name := fmt.Sprintf("%s, %d rows of %d", algo, rows, f.hidden)
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("interrupted before %s: %w", name, err)
			}
			prog.step(name)
			m, err := fe.RunFused(ctx, FusedCase{Rows: rows, Hidden: f.hidden, DType: c.dtype, Eps: fusedEps, Backend: c.backend,
				Algo: algo, Graph: c.graph, Iters: c.iters, Warmup: c.warmup, Check: c.check})
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if !c.check {
				m.FusedWrong, m.UnfusedWrong, m.First = 0, 0, nil
			}
			if m.First != nil && r.Fused.First == nil {
				r.Fused.First = &fusedLocated{Algo: algo, Rows: rows, FusedMismatch: *m.First}
			}
			b.Rows = append(b.Rows, newFusedRow(rows, f.hidden, c.dtype, m))
		}
	}
	return nil
}

// fusedReport is what a --fused run has to say beside the report's header.
type fusedReport struct {
	Hidden int     `json:"hidden"`
	Rows   []int   `json:"rows"`
	Eps    float32 `json:"eps"`
	// Blocks has one block per algorithm, in the order measured.
	Blocks []fusedBlock `json:"blocks"`
	// First is the first wrong element of the whole run.
	First *fusedLocated `json:"first_mismatch,omitempty"`
}

// fusedBlock is the table of one algorithm.
type fusedBlock struct {
	// Algo is -a's algorithm, or "nccl" with --backend nccl.
	Algo    string     `json:"algo"`
	Backend string     `json:"backend"`
	Rows    []fusedRow `json:"rows"`
	// Wrong sums the rows' wrong elements.
	Wrong int64 `json:"wrong"`
	// AvgRatio is the geometric mean of the rows' ratios (0 without a fused time).
	AvgRatio float64 `json:"avg_ratio,omitempty"`
}

// fusedRow is one row count of a block.
type fusedRow struct {
	Rows  int    `json:"rows"`
	Bytes int64  `json:"bytes"` // each rank's input, rows*hidden elements
	Type  string `json:"type"`
	// Path is the fused call's algorithm; PairPath what served the pair's all-reduce.
	Path      string  `json:"path,omitempty"`
	PairPath  string  `json:"pair_path"`
	FusedUS   float64 `json:"fused_us,omitempty"`
	UnfusedUS float64 `json:"unfused_us"`
	// AllReduceUS is the pair's all-reduce alone (FusedMeasurement.AllReduce).
	AllReduceUS float64 `json:"allreduce_us"`
	// Ratio is the fused time over the unfused one: below 1, the fused call is faster.
	Ratio        float64 `json:"ratio,omitempty"`
	Wrong        int64   `json:"wrong"`
	FusedWrong   int64   `json:"fused_wrong"`
	UnfusedWrong int64   `json:"unfused_wrong"`
}

// fusedLocated is a FusedMismatch with the case it happened in.
type fusedLocated struct {
	Algo string `json:"algo"`
	Rows int    `json:"rows"`
	FusedMismatch
}

// newFusedReport starts the fused part of the report of c; nil without --fused.
func newFusedReport(c config) *fusedReport {
	if c.fused == nil {
		return nil
	}
	return &fusedReport{Hidden: c.fused.hidden, Rows: c.fused.rows, Eps: fusedEps, Blocks: []fusedBlock{}}
}

func newFusedRow(rows, hidden int, dt dtype.DType, m FusedMeasurement) fusedRow {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	row := fusedRow{Rows: rows, Bytes: int64(rows) * int64(hidden) * int64(dt.Size()), Type: dt.String(),
		Path: m.Path, PairPath: m.PairPath, FusedUS: us(m.Fused), UnfusedUS: us(m.Unfused), AllReduceUS: us(m.AllReduce),
		FusedWrong: m.FusedWrong, UnfusedWrong: m.UnfusedWrong, Wrong: m.FusedWrong + m.UnfusedWrong}
	if row.FusedUS > 0 && row.UnfusedUS > 0 {
		row.Ratio = row.FusedUS / row.UnfusedUS
	}
	return row
}

// finish sums the blocks up and returns the run's wrong elements; a nil report has none.
func (f *fusedReport) finish() int64 {
	if f == nil {
		return 0
	}
	var wrong int64
	for i := range f.Blocks {
		b := &f.Blocks[i]
		b.Wrong, b.AvgRatio = 0, 0
		var logRatio float64
		ratios := 0
		for _, row := range b.Rows {
			b.Wrong += row.Wrong
			if row.Ratio > 0 {
				logRatio += math.Log(row.Ratio)
				ratios++
			}
		}
		if ratios > 0 {
			b.AvgRatio = math.Exp(logRatio / float64(ratios))
		}
		wrong += b.Wrong
	}
	return wrong
}

// what names the run in the verdict: "fused, hidden 8192, 5 row counts".
func (f *fusedReport) what() string {
	what := fmt.Sprintf("%d row counts", len(f.Rows))
	if len(f.Rows) == 1 {
		what = "1 row count"
	}
	if len(f.Blocks) > 1 {
		what = fmt.Sprintf("%d algorithms x %s", len(f.Blocks), what)
	}
	return fmt.Sprintf("fused, hidden %d, %s", f.Hidden, what)
}

// firstMismatch describes the first wrong element for the verdict; "" when there is none.
func (f *fusedReport) firstMismatch() string {
	if f == nil || f.First == nil {
		return ""
	}
	m := f.First
	return fmt.Sprintf("%s, %d rows, %s call, %s, rank %d, element %d: expected %s, got %s",
		m.Algo, m.Rows, m.Call, m.Output, m.Rank, m.Index, m.Expected, m.Got)
}

// renderFused prints a --fused report: the header lines, one table per algorithm with its
// footer, then the verdict.
func renderFused(w io.Writer, r *report) {
	f := r.Fused
	launch := "eager"
	if r.Graph {
		launch = "CUDA graph per rank"
	}
	check := "on"
	if !r.Check {
		check = "off"
	}
	rows := make([]string, len(f.Rows))
	for i, n := range f.Rows {
		rows[i] = strconv.Itoa(n)
	}
	span := fmt.Sprintf("%v to %v", byteSize(r.MinBytes), byteSize(r.MaxBytes))
	if r.MinBytes == r.MaxBytes {
		span = byteSize(r.MinBytes).String()
	}
	fmt.Fprintf(w, "# arsmoke: fused all-reduce + residual add + RMSNorm of %s, hidden %d, rows %s (%s bytes per rank), eps %g, %d warm-up + %d timed iterations, %s, check %s\n",
		r.DType, f.Hidden, strings.Join(rows, ","), span, f.Eps, r.Warmup, r.Iters, launch, check)
	renderHost(w, r)
	switch r.Backend {
	case backendNCCL:
		fmt.Fprintln(w, "# backend nccl: the unfused pair only, NCCL's all-reduce into a sum buffer, then goccl's ResidualRMSNorm (NCCL has no fused call)")
	default:
		fmt.Fprintln(w, "# backend goccl: the fused call (one kernel) beside the unfused pair (goccl's all-reduce into a sum buffer, then ResidualRMSNorm); ResidualOut in place over the residual; ratio = fused / unfused, below 1 the fused call is faster")
	}
	if r.Check {
		sum := "bitwise against the reference of its algorithm"
		if r.Backend == backendNCCL {
			sum = fmt.Sprintf("within %s x sum|x| of the exact sum (NCCL adds in its own order)", ncclTolerance(dtypeOf(r), r.Ranks))
		}
		fused := "the fused call's outputs bitwise against the reference of its algorithm; "
		if r.Backend == backendNCCL {
			fused = ""
		}
		fmt.Fprintf(w, "# check: fresh activations, outputs poisoned, out of place; %sthe pair's sum %s, its outputs bitwise against the reference over that sum; on every rank\n", fused, sum)
	}
	renderDevices(w, r)
	for _, b := range f.Blocks {
		renderFusedBlock(w, r, b)
	}
	fmt.Fprintln(w, r.Verdict.Line)
}

// dtypeOf is the report's element type (the report keeps its name).
func dtypeOf(r *report) dtype.DType {
	dt, _ := dtype.Parse(r.DType)
	return dt
}

// fusedColumn is one column of a fused table: two header lines and the cell of a row.
type fusedColumn struct {
	width      int
	head, unit string
	cell       func(fusedRow) string
}

func renderFusedBlock(w io.Writer, r *report, b fusedBlock) {
	fused := b.Backend != backendNCCL
	us := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	cols := []fusedColumn{
		{8, "rows", "", func(x fusedRow) string { return strconv.Itoa(x.Rows) }},
		{12, "bytes", "(per rank)", func(x fusedRow) string { return strconv.FormatInt(x.Bytes, 10) }},
		{6, "type", "", func(x fusedRow) string { return x.Type }},
	}
	if fused {
		cols = append(cols, fusedColumn{9, "path", "(fused)", func(x fusedRow) string { return x.Path }})
	}
	cols = append(cols, fusedColumn{12, "pair path", "(all-reduce)", func(x fusedRow) string { return x.PairPath }})
	if fused {
		cols = append(cols, fusedColumn{9, "fused", "(us)", func(x fusedRow) string { return us(x.FusedUS) }})
	}
	cols = append(cols, fusedColumn{9, "unfused", "(us)", func(x fusedRow) string { return us(x.UnfusedUS) }})
	cols = append(cols, fusedColumn{10, "pair a-r", "alone (us)", func(x fusedRow) string { return us(x.AllReduceUS) }})
	if fused {
		cols = append(cols, fusedColumn{7, "ratio", "(f/u)", func(x fusedRow) string { return fmt.Sprintf("%.2f", x.Ratio) }})
	}
	cols = append(cols, fusedColumn{7, "#wrong", "", func(x fusedRow) string { return wrongCell(r, x.Wrong) }})
	line := func(cell func(fusedColumn) string) string {
		var sb strings.Builder
		for _, c := range cols {
			fmt.Fprintf(&sb, " %*s", c.width, cell(c))
		}
		return sb.String()
	}
	what := b.Algo
	if fused {
		what += " (fused call and pair all-reduce)"
	} else {
		what = "nccl (pair all-reduce)"
	}
	fmt.Fprintf(w, "# Algorithm: %s\n", what)
	comment(w, line(func(c fusedColumn) string { return c.head }))
	comment(w, line(func(c fusedColumn) string { return c.unit }))
	for _, row := range b.Rows {
		fmt.Fprintln(w, line(func(c fusedColumn) string { return c.cell(row) }))
	}
	renderWrong(w, r, b.Wrong)
	if fused {
		fmt.Fprintf(w, "# Avg ratio            : %.2f (geometric mean of fused / unfused)\n", b.AvgRatio)
	}
	fmt.Fprintln(w, "#")
}
