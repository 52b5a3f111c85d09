package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// renderText prints r in all_reduce_perf's layout: header lines, one table
// per algorithm with its footer, then the verdict.
func renderText(w io.Writer, r *report) error {
	bw := bufio.NewWriter(w)
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
	fmt.Fprintf(bw, "# goccl %s, CUDA driver %s, host %s\n", r.Goccl, r.Driver, r.Host)
	fmt.Fprintf(bw, "# %s\n#\n# Using devices\n", r.Mode)
	for _, d := range r.Devices {
		fmt.Fprintf(bw, "#  Rank %2d Pid %7d device %2d [%s] %s\n", d.Rank, d.Pid, d.Device, d.BusID, d.Name)
	}
	fmt.Fprintln(bw, "#")
	for _, b := range r.Blocks {
		renderBlock(bw, r, b)
	}
	fmt.Fprintln(bw, r.Verdict.Line)
	return bw.Flush()
}

// The columns of a table: the row's description, then out of place and in
// place.
const (
	leftFormat   = "%12s %13s %7s %6s %6s"
	resultFormat = "  %9s %8s %8s %7s"
)

func renderBlock(w io.Writer, r *report, b block) {
	// The header lines are rows of text whose first blank becomes the '#'
	// of a comment, so that they line up with the numbers.
	comment := func(s string) { fmt.Fprintf(w, "#%s\n", strings.TrimRight(s[1:], " ")) }
	fmt.Fprintf(w, "# Algorithm: %s\n", b.Algo)
	left := fmt.Sprintf(leftFormat, "", "", "", "", "")
	width := len(fmt.Sprintf(resultFormat, "", "", "", ""))
	comment(left + centre("out-of-place", width) + centre("in-place", width))
	comment(fmt.Sprintf(leftFormat+resultFormat+resultFormat,
		"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"))
	comment(fmt.Sprintf(leftFormat+resultFormat+resultFormat,
		"(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""))
	for _, row := range b.Rows {
		fmt.Fprintf(w, leftFormat, fmt.Sprint(row.Bytes), fmt.Sprint(row.Count), row.Type, row.RedOp, fmt.Sprint(row.Root))
		for _, res := range []result{row.OutOfPlace, row.InPlace} {
			wrong := "N/A"
			if r.Check {
				wrong = fmt.Sprint(res.Wrong)
			}
			fmt.Fprintf(w, resultFormat, fmt.Sprintf("%.2f", res.TimeUS), fmt.Sprintf("%.2f", res.AlgBW), fmt.Sprintf("%.2f", res.BusBW), wrong)
		}
		fmt.Fprintln(w)
	}
	switch {
	case !r.Check:
		fmt.Fprintln(w, "# Out of bounds values : N/A (not checked, -c 0)")
	case b.Wrong == 0:
		fmt.Fprintln(w, "# Out of bounds values : 0 OK")
	default:
		fmt.Fprintf(w, "# Out of bounds values : %d FAILED\n", b.Wrong)
	}
	fmt.Fprintf(w, "# Avg bus bandwidth    : %.4f\n#\n", b.AvgBusBW)
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
