package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/goccl/goccl/dtype"
)

// renderText prints r in all_reduce_perf's layout: header lines, one table
// per algorithm with its footer, then the verdict.
func renderText(w io.Writer, r *report) error {
	bw := bufio.NewWriter(w)
	if r.Fused != nil {
		renderFused(bw, r)
		return bw.Flush()
	}
	check := "on"
	if !r.Check {
		check = "off"
	}
	launch := "eager"
	if r.Graph {
		launch = "CUDA graph"
	}
	fmt.Fprintf(bw, "# arsmoke: all-reduce (sum) of %s, %v to %v bytes, factor %d, %d warm-up + %d timed iterations, %s, check %s\n",
		r.DType, byteSize(r.MinBytes), byteSize(r.MaxBytes), r.Factor, r.Warmup, r.Iters, launch, check)
	renderHost(bw, r)
	fmt.Fprintf(bw, "# backend %s: %s\n", r.Backend, describeBackend(r))
	if r.Check && r.Backend != backendGoccl {
		dt, _ := dtype.Parse(r.DType)
		goccl := "goccl's results bitwise; "
		if r.Backend == backendNCCL {
			goccl = ""
		}
		fmt.Fprintf(bw, "# check: %sNCCL's within %s x sum|x| of the exact sum per element (it adds in its own order, rounding in %s at each step); NaN or an infinity only where that order can overflow\n",
			goccl, ncclTolerance(dt, r.Ranks), r.DType)
	}
	renderDevices(bw, r)
	for _, b := range r.Blocks {
		if b.Backend == backendBoth {
			renderBoth(bw, r, b)
		} else {
			renderBlock(bw, r, b)
		}
	}
	fmt.Fprintln(bw, r.Verdict.Line)
	return bw.Flush()
}

// renderHost prints the header lines that say what ran where: goccl, the driver, NCCL, the
// host, and how the ranks are placed.
func renderHost(w io.Writer, r *report) {
	nccl := ""
	if r.NCCL != "" {
		nccl = ", NCCL " + r.NCCL
	}
	fmt.Fprintf(w, "# goccl %s, CUDA driver %s%s, host %s\n", r.Goccl, r.Driver, nccl, r.Host)
	fmt.Fprintf(w, "# %s\n", r.Mode)
}

// renderDevices prints each rank's process and GPU.
func renderDevices(w io.Writer, r *report) {
	fmt.Fprintln(w, "#\n# Using devices")
	for _, d := range r.Devices {
		fmt.Fprintf(w, "#  Rank %2d Pid %7d device %2d [%s] %s\n", d.Rank, d.Pid, d.Device, d.BusID, d.Name)
	}
	fmt.Fprintln(w, "#")
}

// describeBackend says in a few words what the run's backend measures.
func describeBackend(r *report) string {
	switch {
	case r.Backend == backendNCCL:
		return "every call through NCCL"
	case r.Backend == backendBoth:
		return "goccl's kernels at every size beside NCCL; speedup = NCCL's time / goccl's"
	case r.KernelMaxBytes > 0:
		return fmt.Sprintf("goccl's kernels up to %v, NCCL past that where the communicator has it; the path column says what served each size",
			byteSize(r.KernelMaxBytes))
	}
	return "goccl's kernels; the path column says what served each size"
}

// The columns of a table: the row's description, then out of place and in
// place.
const (
	leftFormat   = "%12s %13s %7s %6s %6s %8s"
	resultFormat = "  %9s %8s %8s %7s"
	// With --backend both: goccl's and NCCL's times, the speedup, and both's wrong elements.
	bothFormat = "  %9s %9s %8s %7s"
)

// comment prints a header row of a table: its first blank becomes the '#' of a comment, so
// that it lines up with the numbers.
func comment(w io.Writer, s string) { fmt.Fprintf(w, "#%s\n", strings.TrimRight(s[1:], " ")) }

// pathOf names what served a row: one path, or out-of-place's and in-place's when they differ.
func pathOf(row row) string {
	if row.OutOfPlace.Path == row.InPlace.Path {
		return row.OutOfPlace.Path
	}
	return row.OutOfPlace.Path + "/" + row.InPlace.Path
}

func renderBlock(w io.Writer, r *report, b block) {
	fmt.Fprintf(w, "# Algorithm: %s\n", b.Algo)
	left := fmt.Sprintf(leftFormat, "", "", "", "", "", "")
	width := len(fmt.Sprintf(resultFormat, "", "", "", ""))
	comment(w, left+centre("out-of-place", width)+centre("in-place", width))
	comment(w, fmt.Sprintf(leftFormat+resultFormat+resultFormat,
		"size", "count", "type", "redop", "root", "path", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"))
	comment(w, fmt.Sprintf(leftFormat+resultFormat+resultFormat,
		"(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""))
	for _, row := range b.Rows {
		fmt.Fprintf(w, leftFormat, fmt.Sprint(row.Bytes), fmt.Sprint(row.Count), row.Type, row.RedOp, fmt.Sprint(row.Root), pathOf(row))
		for _, res := range []result{row.OutOfPlace, row.InPlace} {
			fmt.Fprintf(w, resultFormat, fmt.Sprintf("%.2f", res.TimeUS), fmt.Sprintf("%.2f", res.AlgBW), fmt.Sprintf("%.2f", res.BusBW), wrongCell(r, res.Wrong))
		}
		fmt.Fprintln(w)
	}
	renderWrong(w, r, b.Wrong)
	fmt.Fprintf(w, "# Avg bus bandwidth    : %.4f\n#\n", b.AvgBusBW)
}

// renderBoth prints a block of --backend both: goccl's algorithm beside NCCL, size by size.
func renderBoth(w io.Writer, r *report, b block) {
	fmt.Fprintf(w, "# Algorithm: %s (goccl) vs nccl\n", b.Algo)
	left := fmt.Sprintf(leftFormat, "", "", "", "", "", "")
	width := len(fmt.Sprintf(bothFormat, "", "", "", ""))
	comment(w, left+centre("out-of-place", width)+centre("in-place", width))
	comment(w, fmt.Sprintf(leftFormat+bothFormat+bothFormat,
		"size", "count", "type", "redop", "root", "path", "goccl", "nccl", "speedup", "#wrong", "goccl", "nccl", "speedup", "#wrong"))
	comment(w, fmt.Sprintf(leftFormat+bothFormat+bothFormat,
		"(B)", "(elements)", "", "", "", "(goccl)", "(us)", "(us)", "(x)", "", "(us)", "(us)", "(x)", ""))
	for _, row := range b.Rows {
		fmt.Fprintf(w, leftFormat, fmt.Sprint(row.Bytes), fmt.Sprint(row.Count), row.Type, row.RedOp, fmt.Sprint(row.Root), pathOf(row))
		for _, res := range []result{row.OutOfPlace, row.InPlace} {
			var nccl result
			if res.NCCL != nil {
				nccl = *res.NCCL
			}
			fmt.Fprintf(w, bothFormat, fmt.Sprintf("%.2f", res.TimeUS), fmt.Sprintf("%.2f", nccl.TimeUS),
				fmt.Sprintf("%.2f", res.Speedup), wrongCell(r, res.Wrong+nccl.Wrong))
		}
		fmt.Fprintln(w)
	}
	renderWrong(w, r, b.Wrong)
	fmt.Fprintf(w, "# Avg bus bandwidth    : %.4f goccl, %.4f nccl\n", b.AvgBusBW, b.NCCLAvgBusBW)
	fmt.Fprintf(w, "# Avg speedup          : %.2fx (geometric mean of NCCL's time / goccl's)\n#\n", b.AvgSpeedup)
}

func wrongCell(r *report, wrong int64) string {
	if !r.Check {
		return "N/A"
	}
	return fmt.Sprint(wrong)
}

// renderWrong prints a block's footer line of wrong elements (wrong in all).
func renderWrong(w io.Writer, r *report, wrong int64) {
	switch {
	case !r.Check:
		fmt.Fprintln(w, "# Out of bounds values : N/A (not checked, -c 0)")
	case wrong == 0:
		fmt.Fprintln(w, "# Out of bounds values : 0 OK")
	default:
		fmt.Fprintf(w, "# Out of bounds values : %d FAILED\n", wrong)
	}
}

// centre pads s with spaces on both sides to width.
func centre(s string, width int) string {
	pad := max(width-len(s), 0)
	return strings.Repeat(" ", pad-pad/2) + s + strings.Repeat(" ", pad/2)
}

// renderJSON prints r as one indented JSON document.
func renderJSON(w io.Writer, r *report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(r)
}
