package main

// With --procs every process measures and checks its own rank only. This file combines the
// processes' results after each case, through a bootstrap of their own, so that what rank 0
// prints, and every rank's verdict and exit code, cover every rank of the run.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/goccl/goccl/collective/bootstrap"
)

// resultsSocket is the path of the bootstrap through which the processes of a --procs run
// combine their results: beside the communicators' sockets (socket), under a name of its own.
func (p *procInfo) resultsSocket() string { return p.Socket + ".results" }

// resultGroup connects the processes of a --procs run to exchange their results. Every
// process makes the same exchanges in the same order: one per case measured, and a last one
// once rank 0 has printed (end).
type resultGroup struct {
	boot bootstrap.Bootstrap
	// timeout bounds the wait for the other processes in an exchange (--timeout): after the
	// all-reduces of a case, which every rank takes part in, they arrive together.
	timeout time.Duration
	// inStep is set once every process has taken part in an exchange, and cleared when one
	// fails: only processes in step make the last exchange (end).
	inStep bool
}

// joinResults connects this process to the others of its --procs run. Like the
// communicators' bootstraps, it waits --timeout and 30 s more for all of them to start.
func joinResults(ctx context.Context, p *procInfo, timeout time.Duration) (*resultGroup, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	boot, err := bootstrap.NewUnix(ctx, p.resultsSocket(), p.Rank, p.World)
	if err != nil {
		return nil, fmt.Errorf("join the other processes to combine the results: %w", err)
	}
	return &resultGroup{boot: boot, timeout: timeout}, nil
}

// share is one process's message in an exchange.
type share struct {
	// What names the exchange (the case, or "end"), so that processes out of step fail
	// instead of combining different cases.
	What string `json:"what"`
	// Result is the process's result, unless it has none: then Err says why.
	Result json.RawMessage `json:"result,omitempty"`
	Err    string          `json:"err,omitempty"`
}

// exchange sends this process's result of what (mine, or runErr when it has none) to every
// process, waiting at most wait for them, and returns every process's result, in rank order.
// A process whose run failed still takes part, so that every process ends its sweep at the
// same case, with the same error: one that names every rank that failed and why.
func exchange[M any](ctx context.Context, g *resultGroup, wait time.Duration, what string, mine M, runErr error) ([]M, error) {
	out := share{What: what}
	var err error
	if runErr != nil {
		out.Err = runErr.Error()
	} else if out.Result, err = json.Marshal(mine); err != nil {
		return nil, fmt.Errorf("encode this rank's results: %w", err)
	}
	blob, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode this rank's results: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	g.inStep = false
	blobs, err := g.boot.AllGather(ctx, blob)
	if err != nil {
		if runErr != nil {
			return nil, runErr
		}
		return nil, fmt.Errorf("combine the results with the other ranks': %w", err)
	}
	all := make([]M, len(blobs))
	var failed []string
	for r, b := range blobs {
		var in share
		if err := json.Unmarshal(b, &in); err != nil {
			return nil, fmt.Errorf("rank %d's results: %w", r, err)
		}
		if in.What != what {
			return nil, fmt.Errorf("rank %d sent its results of %s with this rank at %s: the processes are out of step", r, in.What, what)
		}
		if in.Err != "" {
			failed = append(failed, fmt.Sprintf("rank %d: %s", r, in.Err))
			continue
		}
		if err := json.Unmarshal(in.Result, &all[r]); err != nil {
			return nil, fmt.Errorf("rank %d's results: %w", r, err)
		}
	}
	g.inStep = true
	if len(failed) > 0 {
		return nil, errors.New(strings.Join(failed, "; "))
	}
	return all, nil
}

// end is the last exchange of processes in step, made once rank 0 has printed its results
// (the parent stops the other processes as soon as one exits with a failure, which would cut
// rank 0 short). It returns the verdict line rank 0 printed, for the others not to repeat
// it; "" when they were not in step, which then makes no exchange. It closes the group.
//
// Rank 0 may have spent up to twice --timeout and 10 s more waiting for its GPU work to end
// when closing its engine (waitIdle): the wait here allows that and --timeout more.
func (g *resultGroup) end(ctx context.Context, verdict string) (string, error) {
	defer g.boot.Close()
	if !g.inStep {
		return "", nil
	}
	lines, err := exchange(ctx, g, 3*g.timeout+10*time.Second, "end", verdict, nil)
	if err != nil {
		return "", fmt.Errorf("wait for rank 0 to print the results: %w", err)
	}
	return lines[0], nil
}

// combinedTuner is the --tune runner of a --procs child: each case's time is the slowest
// rank's, and a rank that fails a case (wrong results, say) fails every rank there, so that
// rank 0 writes no table another rank's results contradict.
type combinedTuner struct {
	tuneRunner
	group *resultGroup
}

// Time measures tc on this process's rank and returns the slowest rank's time.
func (t *combinedTuner) Time(ctx context.Context, tc tuneCase) (time.Duration, error) {
	d, err := t.tuneRunner.Time(ctx, tc)
	all, err := exchange(ctx, t.group, t.group.timeout, fmt.Sprintf("tune %+v", tc), d, err)
	if err != nil {
		return 0, err
	}
	return slices.Max(all), nil
}

// combinedEngine is the engine of a --procs child: each case runs on this process's rank
// through the engine it wraps, then every process's result is combined into one, the same
// in every process: the wrong elements summed over the ranks, the first mismatch of the
// lowest rank, and the slowest rank's time. The path is rank 0's (every rank runs the same).
type combinedEngine struct {
	engine
	group *resultGroup
}

// Run measures c on this process's rank and combines the result with the others'.
func (e *combinedEngine) Run(ctx context.Context, c Case) (Measurement, error) {
	m, err := e.engine.Run(ctx, c)
	all, err := exchange(ctx, e.group, e.group.timeout, fmt.Sprintf("%+v", c), m, err)
	if err != nil {
		return Measurement{}, err
	}
	m = all[0]
	for _, o := range all[1:] {
		m.Time = max(m.Time, o.Time)
		m.Wrong += o.Wrong
		if m.First == nil {
			m.First = o.First
		}
	}
	return m, nil
}

// RunFused measures c on this process's rank and combines the result with the others', as
// Run does; the fused call's and the pair's times are each the slowest rank's.
func (e *combinedEngine) RunFused(ctx context.Context, c FusedCase) (FusedMeasurement, error) {
	fe, ok := e.engine.(fusedEngine)
	if !ok {
		return FusedMeasurement{}, errors.New("this engine cannot run the fused call")
	}
	m, err := fe.RunFused(ctx, c)
	all, err := exchange(ctx, e.group, e.group.timeout, fmt.Sprintf("fused %+v", c), m, err)
	if err != nil {
		return FusedMeasurement{}, err
	}
	m = all[0]
	for _, o := range all[1:] {
		m.Fused, m.Unfused, m.AllReduce = max(m.Fused, o.Fused), max(m.Unfused, o.Unfused), max(m.AllReduce, o.AllReduce)
		m.FusedWrong += o.FusedWrong
		m.UnfusedWrong += o.UnfusedWrong
		if m.First == nil {
			m.First = o.First
		}
	}
	return m, nil
}
