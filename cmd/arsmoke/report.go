package main

import (
	"fmt"
	"math"
	"runtime/debug"

	"github.com/goccl/goccl/dtype"
)

const modulePath = "github.com/goccl/goccl"

// gocclVersion names the goccl this binary was built from; tests pin it.
var gocclVersion = moduleVersion()

// report is everything a run has to say: the sweep fills it, then it is
// rendered as text (renderText) or JSON (renderJSON).
type report struct {
	Goccl   string `json:"goccl"`
	Host    string `json:"host"`
	Driver  string `json:"driver"`
	Mode    string `json:"mode"`
	Backend string `json:"backend"`
	NCCL    string `json:"nccl,omitempty"` // libnccl's version, when the run used it
	// KernelMaxBytes is the largest call of goccl's kernels when NCCL may take
	// the larger ones (--backend goccl -a auto; see planEngine), else 0.
	KernelMaxBytes int64        `json:"kernel_max_bytes,omitempty"`
	Ranks          int          `json:"ranks"`
	DType          string       `json:"dtype"`
	MinBytes       int64        `json:"min_bytes"`
	MaxBytes       int64        `json:"max_bytes"`
	Factor         int64        `json:"factor"`
	Sizes          int          `json:"sizes"`
	Warmup         int          `json:"warmup"`
	Iters          int          `json:"iters"`
	Graph          bool         `json:"graph"`
	Check          bool         `json:"check"`
	Devices        []RankDevice `json:"devices"`
	// Blocks has one block per algorithm, in the order measured.
	Blocks []block `json:"blocks"`
	// First is the first wrong element of the whole run.
	First *located `json:"first_mismatch,omitempty"`
	// Fused holds the results of a --fused run, whose Blocks stay empty.
	Fused *fusedReport `json:"fused,omitempty"`
	// Error says why the run stopped before the end.
	Error   string  `json:"error,omitempty"`
	Verdict verdict `json:"verdict"`

	// described is set once an engine described the devices: only then is
	// there a table to print.
	described bool
}

// block is the table of one algorithm.
type block struct {
	// Algo is goccl's algorithm (-a), or "nccl" with --backend nccl.
	Algo string `json:"algo"`
	// Backend is "goccl", "nccl", or "both": goccl's Algo with NCCL beside
	// it (each result then carries NCCL's and the speedup).
	Backend string `json:"backend"`
	Rows    []row  `json:"rows"`
	// Wrong sums the rows' wrong elements (goccl's and NCCL's).
	Wrong int64 `json:"wrong"`
	// AvgBusBW is the mean bus bandwidth over every size, out of place and
	// in place, as all_reduce_perf reports it (goccl's with both).
	AvgBusBW float64 `json:"avg_busbw_gbps"`
	// NCCLAvgBusBW is NCCL's AvgBusBW, with both.
	NCCLAvgBusBW float64 `json:"nccl_avg_busbw_gbps,omitempty"`
	// AvgSpeedup is the geometric mean of the rows' speedups, both
	// placements, with both.
	AvgSpeedup float64 `json:"avg_speedup,omitempty"`
}

// row is one size of a block.
type row struct {
	Bytes      int64  `json:"bytes"`
	Count      int64  `json:"count"`
	Type       string `json:"type"`
	RedOp      string `json:"redop"`
	Root       int    `json:"root"`
	OutOfPlace result `json:"out_of_place"`
	InPlace    result `json:"in_place"`
}

// result is one measurement of a row. Wrong means nothing when the report's
// Check is off.
type result struct {
	// Path is what served the calls: oneshot, twoshot, push or nccl.
	Path   string  `json:"path"`
	TimeUS float64 `json:"time_us"`
	AlgBW  float64 `json:"algbw_gbps"`
	BusBW  float64 `json:"busbw_gbps"`
	Wrong  int64   `json:"wrong"`
	// NCCL is NCCL's measurement of the same case, with --backend both.
	NCCL *result `json:"nccl,omitempty"`
	// Speedup is NCCL's time over goccl's, with --backend both: above 1,
	// goccl is faster. 0 when a time is missing.
	Speedup float64 `json:"speedup,omitempty"`
}

// located is a Mismatch with the case it happened in.
type located struct {
	Algo    string `json:"algo"`
	Bytes   int64  `json:"bytes"`
	InPlace bool   `json:"in_place"`
	Mismatch
}

// verdict is the one-line conclusion; Pass is what exit code 0 means.
type verdict struct {
	Pass bool   `json:"pass"`
	Line string `json:"line"`
}

// newReport starts the report of a run of c.
func newReport(c config) *report {
	return &report{
		Goccl:    gocclVersion,
		Ranks:    max(c.ranks, c.procs),
		Backend:  c.backend,
		DType:    c.dtype.String(),
		MinBytes: c.minBytes,
		MaxBytes: c.maxBytes,
		Factor:   c.factor,
		Sizes:    len(c.sizes()),
		Warmup:   c.warmup,
		Iters:    c.iters,
		Graph:    c.graph,
		Check:    c.check,
		Devices:  []RankDevice{},
		Blocks:   []block{},
		Fused:    newFusedReport(c),
	}
}

// describe records where the ranks run.
func (r *report) describe(h Header, ranks int, mode string) {
	r.Host, r.Driver, r.Devices, r.Ranks, r.Mode, r.NCCL = h.Host, h.Driver, h.Devices, ranks, mode, h.NCCL
	if r.Devices == nil {
		r.Devices = []RankDevice{}
	}
	r.described = true
}

// newRow turns the two measurements of one size into a row of the table;
// nccl holds NCCL's two beside them (--backend both), or is nil.
func newRow(bytes int64, dt dtype.DType, world int, outOfPlace, inPlace Measurement, nccl *[2]Measurement) row {
	r := row{
		Bytes:      bytes,
		Count:      bytes / int64(dt.Size()),
		Type:       dt.String(),
		RedOp:      "sum",
		Root:       -1,
		OutOfPlace: newResult(bytes, world, outOfPlace),
		InPlace:    newResult(bytes, world, inPlace),
	}
	if nccl != nil {
		for i, res := range []*result{&r.OutOfPlace, &r.InPlace} {
			n := newResult(bytes, world, nccl[i])
			res.NCCL = &n
			if res.TimeUS > 0 {
				res.Speedup = n.TimeUS / res.TimeUS
			}
		}
	}
	return r
}

// newResult computes the bandwidths the way all_reduce_perf does: algbw is
// the message size over the time; busbw scales it by 2(n-1)/n, the share of
// the data each rank sends and receives in a ring, so that it compares with
// the link speed whatever the rank count.
func newResult(bytes int64, world int, m Measurement) result {
	res := result{Path: m.Path, TimeUS: float64(m.Time.Nanoseconds()) / 1e3, Wrong: m.Wrong}
	if ns := m.Time.Nanoseconds(); ns > 0 {
		res.AlgBW = float64(bytes) / float64(ns) // bytes per ns is GB/s
		res.BusBW = res.AlgBW * 2 * float64(world-1) / float64(world)
	}
	return res
}

// finish sums the blocks up and concludes; runErr is why the run stopped
// early, or nil.
func (r *report) finish(runErr error) {
	var wrong int64
	for i := range r.Blocks {
		b := &r.Blocks[i]
		b.Wrong, b.AvgBusBW, b.NCCLAvgBusBW, b.AvgSpeedup = 0, 0, 0, 0
		var logSpeedup float64
		speedups := 0
		for _, row := range b.Rows {
			for _, res := range []result{row.OutOfPlace, row.InPlace} {
				b.Wrong += res.Wrong
				b.AvgBusBW += res.BusBW
				if res.NCCL != nil {
					b.Wrong += res.NCCL.Wrong
					b.NCCLAvgBusBW += res.NCCL.BusBW
					if i == 0 {
						// Every block shows the same NCCL measurements: count them once.
						wrong += res.NCCL.Wrong
					}
				}
				wrong += res.Wrong
				if res.Speedup > 0 {
					logSpeedup += math.Log(res.Speedup)
					speedups++
				}
			}
		}
		if len(b.Rows) > 0 {
			b.AvgBusBW /= float64(2 * len(b.Rows))
			b.NCCLAvgBusBW /= float64(2 * len(b.Rows))
		}
		if speedups > 0 {
			b.AvgSpeedup = math.Exp(logSpeedup / float64(speedups))
		}
	}
	wrong += r.Fused.finish()
	if runErr != nil {
		r.Error = runErr.Error()
	}
	r.Verdict = r.conclude(wrong)
}

func (r *report) conclude(wrong int64) verdict {
	what := fmt.Sprintf("%d sizes", r.Sizes)
	if len(r.Blocks) > 1 {
		what = fmt.Sprintf("%d algorithms x %d sizes", len(r.Blocks), r.Sizes)
	}
	if r.Fused != nil {
		what = r.Fused.what()
	}
	switch r.Backend {
	case backendNCCL:
		what += " through NCCL"
	case backendBoth:
		what += ", goccl beside NCCL"
	}
	what = fmt.Sprintf("%d ranks, %s, %s", r.Ranks, r.DType, what)
	switch {
	case r.Error != "" && r.Ranks == 0:
		return verdict{Line: "arsmoke: FAIL — " + r.Error}
	case r.Error != "":
		return verdict{Line: fmt.Sprintf("arsmoke: FAIL — %s: %s", what, r.Error)}
	case !r.Check:
		return verdict{Pass: true, Line: fmt.Sprintf("arsmoke: DONE — %s, results not checked (-c 0)", what)}
	case wrong > 0:
		line := fmt.Sprintf("arsmoke: FAIL — %s, %d wrong", what, wrong)
		if f := r.First; f != nil {
			line += fmt.Sprintf("; first: %s, %d B %s, rank %d, element %d: expected %s, got %s",
				f.Algo, f.Bytes, placement(f.InPlace), f.Rank, f.Index, f.Expected, f.Got)
		} else if f := r.Fused.firstMismatch(); f != "" {
			line += "; first: " + f
		}
		return verdict{Line: line}
	}
	return verdict{Pass: true, Line: fmt.Sprintf("arsmoke: PASS — %s, 0 wrong", what)}
}

func placement(inPlace bool) string {
	if inPlace {
		return "in-place"
	}
	return "out-of-place"
}

// moduleVersion reads goccl's version from the build information: a tagged
// version when built with go install ...@vX, else the VCS revision if the
// build recorded one.
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := ""
	if bi.Main.Path == modulePath {
		v = bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == modulePath {
			v = d.Version
		}
	}
	if v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		return "devel"
	}
	return "devel " + rev + dirty
}
