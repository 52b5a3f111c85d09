package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/goccl/goccl/collective"
)

// Exit codes.
const (
	exitPass  = 0 // everything ran and was correct
	exitFail  = 1 // no driver or GPU, wrong results, a timeout, ...
	exitUsage = 2 // bad flags
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// raisedConnections is set when raiseConnections set the variable (the user had not).
var raisedConnections bool

// raiseConnections gives the process 32 hardware queues per GPU instead of CUDA's default 8,
// unless the user chose a number: arsmoke's virtual ranks need their streams on separate
// queues (see collective.NewGroup), and the driver reads the variable when CUDA starts, so
// run calls it before any CUDA call. Only a process that drives every rank raises it: a
// --procs parent or child runs at most one rank, and under MPS every process's queues come
// from one pool, which 32 per process exhausts (CUDA_ERROR_OUT_OF_MEMORY or
// CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED with 4 processes on an H200).
func raiseConnections() {
	if _, set := os.LookupEnv(collective.MaxConnectionsEnv); !set {
		os.Setenv(collective.MaxConnectionsEnv, "32")
		raisedConnections = true
	}
}

// childEnv is the environment of a --procs child: this process's, without the queue count
// that raiseConnections added (see there).
func childEnv() []string {
	env := os.Environ()
	if !raisedConnections {
		return env
	}
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, collective.MaxConnectionsEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// run is the whole command: it parses args, runs, prints the results on
// stdout and the diagnostics on stderr, and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	c, err := parseArgs(args)
	if errors.Is(err, flag.ErrHelp) {
		printUsage(stdout)
		return exitPass
	}
	if err != nil {
		fmt.Fprintf(stderr, "arsmoke: %v\nRun 'arsmoke -h' for the flags.\n", err)
		return exitUsage
	}
	proc, err := childFromEnv(c)
	if err != nil {
		fmt.Fprintf(stderr, "arsmoke: %v\n", err)
		return exitUsage
	}
	if c.procs == 0 {
		raiseConnections()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if proc != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		watchParent(ctx, cancel, os.Getppid, proc.Parent, time.Second)
	}
	switch {
	case c.topo:
		if err := showTopo(ctx, stdout); err != nil {
			fmt.Fprintf(stderr, "arsmoke: --topo: %v\n", err)
			return exitFail
		}
		return exitPass
	case c.procs != 0 && proc == nil:
		return runParent(ctx, c, args, stdout, stderr)
	case c.tune != nil:
		return runTune(ctx, c, proc, stdout, stderr)
	}
	return runRanks(ctx, c, proc, stdout, stderr)
}

// runRanks runs the sweep on the ranks this process drives: all of them, or
// proc's one in a --procs child, where the processes combine their results
// after each case (resultGroup) and only rank 0 prints them.
func runRanks(ctx context.Context, c config, proc *procInfo, stdout, stderr io.Writer) int {
	r := newReport(c)
	devices, err := findDevices(c)
	if err == nil {
		err = checkBackend(c, devices)
	}
	var usage *usageError
	if errors.As(err, &usage) {
		fmt.Fprintf(stderr, "arsmoke: %v\n", err)
		return exitUsage
	}
	var group *resultGroup
	if err == nil && proc != nil {
		group, err = joinResults(ctx, proc, c.timeout)
	}
	if err == nil {
		err = measure(ctx, c, devices, proc, group, r, newProgress(stderr, c))
	}
	r.finish(err)
	code := exitFail
	if r.Verdict.Pass {
		code = exitPass
	}
	if proc == nil || proc.Rank == 0 {
		code = printReport(c, r, code, stdout, stderr)
	}
	shown := "" // the verdict line rank 0 printed, where this process knows it
	agreed := false
	if group != nil {
		inStep := group.inStep
		if shown, err = group.end(ctx, r.Verdict.Line); err != nil {
			fmt.Fprintf(stderr, "arsmoke: %v\n", err)
			code = exitFail
		}
		agreed = inStep && err == nil
	}
	if proc != nil && proc.Rank != 0 && !r.Verdict.Pass && r.Verdict.Line != shown {
		// What rank 0 printed does not say it: this rank failed on its own.
		fmt.Fprintln(stderr, r.Verdict.Line)
		agreed = false
	}
	if code == exitFail && !r.Verdict.Pass && agreed {
		// The run's verdict, which every rank's results went into and rank 0 printed: the
		// parent must not take this rank for the one that failed.
		return exitAgreedFail
	}
	return code
}

// printReport prints the report of a run that ended with code: the table or JSON on stdout,
// and the verdict on stderr where stdout does not show it. It returns code, or exitFail if
// the results could not be written.
func printReport(c config, r *report, code int, stdout, stderr io.Writer) int {
	var err error
	switch {
	case c.json:
		err = renderJSON(stdout, r)
		if code != exitPass {
			fmt.Fprintln(stderr, r.Verdict.Line)
		}
	case r.described:
		err = renderText(stdout, r)
	default:
		// Nothing ran: no table, only why.
		fmt.Fprintln(stderr, r.Verdict.Line)
	}
	if err != nil {
		fmt.Fprintf(stderr, "arsmoke: write the results: %v\n", err)
		return exitFail
	}
	return code
}

// measure builds the engine for the ranks placed on devices and sweeps,
// filling r. In a --procs child, group combines each case's results with the
// other processes'.
func measure(ctx context.Context, c config, devices []int, proc *procInfo, group *resultGroup, r *report, prog *progress) error {
	r.Ranks = len(devices)
	cfg := planEngine(c, devices, c.backend == backendGoccl && ncclLoads())
	if c.fused != nil {
		planFused(&cfg)
	}
	if g := cfg.Goccl; g != nil && g.MaxBytes < cfg.MaxBytes {
		r.KernelMaxBytes = g.MaxBytes
	}
	if proc != nil {
		cfg.Devices, cfg.Proc = devices[proc.Rank:proc.Rank+1], proc
	}
	mode := describeMode(devices, c.procs)
	if c.procs != 0 && hostIDEnv(c, devices) {
		mode += "; NCCL sees each process as a host of its own (NCCL_HOSTID) and connects them over sockets"
	}
	eng, err := newEngine(ctx, cfg)
	var header Header
	if err == nil {
		header = eng.Describe()
	}
	if group != nil {
		// Every process learns whether all of them have their engine, so that a set-up
		// failure ends every process's run with the same reason, rank 0's report included,
		// and every rank's device, so that rank 0's header lists them all. The wait is that
		// of the communicators' set-up (communicators).
		var devs [][]RankDevice
		var all error
		devs, all = exchange(ctx, group, c.timeout+30*time.Second, "set up", header.Devices, err)
		if all != nil && err == nil {
			// Another process has none: this one's is of no use.
			if cerr := eng.Close(); cerr != nil {
				all = fmt.Errorf("%w (and closing this rank's engine: %v)", all, cerr)
			}
		}
		err = all
		header.Devices = slices.Concat(devs...)
	}
	if err != nil {
		return fmt.Errorf("set up %s: %w", describeMode(devices, c.procs), err)
	}
	r.describe(header, len(devices), mode)
	run := eng
	if group != nil {
		run = &combinedEngine{engine: eng, group: group}
	}
	if c.fused != nil {
		err = sweepFused(ctx, run, c, r, prog)
	} else {
		err = sweep(ctx, run, c, len(devices), r, prog)
	}
	if cerr := eng.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close the engine: %w", cerr)
	}
	return err
}
