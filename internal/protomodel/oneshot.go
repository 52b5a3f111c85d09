package protomodel

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// StageVariant says how a one-shot call's input reaches the buffer the peers read.
type StageVariant int

const (
	// HostCopy is a copy enqueued before the kernel (the eager path of the kernels that
	// do not stage their input themselves): it waits only for the rank's own previous
	// kernel and lands element by element, in any order.
	HostCopy StageVariant = iota
	// KernelStaged is the one-shot kernel with ptx.FlagStageInput: at its start each thread
	// copies the elements it reduces into the rank's buffer, as weak stores that stay
	// pending until something orders them; the copy ends with a bar.sync, and every lane of
	// the entry barrier fences right before it tells its peer (3), which lands all of the
	// block's pending copies; after the barrier the block reads (its lanes' acquiring polls
	// and bar.red keep every read after the barrier).
	KernelStaged
	// StagedNoRelease is deliberately broken: no fence before the flags, so the copies
	// land whenever they do, possibly after a peer has passed the barrier and read.
	StagedNoRelease
	// StagedNoBarSync is deliberately broken: the fences but no bar.sync after the copy, so
	// lane t's fence releases only its own thread's copies, not the block's.
	StagedNoBarSync
	// StagedNoAcquire is deliberately broken: the polls do not acquire, so the block's reads
	// of its peers' inputs may be performed before its barrier has seen them arrive (the
	// model performs about half of them early, before the barrier).
	StagedNoAcquire
	// StagedAfterBarrier is deliberately broken: the copy after the entry barrier, so the
	// barrier orders nothing.
	StagedAfterBarrier
	// StagedOtherBlock is deliberately broken: block b copies the elements of block b+1,
	// whose readers the per-block barrier of block b does not wait for.
	StagedOtherBlock
)

// String names the variant.
func (v StageVariant) String() string {
	switch v {
	case HostCopy:
		return "host-copy"
	case KernelStaged:
		return "kernel-staged"
	case StagedNoRelease:
		return "staged-no-release"
	case StagedNoBarSync:
		return "staged-no-bar-sync"
	case StagedNoAcquire:
		return "staged-no-acquire"
	case StagedAfterBarrier:
		return "staged-after-barrier"
	case StagedOtherBlock:
		return "staged-other-block"
	}
	return fmt.Sprintf("StageVariant(%d)", int(v))
}

// RegionLayout says where the kernel's staging copy (KernelStaged) puts a block's elements,
// the place its peers' same block reads them from.
type RegionLayout int

const (
	// SharedBuffer is one buffer per rank, indexed by element: what the kernels stage into.
	// Without the exit barrier the next call's copies overwrite what a slow peer still reads.
	SharedBuffer RegionLayout = iota
	// BlockParity gives every block a region of its own, in two halves, and block b stages the
	// elements of a call, in the order it visits them, into the half that the parity of its
	// entry barrier's round picks (its self_counter[b][0]+1, read before the barrier). This
	// is what lets a one-shot drop its exit barrier: a block at round r has seen the peers'
	// block b arrive at round r-1, so each has finished its reads of round r-2, the last
	// ones of the same half, whatever the grids of the calls between; and no block but the
	// peers' block b reads block b's region.
	BlockParity
	// BlockRegionsOnly is deliberately broken without the exit barrier: regions per block
	// but one half, so the next call's copies overwrite a region a slow peer still reads.
	BlockRegionsOnly
	// ElemParity is deliberately broken without the exit barrier where grids change from
	// call to call: two halves picked by the round's parity but indexed by element, so block
	// b's copies may land on elements that another block of a slow peer, whose round has
	// the same parity, still reads.
	ElemParity
)

// String names the layout.
func (l RegionLayout) String() string {
	switch l {
	case SharedBuffer:
		return "shared-buffer"
	case BlockParity:
		return "block-parity"
	case BlockRegionsOnly:
		return "block-regions-only"
	case ElemParity:
		return "elem-parity"
	}
	return fmt.Sprintf("RegionLayout(%d)", int(l))
}

// OneShotConfig is one run of the one-shot model.
type OneShotConfig struct {
	// Ranks (1..MaxRanks), Blocks (1..MaxBlocks) per rank, Threads per block,
	// Elems input elements per rank and Rounds calls.
	Ranks, Blocks, Threads, Elems, Rounds int
	// ExitBarrier keeps the kernel's exit barrier; without it the model must
	// catch a stale read.
	ExitBarrier bool
	// SplitExit (with ExitBarrier) runs the exit barrier in two halves, as the fused
	// one-shot's row-cache build does: the block tells its peers it has arrived right after
	// its reads, goes on with work of its own, and waits for them at the end.
	SplitExit bool
	// SplitEarly (with SplitExit) is deliberately broken: the block arrives before its last
	// reads, so a peer may pass the barrier and overwrite an input the block still reads.
	SplitEarly bool
	// Stage is how each call's input reaches the buffer the peers read.
	Stage StageVariant
	// Regions is where KernelStaged puts each block's elements (SharedBuffer for the other
	// stage variants).
	Regions RegionLayout
	// VaryGrid gives each call a grid of its own, 1 to Blocks blocks, the same on every
	// rank: the blocks of a call's grid take part in its barriers, the others skip it, so
	// the blocks' rounds drift apart.
	VaryGrid bool
	// Barrier is the barrier protocol: TwoPhase (the zero value) or Counting.
	Barrier BarrierVariant
	// Seed drives each block's random delays and read order.
	Seed uint64
	// Stall is the progress watchdog's limit; 0 means DefaultStall.
	Stall time.Duration
}

// oneShotModel is the memory of a one-shot run.
type oneShotModel struct {
	cfg   OneShotConfig
	run   *run
	bar   *barrier
	in    [][]atomic.Uint32 // in[r]: the buffer the peers read of rank r; call k writes k+1
	read  [][]atomic.Int64  // read[r][b]: 1 + the last call whose reads block b of rank r finished
	grids []int             // grids[k]: call k's blocks
}

// regionIndex is where block b stages the element it visits pos-th (elem, in the order of
// the grid-stride loop) for a round of parity: in[r] holds 2*Blocks regions of Elems.
func (m *oneShotModel) regionIndex(parity uint32, b, pos, elem int) int {
	cfg := m.cfg
	switch cfg.Regions {
	case BlockParity:
		return (int(parity)*cfg.Blocks+b)*cfg.Elems + pos
	case BlockRegionsOnly:
		return b*cfg.Elems + pos
	case ElemParity:
		return int(parity)*cfg.Blocks*cfg.Elems + elem
	}
	return elem
}

// OneShot runs the one-shot model. Every rank runs Rounds calls in stream order, each
// writing the call's data into the buffer its peers read (Stage: a copy before the kernel,
// or the kernel's own staging, into the place Regions says), then a kernel of Blocks
// goroutines (or the call's own grid, VaryGrid): entry barrier, a grid-stride loop reading
// every rank's buffer, and the exit barrier when ExitBarrier is set.
// Input elements of call k hold k+1, so every read checks that it saw this call's data. It
// returns ErrStaleRead, a *DeadlockError, or the context's error, with what the run
// exercised; Stats.Ahead counts calls whose staging began while a peer block was still
// reading the previous call.
func OneShot(ctx context.Context, cfg OneShotConfig) (Stats, error) {
	if err := checkShape(cfg.Ranks, cfg.Blocks, cfg.Rounds); err != nil {
		return Stats{}, err
	}
	if cfg.Threads < 1 || cfg.Elems < 0 {
		return Stats{}, fmt.Errorf("protomodel: %d threads, %d elements: want at least 1 thread and no negative count", cfg.Threads, cfg.Elems)
	}
	if cfg.Stage < HostCopy || cfg.Stage > StagedOtherBlock {
		return Stats{}, fmt.Errorf("protomodel: unknown stage variant %d", int(cfg.Stage))
	}
	if cfg.Barrier != TwoPhase && cfg.Barrier != Counting {
		return Stats{}, fmt.Errorf("protomodel: one-shot runs the kernels' barriers, TwoPhase or Counting, not %v", cfg.Barrier)
	}
	if cfg.SplitExit && !cfg.ExitBarrier || cfg.SplitEarly && !cfg.SplitExit {
		return Stats{}, fmt.Errorf("protomodel: SplitExit splits the exit barrier (ExitBarrier), and SplitEarly is a SplitExit")
	}
	if cfg.Regions < SharedBuffer || cfg.Regions > ElemParity {
		return Stats{}, fmt.Errorf("protomodel: unknown region layout %d", int(cfg.Regions))
	}
	if cfg.Regions != SharedBuffer && (cfg.Stage != KernelStaged || cfg.SplitExit) {
		return Stats{}, fmt.Errorf("protomodel: region layout %v: the kernel's own staging (KernelStaged), without SplitExit", cfg.Regions)
	}
	r := newRun(cfg.Stall)
	m := &oneShotModel{cfg: cfg, run: r, bar: &barrier{sig: newSignals(cfg.Ranks), variant: cfg.Barrier, run: r}}
	m.in = make([][]atomic.Uint32, cfg.Ranks)
	m.read = make([][]atomic.Int64, cfg.Ranks)
	size := cfg.Elems
	if cfg.Regions != SharedBuffer {
		size = 2 * cfg.Blocks * cfg.Elems
	}
	for p := range cfg.Ranks {
		m.in[p] = make([]atomic.Uint32, size)
		m.read[p] = make([]atomic.Int64, cfg.Blocks)
	}
	m.grids = make([]int, cfg.Rounds)
	grids := rand.New(rand.NewPCG(cfg.Seed, 0x6A1D))
	for k := range m.grids {
		m.grids[k] = cfg.Blocks
		if cfg.VaryGrid {
			m.grids[k] = 1 + grids.IntN(cfg.Blocks)
		}
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
				if cfg.Stage == HostCopy {
					// The copy runs once the rank's previous kernel has exited and
					// lands element by element, in any order.
					for _, i := range copier.rng.Perm(cfg.Elems) {
						m.in[rank][i].Store(uint32(k + 1))
						copier.pause()
					}
				}
				var blocks sync.WaitGroup
				var reads atomic.Int64
				for b := range m.grids[k] {
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
	if k == 0 {
		return false
	}
	for _, blocks := range m.read {
		for b := range m.grids[k-1] {
			if blocks[b].Load() < int64(k) {
				return true
			}
		}
	}
	return false
}

// stagedStore is one weak store of a block's staging copy, not yet in memory.
type stagedStore struct {
	elem, thread int
	value        uint32
}

// stager is one block's staging copy (KernelStaged and its broken variants): weak stores
// into the rank's buffer that stay pending until a release lands them, or until they land
// on their own at a random later step of the block (drain).
type stager struct {
	buf     []atomic.Uint32
	rng     *rand.Rand
	pending []stagedStore
}

// copy queues thread t's stores of value at elems.
func (s *stager) copy(t int, elems []int, value uint32) {
	for _, i := range elems {
		s.pending = append(s.pending, stagedStore{i, t, value})
	}
	s.rng.Shuffle(len(s.pending), func(x, y int) { s.pending[x], s.pending[y] = s.pending[y], s.pending[x] })
}

// land writes the pending stores that keep says to memory and keeps the others pending.
func (s *stager) land(keep func(stagedStore) bool) {
	kept := s.pending[:0]
	for _, st := range s.pending {
		if keep(st) {
			kept = append(kept, st)
			continue
		}
		s.buf[st.elem].Store(st.value)
	}
	s.pending = kept
}

// drain lets each pending store reach memory with probability 1/4.
func (s *stager) drain() { s.land(func(stagedStore) bool { return s.rng.IntN(4) != 0 }) }

// flush lands every pending store: the kernel's end.
func (s *stager) flush() { s.land(func(stagedStore) bool { return false }) }

// own returns the value of the block's own pending store to elem, if any: a thread reads
// what it stored itself (program order), before the store has reached memory.
func (s *stager) own(elem int) (uint32, bool) {
	for i := len(s.pending) - 1; i >= 0; i-- {
		if s.pending[i].elem == elem {
			return s.pending[i].value, true
		}
	}
	return 0, false
}

// blockElems returns the elements block b's threads visit in a grid of grid blocks, in any
// order, each with its thread and its place in the block's visiting order (the n-th
// element of thread t is place n*Threads+t).
func (m *oneShotModel) blockElems(b, grid int) (elems, threads, places []int) {
	cfg := m.cfg
	for t := range cfg.Threads {
		for n, i := range threadElems(b, t, grid, cfg.Threads, cfg.Elems) {
			elems = append(elems, i)
			threads = append(threads, t)
			places = append(places, n*cfg.Threads+t)
		}
	}
	return elems, threads, places
}

// block runs block b of rank for call k and returns the number of reads it
// made: staging (Stage), entry barrier, every rank's input at the block's elements, exit
// barrier.
func (m *oneShotModel) block(rank, b, k int, j *jitter) (reads int) {
	cfg := m.cfg
	value := uint32(k + 1)
	grid := m.grids[k]
	elems, threads, places := m.blockElems(b, grid)
	// the half of the block's region this call uses: the parity of its entry barrier's round,
	// which lane 0 knows before the barrier (self_counter[b][0] + 1)
	parity := (m.bar.sig[rank][selfCounterWord(b, 0)].Load() + 1) & 1
	where := func(x int) int { return m.regionIndex(parity, b, places[x], elems[x]) }
	var st *stager
	if cfg.Stage != HostCopy {
		st = &stager{buf: m.in[rank], rng: rand.New(rand.NewPCG(cfg.Seed^0x5DEECE66D, uint64(rank)<<16|uint64(b)<<8|uint64(k&0xFF)))}
		j.drain = st.drain
		defer func() {
			// the kernel's end: its stores are visible to the next kernel
			st.flush()
			j.drain = nil
		}()
	}
	stage := func() {
		if cfg.Regions != SharedBuffer {
			for x := range elems {
				st.copy(threads[x], []int{where(x)}, value)
			}
			j.pause()
			return
		}
		src := b
		if cfg.Stage == StagedOtherBlock {
			src = (b + 1) % grid
		}
		for t := range cfg.Threads {
			st.copy(t, threadElems(src, t, grid, cfg.Threads, cfg.Elems), value)
		}
		j.pause()
	}
	var release func(lane int)
	switch cfg.Stage {
	case KernelStaged, StagedNoAcquire, StagedOtherBlock:
		// bar.sync after the copy, then each lane's fence: the whole block's copies land
		release = func(int) {
			m.run.released.Add(int64(len(st.pending)))
			st.flush()
		}
	case StagedNoBarSync:
		// lane t's fence orders its own thread's copies only
		release = func(lane int) { st.land(func(s stagedStore) bool { return s.thread != lane }) }
	}
	if cfg.Stage != HostCopy && cfg.Stage != StagedAfterBarrier {
		stage()
	}

	order := j.rng.Perm(len(elems))
	// early[x*Ranks+p]: a read of rank p's element elems[x] performed before the barrier
	// (StagedNoAcquire), -1 for none
	var early []int64
	if cfg.Stage == StagedNoAcquire {
		early = make([]int64, len(elems)*cfg.Ranks)
		for _, x := range order {
			for p := range cfg.Ranks {
				early[x*cfg.Ranks+p] = -1
				if p != rank && j.rng.IntN(2) == 0 {
					early[x*cfg.Ranks+p] = int64(m.in[p][where(x)].Load())
					j.pause()
				}
			}
		}
	}
	if _, ok := m.bar.waitReleasing(rank, b, j, nil, release); !ok {
		return reads
	}
	if cfg.Stage == StagedAfterBarrier {
		stage()
		st.flush()
	}
	// The block's threads read in any order; readAll reads the elements order[xs] of every
	// rank and reports false after a stale read.
	readAll := func(xs []int) bool {
		for _, x := range xs {
			i := where(x)
			for p := range cfg.Ranks {
				var v uint32
				switch {
				case early != nil && early[x*cfg.Ranks+p] >= 0:
					v = uint32(early[x*cfg.Ranks+p])
				case p == rank && st != nil:
					var ok bool
					if v, ok = st.own(i); !ok {
						v = m.in[p][i].Load()
					}
				default:
					v = m.in[p][i].Load()
				}
				if v != value {
					m.run.fail(fmt.Errorf("protomodel: %w: %v, %v: rank %d block %d (thread %d) in call %d read rank %d's element %d and found call %d's data",
						ErrStaleRead, cfg.Stage, cfg.Regions, rank, b, threads[x], k, p, elems[x], int(v)-1))
					return false
				}
				reads++
				j.pause()
			}
			m.run.progress.Add(1)
		}
		return true
	}
	if cfg.SplitExit {
		// the arrive half after the reads (SplitEarly: before the last of them), the wait half
		// after the block's own work (the fused kernel's norm pass: pauses here)
		cut := len(order)
		if cfg.SplitEarly && cut > 0 {
			cut = j.rng.IntN(cut)
		}
		if !readAll(order[:cut]) {
			return reads
		}
		if cut == len(order) {
			m.read[rank][b].Store(int64(k + 1))
		}
		if _, ok := m.bar.waitSplit(rank, b, j, func() bool {
			if cut < len(order) {
				if !readAll(order[cut:]) {
					return false
				}
				m.read[rank][b].Store(int64(k + 1))
			}
			for range 1 + j.rng.IntN(4) {
				j.pause()
			}
			return true
		}); !ok {
			return reads
		}
		m.run.rounds.Add(1)
		m.run.progress.Add(1)
		return reads
	}
	if !readAll(order) {
		return reads
	}
	m.read[rank][b].Store(int64(k + 1))
	if cfg.ExitBarrier {
		if _, ok := m.bar.wait(rank, b, j); !ok {
			return reads
		}
	}
	m.run.rounds.Add(1)
	m.run.progress.Add(1)
	return reads
}
