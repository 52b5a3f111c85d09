package protomodel

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/ptx"
)

// BarrierVariant selects the barrier a model runs.
type BarrierVariant int

const (
	// TwoPhase is the round-number barrier (ptx.ScopeSystem): peer_counter slots alternate by the
	// parity of the round number, and a lane spins until its slot equals it.
	TwoPhase BarrierVariant = iota
	// OnePhase is deliberately broken: a single peer_counter slot per edge. A
	// rank that passes barrier k and reaches k+1 overwrites the value a slow
	// peer has not read yet, and that peer spins forever.
	OnePhase
	// GreaterOrEqual is deliberately broken: two phases, but a lane spins
	// until slot >= round. Once the u32 round number wraps, the stale value
	// of two rounds ago is larger, so lanes pass without waiting.
	GreaterOrEqual
	// Counting is the kernels' barrier when every rank is on one GPU
	// (ptx.ScopeGPU), and at system scope where the GPUs have native atomics on
	// each other's memory (ptx.ScopeSystemCounted): a lane first adds 1 to rank t's peer_counter slot for
	// this rank (red.add, one slot), then spins until its own slot for rank t
	// is no longer round-1 (rank t may be one barrier ahead: round+1).
	Counting
	// CountingEqual is deliberately broken: counting, but a lane spins until
	// its slot equals round, so a peer one barrier ahead (round+1) is never
	// seen.
	CountingEqual
)

// String names the variant.
func (v BarrierVariant) String() string {
	switch v {
	case TwoPhase:
		return "two-phase"
	case OnePhase:
		return "one-phase"
	case GreaterOrEqual:
		return "greater-or-equal"
	case Counting:
		return "counting"
	case CountingEqual:
		return "counting-equal"
	}
	return fmt.Sprintf("BarrierVariant(%d)", int(v))
}

// barrier is the per-block counter barrier over the ranks' signal regions.
type barrier struct {
	sig     []*signal
	variant BarrierVariant
	run     *run
}

// phase returns the peer_counter slot the round number val uses.
func (m *barrier) phase(val uint32) int {
	if m.variant == OnePhase || m.counting() {
		return 0
	}
	return int(val & 1)
}

// reached reports whether a lane waiting for val may stop spinning: the
// kernel spins while slot != val.
func (m *barrier) reached(slot, val uint32) bool {
	switch m.variant {
	case GreaterOrEqual:
		return slot >= val
	case Counting:
		return slot != val-1
	}
	return slot == val
}

// counting reports whether arrivals are atomic adds rather than stores of the round.
func (m *barrier) counting() bool { return m.variant == Counting || m.variant == CountingEqual }

// lane is the state of one barrier lane (thread t < ws) of a block.
type lane struct {
	val    uint32 // this barrier's round number
	stored bool   // (3) done; spinning
}

// wait runs steps (2) to (5) of the barrier for block b of rank: every lane
// t < ws bumps its round counter, stores it into rank t's peer_counter slot
// for this rank, and spins until rank t's lane for this rank has stored the
// same round into this rank's slot. The lanes' steps interleave in a random
// order, as independently scheduled threads may. It returns when every lane
// is through, which is what the bar.sync of (6) waits for, with the round
// number; false means the run stopped.
func (m *barrier) wait(rank, b int, j *jitter) (uint32, bool) {
	return m.waitPublishing(rank, b, j, nil)
}

// waitPublishing is wait for an entry barrier whose lane 0 publishes the rank's call with its
// round (pub; nil for none), as the kernels' thread 0 does after (2).
func (m *barrier) waitPublishing(rank, b int, j *jitter, pub *publisher) (uint32, bool) {
	return m.waitReleasing(rank, b, j, pub, nil)
}

// waitReleasing is waitPublishing whose lanes call release(t) right before they tell rank t
// of their arrival (3): the one-shot entry barrier's fence, which releases the block's staged
// copies (nil for none).
func (m *barrier) waitReleasing(rank, b int, j *jitter, pub *publisher, release func(lane int)) (uint32, bool) {
	return m.handshake(rank, b, j, pub, release, nil)
}

// waitSplit is wait in two halves, as the fused one-shot's row-cache build runs its exit
// barrier: every lane first tells its peer (2, 3; the arrive half), then the block runs
// between (its work between the halves; false stops the run), and only then do the lanes
// poll (4, 5; the wait half).
func (m *barrier) waitSplit(rank, b int, j *jitter, between func() bool) (uint32, bool) {
	return m.handshake(rank, b, j, nil, nil, between)
}

// handshake runs steps (2) to (5) for every lane of block b of rank in a random interleaving
// (waitReleasing), or, with between, every lane's (2) and (3) before between and every poll
// after it (waitSplit).
func (m *barrier) handshake(rank, b int, j *jitter, pub *publisher, release func(lane int), between func() bool) (uint32, bool) {
	ws := len(m.sig)
	own := m.sig[rank]
	lanes := make([]lane, ws)
	pending := make([]int, ws)
	for t := range pending {
		pending[t] = t
	}
	arrived := 0
	for len(pending) > 0 {
		if m.run.stopped() {
			for _, t := range pending {
				if lanes[t].stored {
					ph := m.phase(lanes[t].val)
					m.run.blocked(Wait{
						Rank: rank, Block: b, Peer: t,
						Slot: fmt.Sprintf("peer_counter[%d][%d][%d]", ph, b, t),
						Want: lanes[t].val, Holds: own[peerCounterWord(ph, b, t)].Load(),
					})
				}
			}
			return 0, false
		}
		k := j.rng.IntN(len(pending))
		t := pending[k]
		l := &lanes[t]
		if !l.stored {
			if m.counting() {
				// (3) first: one more arrival of this rank's block b at rank t,
				// before the lane knows its round.
				if release != nil {
					release(t)
				}
				m.sig[t][peerCounterWord(0, b, rank)].Add(1)
				j.pause()
			}
			// (2) Only this lane touches its counter: a plain increment.
			l.val = own[selfCounterWord(b, t)].Load() + 1
			own[selfCounterWord(b, t)].Store(l.val)
			if t == 0 && pub != nil {
				pub.publish(l.val)
			}
			if !m.counting() {
				// (3) Tell rank t that this rank reached round val.
				if release != nil {
					release(t)
				}
				m.sig[t][peerCounterWord(m.phase(l.val), b, rank)].Store(l.val)
			}
			l.stored = true
			arrived++
			j.pause()
			continue
		}
		if between != nil {
			if arrived < ws {
				// the wait half starts once every lane has arrived
				continue
			}
			if !between() {
				return 0, false
			}
			between = nil
		}
		// (4)/(5) One poll of the slot rank t writes for this rank.
		if !m.reached(own[peerCounterWord(m.phase(l.val), b, t)].Load(), l.val) {
			j.idle()
			continue
		}
		pending = append(pending[:k], pending[k+1:]...)
		j.pause()
	}
	return lanes[0].val, true
}

// BarrierConfig is one run of the barrier model.
type BarrierConfig struct {
	// Ranks (1..MaxRanks) and Blocks (1..MaxBlocks) per rank; every block is
	// a goroutine that runs Rounds barriers back to back.
	Ranks, Blocks, Rounds int
	// Variant is the barrier under test.
	Variant BarrierVariant
	// Start is the round number every block begins from, as if Start
	// barriers had already run; close to 2^32 it makes the counters wrap.
	Start uint32
	// Seed drives each block's random delays and lane order.
	Seed uint64
	// Stall is the progress watchdog's limit; 0 means DefaultStall.
	Stall time.Duration
	// Calls adds a call check: barriers pair up into calls (entry, then exit), and block
	// 0's entry barrier carries the check of CallVariant (the other blocks carry none).
	Calls CallVariant
	// Mismatches lists the calls (0, 1, ..) in which rank call%Ranks makes a different
	// call from the others; every other call is the same on every rank.
	Mismatches []int
}

// Barrier runs the barrier model: Ranks x Blocks goroutines, each passing
// Rounds barriers with random delays between and inside them. It checks at
// every pass that every rank's same block had arrived at that barrier, and
// that the round number is the expected one. With a call check, it also checks
// that exactly the calls of Mismatches were reported, by both ranks of every
// pair that differs, in block 0 (the one block that checks). It returns
// ErrEarlyPass, ErrFalseMismatch, ErrMissedMismatch, a *DeadlockError, or the
// context's error, with what the run exercised.
func Barrier(ctx context.Context, cfg BarrierConfig) (Stats, error) {
	if err := checkShape(cfg.Ranks, cfg.Blocks, cfg.Rounds); err != nil {
		return Stats{}, err
	}
	r := newRun(cfg.Stall)
	m := &barrier{sig: newSignals(cfg.Ranks), variant: cfg.Variant, run: r}
	startHistory(m, cfg.Blocks, cfg.Start)
	var cc *callChecker
	if cfg.Calls != NoCallCheck {
		cc = &callChecker{m: m, variant: cfg.Calls, mismatches: cfg.Mismatches}
		if cfg.Start != 0 {
			// the previous entry barrier was at round Start-1, with another call
			h := cfg.Calls.half(cfg.Start - 1)
			for _, s := range m.sig {
				for i, w := range ptx.CallWords(modelCall(-1, 0, cfg.Ranks, nil), uint16(cfg.Start-1)) {
					s[callWord(4*h+i)].Store(w)
				}
			}
		}
	}

	// arrived[b][k]: ranks whose block b arrived at barrier k. passed[p][b]:
	// barriers block b of rank p has passed.
	arrived := make([][]atomic.Int32, cfg.Blocks)
	for b := range arrived {
		arrived[b] = make([]atomic.Int32, cfg.Rounds)
	}
	passed := make([][]atomic.Int64, cfg.Ranks)
	for p := range passed {
		passed[p] = make([]atomic.Int64, cfg.Blocks)
	}

	end := r.watch(ctx)
	var wg sync.WaitGroup
	for rank := range cfg.Ranks {
		for b := range cfg.Blocks {
			wg.Go(func() {
				j := newJitter(cfg.Seed, rank, b)
				// block 0 alone publishes and checks the call: it exists in every call
				// of every rank, and the call names the whole call
				checks := cc != nil && b == 0
				var pub *publisher
				if checks {
					pub = &publisher{own: m.sig[rank], variant: cfg.Calls,
						rng: rand.New(rand.NewPCG(cfg.Seed^0x9E3779B97F4A7C15, uint64(rank)<<8|uint64(b)))}
					j.drain = pub.drain
					// the last kernel's end: its call words are visible to the peers' last
					// checks, which (without an exit barrier) may come after this block is done
					defer pub.flush()
				}
				var loaded [MaxRanks][4]uint32 // rank t's call as lane t loaded it
				var entry uint32               // the round of the call's entry barrier
				perBarrier := cfg.Calls.perBarrier()
				// test runs lane t's test of call c for every t: false means the run stopped
				test := func(c int) bool {
					for _, t := range j.rng.Perm(cfg.Ranks) {
						if !cc.check(rank, t, c, entry, loaded[t], j, pub) {
							return false
						}
					}
					return true
				}
				for k := range cfg.Rounds {
					call, isEntry := k/2, k%2 == 0
					if perBarrier {
						call, isEntry = k, true
					}
					if checks {
						switch {
						case perBarrier && k > 0:
							// no exit barrier: the previous call's test, before this call's
							// entry (the lanes' next arrival)
							if !test(k - 1) {
								return
							}
						case !perBarrier && k%2 == 1 && cfg.Calls != CallLate:
							// the test before the lanes' next arrival, at the exit barrier
							if !test(call) {
								return
							}
						}
					}
					j.pause() // the block's work between barriers
					for p := range cfg.Ranks {
						if passed[p][b].Load() < int64(k) {
							r.ahead.Add(1)
							break
						}
					}
					// Counted before (3), so a correct pass always sees it.
					arrived[b][k].Add(1)
					var val uint32
					var ok bool
					if checks && isEntry {
						pub.fp = modelCall(call, rank, cfg.Ranks, cfg.Mismatches)
						val, ok = m.waitPublishing(rank, b, j, pub)
					} else {
						val, ok = m.wait(rank, b, j)
					}
					if !ok {
						return
					}
					if n := arrived[b][k].Load(); n != int32(cfg.Ranks) {
						r.fail(fmt.Errorf("protomodel: %w: %v barrier: rank %d block %d passed barrier %d (round %#x) when %d of %d ranks had arrived",
							ErrEarlyPass, cfg.Variant, rank, b, k, val, n, cfg.Ranks))
						return
					}
					if want := cfg.Start + uint32(k) + 1; val != want {
						r.fail(fmt.Errorf("protomodel: %v barrier: rank %d block %d used round %#x at barrier %d, want %#x", cfg.Variant, rank, b, val, k, want))
						return
					}
					if checks && isEntry {
						// lane t loads rank t's call right after the entry barrier
						entry = val
						if cfg.Calls != CallLate {
							for _, t := range j.rng.Perm(cfg.Ranks) {
								loaded[t] = cc.load(rank, t, val, j, pub)
							}
						}
					}
					if checks && k%2 == 1 && cfg.Calls == CallLate {
						for _, t := range j.rng.Perm(cfg.Ranks) {
							if !cc.check(rank, t, call, entry, cc.load(rank, t, entry, j, pub), j, pub) {
								return
							}
						}
					}
					if checks && perBarrier && k == cfg.Rounds-1 {
						// the last call's test, before the kernel ends
						j.pause()
						if !test(call) {
							return
						}
					}
					passed[rank][b].Add(1)
					r.rounds.Add(1)
					r.progress.Add(1)
				}
			})
		}
	}
	wg.Wait()
	end()
	st, err := r.result()
	if err == nil && cc != nil {
		calls := cfg.Rounds / 2
		if cfg.Calls.perBarrier() {
			calls = cfg.Rounds
		}
		err = cc.result(cfg.Ranks, calls)
	}
	return st, err
}

// startHistory sets the counters to the state Start completed barriers leave:
// every round counter at start and each phase slot holding the last round of
// its parity. A zeroed region is this state for start 0.
func startHistory(m *barrier, blocks int, start uint32) {
	for _, s := range m.sig {
		for b := range blocks {
			for t := range m.sig {
				s[selfCounterWord(b, t)].Store(start)
				if m.counting() {
					// start arrivals of every rank at every block
					s[peerCounterWord(0, b, t)].Store(start)
				} else if start != 0 {
					s[peerCounterWord(m.phase(start-1), b, t)].Store(start - 1)
					s[peerCounterWord(m.phase(start), b, t)].Store(start)
				}
			}
		}
	}
}
