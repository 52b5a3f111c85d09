// Command goals renders what scripts/bench/goals.sh measured as the status tables of
// docs/benchmarks.md, in Markdown:
//
//	go run ./scripts/bench/goals DIR...
//
// Each DIR is an output folder of goals.sh: one run of every part, or one folder per part where
// each part ran in a call of its own. A file that two folders both hold is an error (the same
// measurement twice); the header (date, commit, GPU) comes from the first folder that has it.
// Each part found is rendered, the others are left out:
//
//   - the fused all-reduce + residual + RMSNorm against the unfused pair, one CUDA graph per
//     rank (fused_ws*_p*.json, arsmoke --fused --json) and in the fork/join harness
//     (forkjoin_fused.txt), with A, the pair's all-reduce alone, and the room 0.75*pair - A: what
//     a fused kernel that reduces no faster than that all-reduce has left for the residual add
//     and the norm if it is to take at most 0.75 of the pair;
//   - the twelve target points at GPU and system scope (points.txt), with the harness floor of
//     the same run and the target's figures for the seed design's v2 kernels;
//   - the tuning table's summary (tune.log) and arsmoke's default run with and without it
//     (default_*.log).
//
// Ranges are over the passes (min-max); a figure measured once has no range. Nothing here is
// asserted: the tables say where each goal is met and where it is not.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: goals DIR...   (DIR: an output folder of scripts/bench/goals.sh)")
		return 2
	}
	out, err := render(args)
	if err != nil {
		fmt.Fprintf(stderr, "goals: %v\n", err)
		return 1
	}
	_, err = io.WriteString(stdout, out)
	if err != nil {
		fmt.Fprintf(stderr, "goals: %v\n", err)
		return 1
	}
	return 0
}

// render reads every part goals.sh wrote into dirs and returns the tables of those it found.
func render(dirs []string) (string, error) {
	files, err := list(dirs)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	header(&b, files)
	parts := 0
	fused, err := readFusedRuns(files)
	if err != nil {
		return "", err
	}
	if len(fused) > 0 {
		renderFusedGraphs(&b, fused)
		parts++
	}
	bench, err := readBench(files["forkjoin_fused.txt"])
	if err != nil {
		return "", err
	}
	if len(bench) > 0 {
		renderFusedForkJoin(&b, bench)
		parts++
	}
	bench, err = readBench(files["points.txt"])
	if err != nil {
		return "", err
	}
	if len(bench) > 0 {
		renderPoints(&b, bench)
		parts++
	}
	if ok, err := renderTune(&b, files); err != nil {
		return "", err
	} else if ok {
		parts++
	}
	if parts == 0 {
		return "", fmt.Errorf("%s: none of goals.sh's outputs (fused_ws*_p*.json, forkjoin_fused.txt, points.txt, tune.log, default_*.log)", strings.Join(dirs, ", "))
	}
	return b.String(), nil
}

// headerFiles are what every run of goals.sh writes; list takes them from the first folder.
var headerFiles = []string{"date.txt", "gpu.txt", "build.json"}

// list maps the name of every file in dirs to its path; a measurement that two folders hold is
// an error (the header files and the steps' standard error, .err, are taken from the first).
func list(dirs []string) (map[string]string, error) {
	files := map[string]string{}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			name, path := e.Name(), filepath.Join(dir, e.Name())
			prev, seen := files[name]
			switch {
			case !seen:
				files[name] = path
			case !slices.Contains(headerFiles, name) && !strings.HasSuffix(name, ".err"):
				return nil, fmt.Errorf("%s and %s: the same measurement twice; render one of them", prev, path)
			}
		}
	}
	return files, nil
}

// header names the run: its date, goccl's build as arsmoke reported it (build.json) and the GPU
// and driver (gpu.txt).
func header(b *strings.Builder, files map[string]string) {
	var build struct {
		Goccl string `json:"goccl"`
	}
	if data, err := os.ReadFile(files["build.json"]); err == nil {
		_ = json.Unmarshal(data, &build) // a run that failed leaves the build unknown
	}
	fmt.Fprintf(b, "Measured %s at %s on %s (virtual ranks on one GPU) by scripts/bench/goals.sh.\n",
		orUnknown(firstLine(files["date.txt"])), orUnknown(build.Goccl), orUnknown(firstLine(files["gpu.txt"])))
}

// firstLine is the first line of the file at path, trimmed; "" if there is none.
func firstLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(data), "\n")
	return strings.TrimSpace(line)
}

// orUnknown is s, or "(not recorded)" for "".
func orUnknown(s string) string {
	if s == "" {
		return "(not recorded)"
	}
	return s
}

// span is the values one figure took over the passes.
type span []float64

func (s span) String() string {
	if len(s) == 0 {
		return ""
	}
	lo, hi := slices.Min(s), slices.Max(s)
	if fmt.Sprintf("%.2f", lo) == fmt.Sprintf("%.2f", hi) {
		return fmt.Sprintf("%.2f", lo)
	}
	return fmt.Sprintf("%.2f-%.2f", lo, hi)
}

// fusedRun is the part of arsmoke --fused --json that the tables use.
type fusedRun struct {
	Goccl string `json:"goccl"`
	Ranks int    `json:"ranks"`
	Fused *struct {
		Blocks []struct {
			Rows []struct {
				Rows        int     `json:"rows"`
				Path        string  `json:"path"`
				FusedUS     float64 `json:"fused_us"`
				UnfusedUS   float64 `json:"unfused_us"`
				AllReduceUS float64 `json:"allreduce_us"`
				Wrong       int64   `json:"wrong"`
			} `json:"rows"`
		} `json:"blocks"`
	} `json:"fused"`
	Error string `json:"error"`
}

// fusedPoint gathers one (ranks, rows) point over the passes.
type fusedPoint struct {
	ranks, rows           int
	paths                 []string
	fused, pair, a, ratio span
	room                  span
	wrong                 int64
}

// add takes one pass's fused, pair and all-reduce times (us) and the fused call's path.
func (p *fusedPoint) add(fused, pair, a float64, path string) {
	p.fused = append(p.fused, fused)
	p.pair = append(p.pair, pair)
	p.a = append(p.a, a)
	p.ratio = append(p.ratio, fused/pair)
	p.room = append(p.room, 0.75*pair-a)
	if path != "" && !slices.Contains(p.paths, path) {
		p.paths = append(p.paths, path)
	}
}

// verdict says where a fused point stands against the goal: at most 0.75 of the pair up to
// 128 rows, and never slower.
func (p *fusedPoint) verdict() string {
	worst := slices.Max(p.ratio)
	switch {
	case worst > 1:
		return "slower"
	case p.rows <= 128 && worst > 0.75:
		return "missed"
	}
	return "met"
}

var fusedRunName = regexp.MustCompile(`^fused_ws(\d+)_p(\d+)\.json$`)

// readFusedRuns reads every fused_ws*_p*.json of files into points keyed by ranks and rows,
// in order. A run that stopped early is an error: its table would be short without saying so.
func readFusedRuns(files map[string]string) ([]*fusedPoint, error) {
	points := map[[2]int]*fusedPoint{}
	builds := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if !fusedRunName.MatchString(name) {
			continue
		}
		data, err := os.ReadFile(files[name])
		if err != nil {
			return nil, err
		}
		var r fusedRun
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("%s: not arsmoke's JSON (%v): see the file (and %s.err) for what the run printed", files[name], err, name)
		}
		if r.Error != "" || r.Fused == nil {
			return nil, fmt.Errorf("%s: the run stopped: %s", files[name], orUnknown(r.Error))
		}
		builds[r.Goccl] = true
		for _, blk := range r.Fused.Blocks {
			for _, row := range blk.Rows {
				k := [2]int{r.Ranks, row.Rows}
				p := points[k]
				if p == nil {
					p = &fusedPoint{ranks: r.Ranks, rows: row.Rows}
					points[k] = p
				}
				p.add(row.FusedUS, row.UnfusedUS, row.AllReduceUS, row.Path)
				p.wrong += row.Wrong
			}
		}
	}
	if len(builds) > 1 {
		return nil, fmt.Errorf("the fused runs come from %d builds of goccl (%v): one folder a build", len(builds), slices.Sorted(maps.Keys(builds)))
	}
	return sortedPoints(points), nil
}

// sortedPoints lists the points by ranks, then rows.
func sortedPoints(m map[[2]int]*fusedPoint) []*fusedPoint {
	return slices.SortedFunc(maps.Values(m), func(a, b *fusedPoint) int {
		if a.ranks != b.ranks {
			return a.ranks - b.ranks
		}
		return a.rows - b.rows
	})
}

// renderFusedGraphs writes the one-graph-per-rank table of the fused call against the pair.
func renderFusedGraphs(b *strings.Builder, points []*fusedPoint) {
	b.WriteString("\n### Fused against the pair, one graph per rank\n\n")
	b.WriteString("`arsmoke --fused --hidden 8192 --rows 1,8,32,128,512 -g --json --ranks N --device 0`, us a layer; A is the pair's all-reduce alone, room = 0.75 pair - A.\n\n")
	b.WriteString("| ranks | rows | path | fused | pair | fused / pair | A | room | goal | wrong |\n")
	b.WriteString("|---:|---:|---|---:|---:|---:|---:|---:|---|---:|\n")
	for _, p := range points {
		fmt.Fprintf(b, "| %d | %d | %s | %v | %v | %v | %v | %v | %s | %d |\n", p.ranks, p.rows, strings.Join(p.paths, ", "),
			p.fused, p.pair, p.ratio, p.a, p.room, p.verdict(), p.wrong)
	}
	tally(b, points)
}

// tally counts the points that meet the goal.
func tally(b *strings.Builder, points []*fusedPoint) {
	met, slower := 0, 0
	for _, p := range points {
		switch p.verdict() {
		case "met":
			met++
		case "slower":
			slower++
		}
	}
	fmt.Fprintf(b, "\nGoal met at %d of %d points; slower than the pair at %d.\n", met, len(points), slower)
}

// benchResults maps a benchmark's name (without "Benchmark" and the -GOMAXPROCS suffix) and
// unit to its values, one per run of it.
type benchResults map[string]map[string]span

var procsSuffix = regexp.MustCompile(`-\d+$`)

// readBench reads `go test -bench` output; no file ("") is no results.
func readBench(path string) (benchResults, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res := benchResults{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(fields[1]); err != nil {
			continue // a log line that starts with a benchmark's name
		}
		name := procsSuffix.ReplaceAllString(strings.TrimPrefix(fields[0], "Benchmark"), "")
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				continue
			}
			if res[name] == nil {
				res[name] = map[string]span{}
			}
			res[name][fields[i+1]] = append(res[name][fields[i+1]], v)
		}
	}
	return res, sc.Err()
}

// value is the benchmark's figures in unit, one a run, and whether it ran.
func (r benchResults) value(name, unit string) (span, bool) {
	s, ok := r[name][unit]
	return s, ok && len(s) > 0
}

var fusedBenchName = regexp.MustCompile(`^AllReduceResidualRMSNorm/ws(\d+)/rows(\d+)/fused$`)

// renderFusedForkJoin writes the fork/join harness's table of the fused call against the pair,
// from BenchmarkAllReduceResidualRMSNorm's fused, unfused and allreduce variants.
func renderFusedForkJoin(b *strings.Builder, r benchResults) {
	m := map[[2]int]*fusedPoint{}
	for name := range r {
		sub := fusedBenchName.FindStringSubmatch(name)
		if sub == nil {
			continue
		}
		ws, _ := strconv.Atoi(sub[1])
		rows, _ := strconv.Atoi(sub[2])
		base := strings.TrimSuffix(name, "fused")
		fused, ok1 := r.value(name, "us/layer")
		pair, ok2 := r.value(base+"unfused", "us/layer")
		a, ok3 := r.value(base+"allreduce", "us/layer")
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		p := &fusedPoint{ranks: ws, rows: rows}
		for i := range min(len(fused), len(pair), len(a)) {
			p.add(fused[i], pair[i], a[i], "")
		}
		m[[2]int{ws, rows}] = p
	}
	points := sortedPoints(m)
	if len(points) == 0 {
		return
	}
	b.WriteString("\n### Fused against the pair, fork/join harness\n\n")
	b.WriteString("`BenchmarkAllReduceResidualRMSNorm/ws(2|4|8)/rows(1|8|32|128|512)$/(fused|unfused|allreduce)$`, `-test.benchtime 10x`, us a layer.\n\n")
	b.WriteString("| ranks | rows | fused | pair | fused / pair | A | room | goal |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range points {
		fmt.Fprintf(b, "| %d | %d | %v | %v | %v | %v | %v | %s |\n", p.ranks, p.rows, p.fused, p.pair, p.ratio, p.a, p.room, p.verdict())
	}
	tally(b, points)
}

// v2 holds the performance target's figures for the seed design's v2 kernels (the best of its
// one-shot pull, one-shot push and two-shot pull, each where its own table allows), us per
// all-reduce in the fork/join harness, bf16, virtual ranks on one H200, measured on another
// day beside an empty-kernel floor of v2Floor us a layer. They are comparable with an H200's
// run only, and only as far as its floor is the same.
var (
	v2 = map[int][4]float64{
		2: {2.01, 2.37, 3.92, 8.01},
		4: {2.99, 3.54, 5.23, 15.14},
		8: {5.84, 7.55, 10.03, 40.49},
	}
	v2Floor = map[int]float64{2: 0.72, 4: 1.45, 8: 3.57}
)

var pointSizes = []string{"16K", "256K", "1M", "8M"}

// renderPoints writes the twelve points: every kernel at both scopes, the best out of place at
// each, and the best at system scope against the v2 figure.
func renderPoints(b *strings.Builder, r benchResults) {
	b.WriteString("\n### The target points\n\n")
	b.WriteString("`BenchmarkAllReduceGrid/ws(2|4|8)/(16K|256K|1M|8M)/(oneshot|twoshot-direct|push|twoshot-inplace)/(gpu|sys)/blocks0$` and `BenchmarkGraphForkJoinFloor/fork-rank0-pdl-early`, `-test.benchtime 10x`, us per all-reduce, GPU scope / system scope. Best: out of place. v2: the target's figure (H200, another day; its floor in brackets).\n\n")
	b.WriteString("| ranks | floor | size | oneshot | twoshot direct | push | twoshot in place | best GPU | best sys | v2 | best sys / v2 |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	within := 0
	total := 0
	for _, ws := range []int{2, 4, 8} {
		floor, _ := r.value(fmt.Sprintf("GraphForkJoinFloor/fork-rank0-pdl-early/ws%d", ws), "us/layer")
		for i, size := range pointSizes {
			cell := func(kernel string) (string, [2]float64) {
				best := [2]float64{math.Inf(1), math.Inf(1)}
				var parts []string
				for j, scope := range []string{"gpu", "sys"} {
					v, ok := r.value(fmt.Sprintf("AllReduceGrid/ws%d/%s/%s/%s/blocks0", ws, size, kernel, scope), "us/allreduce")
					if !ok {
						parts = append(parts, "")
						continue
					}
					parts = append(parts, v.String())
					best[j] = slices.Min(v)
				}
				if parts[0] == "" && parts[1] == "" {
					return "", best
				}
				return strings.Join(parts, " / "), best
			}
			var cells []string
			bestGPU, bestSys := math.Inf(1), math.Inf(1)
			for _, kernel := range []string{"oneshot", "twoshot-direct", "push", "twoshot-inplace"} {
				c, best := cell(kernel)
				cells = append(cells, c)
				if kernel != "twoshot-inplace" {
					bestGPU, bestSys = min(bestGPU, best[0]), min(bestSys, best[1])
				}
			}
			if math.IsInf(bestGPU, 1) && math.IsInf(bestSys, 1) {
				continue
			}
			target := v2[ws][i]
			ratio := ""
			if !math.IsInf(bestSys, 1) {
				total++
				ratio = fmt.Sprintf("%.2f", bestSys/target)
				if bestSys <= 0.9*target {
					within++
				}
			}
			fmt.Fprintf(b, "| %d | %v | %s | %s | %s | %s | %s | %s | %s | %.2f (%.2f) | %s |\n", ws, floor, size,
				cells[0], cells[1], cells[2], cells[3], num(bestGPU), num(bestSys), target, v2Floor[ws], ratio)
		}
	}
	fmt.Fprintf(b, "\nAt system scope, within 0.9 of the v2 figure at %d of %d points.\n", within, total)
}

// num writes a best time, or nothing where no kernel ran (+Inf).
func num(v float64) string {
	if math.IsInf(v, 1) {
		return ""
	}
	return fmt.Sprintf("%.2f", v)
}

var (
	tuneLine   = regexp.MustCompile(`^(## \d+ ranks|push blocks|graph:|eager, registered:|eager:|gain over the built-in)`)
	defaultLog = regexp.MustCompile(`^default_(eager|graph)_(on|off)_p(\d+)\.log$`)
	avgBusBW   = regexp.MustCompile(`# Avg bus bandwidth\s*:\s*([0-9.]+)`)
)

// renderTune summarises tune.log (the world sizes, their bands and gains) and the default
// runs' average bus bandwidth with the table and without; it reports whether there was any.
func renderTune(b *strings.Builder, files map[string]string) (bool, error) {
	found := false
	if path, ok := files["tune.log"]; ok {
		data, err := os.ReadFile(path)
		if err != nil {
			return false, err
		}
		found = true
		b.WriteString("\n### Tuning table\n\n`arsmoke --tune --worlds 2,4,8 --device 0 -o tune.json`:\n\n```\n")
		for line := range strings.SplitSeq(string(data), "\n") {
			if tuneLine.MatchString(line) {
				b.WriteString(line + "\n")
			}
		}
		b.WriteString("```\n")
	}
	// each mode and table's figures in the order of the passes (p1, p2, .., p10)
	type run struct {
		pass       int
		name       string
		mode, with string
	}
	var runs []run
	for name := range files {
		if sub := defaultLog.FindStringSubmatch(name); sub != nil {
			pass, _ := strconv.Atoi(sub[3])
			runs = append(runs, run{pass, name, sub[1], sub[2]})
			if _, table := files["tune.json"]; sub[2] == "on" && !table {
				// goccl ignores a table file that is not there: the run is the built-in
				// selection's, under the name of the table's.
				return false, fmt.Errorf("%s: a run with the tuning table, but no tune.json beside it: the table was not there", files[name])
			}
		}
	}
	slices.SortFunc(runs, func(a, b run) int { return a.pass - b.pass })
	bw := map[[2]string]span{}
	for _, r := range runs {
		data, err := os.ReadFile(files[r.name])
		if err != nil {
			return false, err
		}
		m := avgBusBW.FindSubmatch(data)
		if m == nil {
			return false, fmt.Errorf("%s: no average bus bandwidth: the run did not finish (see the file and %s.err)", files[r.name], r.name)
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		k := [2]string{r.mode, r.with}
		bw[k] = append(bw[k], v)
	}
	if len(bw) > 0 {
		found = true
		b.WriteString("\narsmoke's default run (`arsmoke --ranks 8 --device 0 [-g]`), average bus bandwidth, GB/s, each pass:\n\n")
		b.WriteString("| calls | with the table | GOCCL_TUNE=off |\n|---|---|---|\n")
		for _, mode := range []string{"eager", "graph"} {
			fmt.Fprintf(b, "| %s | %s | %s |\n", mode, passes(bw[[2]string{mode, "on"}]), passes(bw[[2]string{mode, "off"}]))
		}
	}
	return found, nil
}

// passes lists a figure's values in the order of the passes.
func passes(s span) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprintf("%.1f", v)
	}
	return strings.Join(parts, ", ")
}
