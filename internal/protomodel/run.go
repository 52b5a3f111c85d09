package protomodel

import (
	"context"
	"errors"
	"fmt"
	"github.com/goccl/goccl/ptx"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Limits of the signal region's shape (docs/kernel-abi.md).
// The model's limits and layout are the kernels' own (ptx/abi.go).
const (
	// MaxRanks is the largest world size the signal region has lanes for.
	MaxRanks = ptx.MaxRanks
	// MaxBlocks is the largest grid the signal region has counters for.
	MaxBlocks = ptx.MaxBlocks
)

// signalWords is the size of one rank's 16 KiB signal region in u32 words.
const signalWords = ptx.SignalBytes / 4

// signal is one rank's signal region; every access is an atomic load or store
// of one u32 word, as every PTX access to it is a single 32-bit ld or st.
type signal [signalWords]atomic.Uint32

// Word indices of the signal region: the byte offsets of docs/kernel-abi.md
// divided by 4.
func selfCounterWord(b, t int) int { return ptx.SelfCounterOffset/4 + MaxRanks*b + t }
func peerCounterWord(ph, b, p int) int {
	return ptx.PeerCounterOffset/4 + MaxBlocks*MaxRanks*ph + MaxRanks*b + p
}
func pushEpochWord(b int) int { return ptx.PushEpochOffset/4 + b }

// pushPendingWord is push_pending[b][i]: i = 0 the element count, 1 the block size.
func pushPendingWord(b, i int) int { return ptx.PushPendingOffset/4 + 2*b + i }

// callWord is word i (0..3) of call, the call block 0 published with its entry barrier.
func callWord(i int) int { return ptx.CallOffset/4 + i }

// newSignals returns one zeroed signal region per rank, as created.
func newSignals(ranks int) []*signal {
	s := make([]*signal, ranks)
	for r := range s {
		s[r] = new(signal)
	}
	return s
}

// Errors a model run reports; test them with errors.Is.
var (
	// ErrDeadlock: nothing progressed for the stall time; the error is a
	// *DeadlockError that lists what every spin loop was waiting for.
	ErrDeadlock = errors.New("deadlock")
	// ErrEarlyPass: a block passed barrier k before every rank had arrived at k.
	ErrEarlyPass = errors.New("barrier passed before every rank arrived")
	// ErrWrongSum: a push receiver summed data that was not the round's input.
	ErrWrongSum = errors.New("wrong sum")
	// ErrStaleRead: a one-shot block read a peer's input that the peer's next
	// call had already overwritten (or that its current call had not written).
	ErrStaleRead = errors.New("read another call's input")
	// ErrFalseMismatch: a call check reported a peer whose call was the same.
	ErrFalseMismatch = errors.New("call check reported a mismatch of equal calls")
	// ErrMissedMismatch: ranks made different calls and a call check did not say so.
	ErrMissedMismatch = errors.New("call check missed a mismatch")
)

// Wait is a spin loop that was still waiting when a deadlock stopped a run.
type Wait struct {
	// Rank and Block are the waiting block; Peer is the rank it waits for.
	Rank, Block, Peer int
	// Slot names the polled word in the terms of docs/kernel-abi.md.
	Slot string
	// Want is the value the loop waits for: a barrier's round number, or 0
	// for a push receive, which waits for anything but 0.
	Want uint32
	// Holds is what the slot held when the run stopped.
	Holds uint32
}

// String describes the wait in one line.
func (w Wait) String() string {
	want := fmt.Sprintf("%#x", w.Want)
	if w.Want == 0 {
		want = "non-zero"
	}
	return fmt.Sprintf("rank %d block %d waits for rank %d: %s holds %#x, wants %s", w.Rank, w.Block, w.Peer, w.Slot, w.Holds, want)
}

// DeadlockError is a run stopped by the progress watchdog.
type DeadlockError struct {
	// Stall is how long nothing progressed.
	Stall time.Duration
	// Waits lists the spin loops that were waiting, sorted by rank and block.
	Waits []Wait
}

// Error names the first few waits.
func (e *DeadlockError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "protomodel: deadlock: no progress for %v", e.Stall)
	for i, w := range e.Waits {
		if i == 3 {
			fmt.Fprintf(&b, " (%d more)", len(e.Waits)-i)
			break
		}
		b.WriteString("; " + w.String())
	}
	return b.String()
}

// Is makes errors.Is(err, ErrDeadlock) true.
func (e *DeadlockError) Is(target error) bool { return target == ErrDeadlock }

// Stats says what a run exercised, so that a test can insist the dangerous
// interleavings really happened rather than trusting the scheduler.
type Stats struct {
	// Rounds is the number of rounds (barriers, or calls) completed, summed
	// over ranks and blocks.
	Rounds int
	// Ahead counts the times a block began round k+1 while the same block of
	// a peer was still in round k: the overtaking that two phase slots, two
	// push receive parts and the exit barrier exist for.
	Ahead int
	// Unpublished counts the call checks that found a peer's call of this round
	// not yet (or only partly) visible and loaded it again.
	Unpublished int
	// Released counts the one-shot staging copies still pending when a lane's fence landed
	// them: copies that the peers, without the fence, could have read too early.
	Released int
}

// DefaultStall is the progress watchdog's limit when a config leaves it 0:
// far longer than any injected delay, so only a real deadlock trips it.
const DefaultStall = time.Second

// run is the state shared by the goroutines of one model run: the first
// failure, a stop flag every spin loop polls, and the progress watchdog.
type run struct {
	stall    time.Duration
	progress atomic.Uint64
	stop     atomic.Bool
	ahead    atomic.Int64
	rounds   atomic.Int64
	unpub    atomic.Int64
	released atomic.Int64

	mu         sync.Mutex
	err        error
	deadlocked bool
	waits      []Wait
}

// fail records err unless a failure is already recorded, and stops the run.
func (r *run) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	r.stop.Store(true)
}

// stopped reports whether the goroutines must give up.
func (r *run) stopped() bool { return r.stop.Load() }

// blocked records a spin loop that gave up because the run stopped; it only
// matters when the watchdog stopped it.
func (r *run) blocked(w Wait) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.deadlocked {
		r.waits = append(r.waits, w)
	}
}

// watch starts the watchdog: it stops the run when ctx ends or when progress
// stands still for the stall time. The returned func ends the watchdog.
func (r *run) watch(ctx context.Context) (end func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(r.stall / 20)
		defer tick.Stop()
		last, since := r.progress.Load(), time.Now()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				r.fail(fmt.Errorf("protomodel: run stopped: %w", ctx.Err()))
				return
			case now := <-tick.C:
				if p := r.progress.Load(); p != last {
					last, since = p, now
					continue
				}
				if now.Sub(since) < r.stall {
					continue
				}
				r.mu.Lock()
				r.deadlocked = r.err == nil
				r.mu.Unlock()
				r.stop.Store(true)
				return
			}
		}
	}()
	return func() { close(done); <-exited }
}

// result is the outcome once every goroutine of the run has returned.
func (r *run) result() (Stats, error) {
	st := Stats{Rounds: int(r.rounds.Load()), Ahead: int(r.ahead.Load()), Unpublished: int(r.unpub.Load()), Released: int(r.released.Load())}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.deadlocked {
		waits := slices.Clone(r.waits)
		slices.SortFunc(waits, func(a, b Wait) int {
			if a.Rank != b.Rank {
				return a.Rank - b.Rank
			}
			return a.Block - b.Block
		})
		return st, &DeadlockError{Stall: r.stall, Waits: waits}
	}
	return st, r.err
}

// newRun returns the shared state of a run with the given stall limit.
func newRun(stall time.Duration) *run {
	if stall <= 0 {
		stall = DefaultStall
	}
	return &run{stall: stall}
}

// jitter perturbs the schedule of one modelled block: mostly nothing, often a
// yield, sometimes a short sleep and now and then a stall long enough for
// peers to run a whole round ahead. Each block has its own generator, so a
// block's choices depend only on the seed; the interleaving of blocks is up to
// the Go scheduler.
type jitter struct {
	rng   *rand.Rand
	polls int // failed polls since the block last made progress
	// drain, when set, lets stores the block issued earlier reach memory (see publisher)
	drain func()
}

func newJitter(seed uint64, rank, block int) *jitter {
	return &jitter{rng: rand.New(rand.NewPCG(seed, uint64(rank)<<8|uint64(block)))}
}

// idle is called after a poll that found nothing. It yields at first, then
// sleeps for longer and longer, up to 1 ms: busy spinning goroutines would
// otherwise starve the ones they wait for when the test shares the CPUs.
func (j *jitter) idle() {
	if j.drain != nil {
		j.drain()
	}
	j.polls++
	if j.polls < 16 {
		runtime.Gosched()
		return
	}
	time.Sleep(time.Duration(min(j.polls-15, 100)) * 10 * time.Microsecond)
}

// pause is called after every modelled memory operation that made progress.
func (j *jitter) pause() {
	if j.drain != nil {
		j.drain()
	}
	j.polls = 0
	switch x := j.rng.IntN(1000); {
	case x < 600:
	case x < 950:
		runtime.Gosched()
	case x < 997:
		time.Sleep(time.Duration(j.rng.IntN(50)) * time.Microsecond)
	default:
		time.Sleep(time.Duration(200+j.rng.IntN(1800)) * time.Microsecond)
	}
}

// checkShape validates the dimensions every model shares.
func checkShape(ranks, blocks, rounds int) error {
	switch {
	case ranks < 1 || ranks > MaxRanks:
		return fmt.Errorf("protomodel: %d ranks: the signal region has lanes for 1 to %d", ranks, MaxRanks)
	case blocks < 1 || blocks > MaxBlocks:
		return fmt.Errorf("protomodel: %d blocks: the signal region has counters for 1 to %d", blocks, MaxBlocks)
	case rounds < 0:
		return fmt.Errorf("protomodel: %d rounds: must not be negative", rounds)
	}
	return nil
}

// threadElems returns the elements thread t of block b visits in the
// kernels' grid-stride loop: idx = b*ntid + t, then idx += nctaid*ntid.
func threadElems(b, t, blocks, threads, n int) []int {
	var elems []int
	for i := b*threads + t; i < n; i += blocks * threads {
		elems = append(elems, i)
	}
	return elems
}
