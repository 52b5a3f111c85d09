package protomodel

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// OneShotConfig is one run of the one-shot exit-barrier model.
type OneShotConfig struct {
	// Ranks (1..MaxRanks), Blocks (1..MaxBlocks) per rank, Threads per block,
	// Elems input elements per rank and Rounds calls.
	Ranks, Blocks, Threads, Elems, Rounds int
	// ExitBarrier keeps the kernel's exit barrier; without it the model must
	// catch a stale read.
	ExitBarrier bool
	// Seed drives each block's random delays and read order.
	Seed uint64
	// Stall is the progress watchdog's limit; 0 means DefaultStall.
	Stall time.Duration
}

// oneShotModel is the memory of a one-shot run.
type oneShotModel struct {
	cfg  OneShotConfig
	run  *run
	bar  *barrier
	in   [][]atomic.Uint32 // in[r]: rank r's input buffer; call k writes k+1
	read [][]atomic.Int64  // read[r][b]: calls whose reads block b of rank r finished
}

// OneShot runs the one-shot exit-barrier model. Every rank runs Rounds calls
// in stream order: a copy that writes the call's data into the rank's input
// buffer (the eager path's copy into the registered staging buffer, which no
// barrier guards), then a kernel of Blocks goroutines: entry barrier, a
// grid-stride loop reading every rank's input, and the exit barrier when
// ExitBarrier is set. Input elements of call k hold k+1, so every read checks
// that it saw this call's data. It returns ErrStaleRead, a *DeadlockError, or
// the context's error, with what the run exercised; Stats.Ahead counts copies
// that began while a peer block was still reading the previous call.
func OneShot(ctx context.Context, cfg OneShotConfig) (Stats, error) {
	if err := checkShape(cfg.Ranks, cfg.Blocks, cfg.Rounds); err != nil {
		return Stats{}, err
	}
	if cfg.Threads < 1 || cfg.Elems < 0 {
		return Stats{}, fmt.Errorf("protomodel: %d threads, %d elements: want at least 1 thread and no negative count", cfg.Threads, cfg.Elems)
	}
	r := newRun(cfg.Stall)
	m := &oneShotModel{cfg: cfg, run: r, bar: &barrier{sig: newSignals(cfg.Ranks), variant: TwoPhase, run: r}}
	m.in = make([][]atomic.Uint32, cfg.Ranks)
	m.read = make([][]atomic.Int64, cfg.Ranks)
	for p := range cfg.Ranks {
		m.in[p] = make([]atomic.Uint32, cfg.Elems)
		m.read[p] = make([]atomic.Int64, cfg.Blocks)
	}

	end := r.watch(ctx)
	var ranks sync.WaitGroup
	for rank := range cfg.Ranks {
		ranks.Go(func() {
			jitters := make([]*jitter, cfg.Blocks)
			for b := range jitters {
				jitters[b] = newJitter(cfg.Seed, rank, b)
			}
			copier := newJitter(cfg.Seed, rank, MaxBlocks)
			for k := range cfg.Rounds {
				if m.peerStillReading(k) {
					r.ahead.Add(1)
				}
				// The copy runs once the rank's previous kernel has exited and
				// lands element by element, in any order.
				for _, i := range copier.rng.Perm(cfg.Elems) {
					m.in[rank][i].Store(uint32(k + 1))
					copier.pause()
				}
				var blocks sync.WaitGroup
				var reads atomic.Int64
				for b := range cfg.Blocks {
					blocks.Go(func() { reads.Add(int64(m.block(rank, b, k, jitters[b]))) })
				}
				blocks.Wait()
				if r.stopped() {
					return
				}
				if n, want := reads.Load(), int64(cfg.Elems*cfg.Ranks); n != want {
					r.fail(fmt.Errorf("protomodel: one-shot: rank %d call %d made %d of %d reads: the grid-stride loop misses some", rank, k, n, want))
					return
				}
			}
		})
	}
	ranks.Wait()
	end()
	return r.result()
}

// peerStillReading reports whether some block of some rank has not finished
// reading call k-1.
func (m *oneShotModel) peerStillReading(k int) bool {
	for _, blocks := range m.read {
		for b := range blocks {
			if blocks[b].Load() < int64(k) {
				return true
			}
		}
	}
	return false
}

// block runs block b of rank for call k and returns the number of reads it
// made: entry barrier, every rank's input at the block's elements, exit
// barrier.
func (m *oneShotModel) block(rank, b, k int, j *jitter) (reads int) {
	cfg := m.cfg
	if _, ok := m.bar.wait(rank, b, j); !ok {
		return reads
	}
	// The block's threads read in any order.
	var elems []int
	for t := range cfg.Threads {
		elems = append(elems, threadElems(b, t, cfg.Blocks, cfg.Threads, cfg.Elems)...)
	}
	j.rng.Shuffle(len(elems), func(x, y int) { elems[x], elems[y] = elems[y], elems[x] })
	for _, i := range elems {
		for p := range cfg.Ranks {
			if v := m.in[p][i].Load(); v != uint32(k+1) {
				m.run.fail(fmt.Errorf("protomodel: %w: rank %d block %d in call %d read rank %d's element %d and found call %d's data",
					ErrStaleRead, rank, b, k, p, i, int(v)-1))
				return reads
			}
			reads++
			j.pause()
		}
		m.run.progress.Add(1)
	}
	m.read[rank][b].Add(1)
	if cfg.ExitBarrier {
		if _, ok := m.bar.wait(rank, b, j); !ok {
			return reads
		}
	}
	m.run.rounds.Add(1)
	m.run.progress.Add(1)
	return reads
}
