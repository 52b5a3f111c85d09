package protomodel

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
)

// PushVariant selects the receive-buffer protocol a push model runs.
type PushVariant int

const (
	// TwoHalves is the kernels' protocol: epoch e uses receive half e&1.
	TwoHalves PushVariant = iota
	// OneHalf is deliberately broken: every epoch uses the same half, so a
	// rank one call ahead writes into slots a slow peer has not read (a wrong
	// sum) or has not re-armed yet (its zeros then swallow the new data: a
	// deadlock).
	OneHalf
)

// String names the variant.
func (v PushVariant) String() string {
	switch v {
	case TwoHalves:
		return "two-halves"
	case OneHalf:
		return "one-half"
	}
	return fmt.Sprintf("PushVariant(%d)", int(v))
}

// PushConfig is one run of the push (Lamport) model.
type PushConfig struct {
	// Ranks (1..MaxRanks), Blocks (1..MaxBlocks) per rank and Threads per
	// block; Elems float32 elements per rank, a multiple of 4 (whole 16-byte
	// vectors); Rounds calls, each with fresh random data.
	Ranks, Blocks, Threads, Elems, Rounds int
	// Variant is the protocol under test.
	Variant PushVariant
	// Start is every block's push_epoch at creation; close to 2^32 it makes
	// the epoch wrap.
	Start uint32
	// Seed drives the data and each block's random delays and thread order.
	Seed uint64
	// Stall is the progress watchdog's limit; 0 means DefaultStall.
	Stall time.Duration
}

// pushModel is the memory of a push run.
type pushModel struct {
	cfg  PushConfig
	run  *run
	sig  []*signal
	recv [][]atomic.Uint32 // recv[r]: rank r's receive buffer, [2 halves][ws sources][Elems]
	in   [][][]uint32      // in[k][r]: rank r's input of call k
	want [][]uint32        // want[k]: the call's sum as internal/ref.Push computes it
	done [][]atomic.Int64  // done[r][b]: calls block b of rank r has finished
}

// slot returns the index in a receive buffer of (half h, source s, element i):
// docs/kernel-abi.md's byte offset (h*ws + s)*p_slot + 4*i in words.
func (m *pushModel) slot(h, s, i int) int { return (h*m.cfg.Ranks+s)*m.cfg.Elems + i }

// Push runs the push model: every rank runs Rounds calls in stream order, each
// call Blocks goroutines that send the rank's input to every rank's receive
// buffer and then poll, reduce and re-arm their own, with random delays. Every
// received sum is compared bitwise to internal/ref.Push. It returns
// ErrWrongSum, a *DeadlockError, or the context's error, with what the run
// exercised.
func Push(ctx context.Context, cfg PushConfig) (Stats, error) {
	if err := checkShape(cfg.Ranks, cfg.Blocks, cfg.Rounds); err != nil {
		return Stats{}, err
	}
	if cfg.Threads < 1 || cfg.Elems < 0 || cfg.Elems%4 != 0 {
		return Stats{}, fmt.Errorf("protomodel: %d threads, %d elements: want at least 1 thread and a multiple of 4 elements", cfg.Threads, cfg.Elems)
	}
	m := &pushModel{cfg: cfg, run: newRun(cfg.Stall), sig: newSignals(cfg.Ranks)}
	if err := m.data(); err != nil {
		return Stats{}, err
	}
	m.recv = make([][]atomic.Uint32, cfg.Ranks)
	m.done = make([][]atomic.Int64, cfg.Ranks)
	for r := range cfg.Ranks {
		m.recv[r] = make([]atomic.Uint32, 2*cfg.Ranks*cfg.Elems)
		m.done[r] = make([]atomic.Int64, cfg.Blocks)
		for b := range cfg.Blocks {
			m.sig[r][pushEpochWord(b)].Store(cfg.Start)
		}
	}

	end := m.run.watch(ctx)
	var ranks sync.WaitGroup
	for rank := range cfg.Ranks {
		ranks.Go(func() {
			jitters := make([]*jitter, cfg.Blocks)
			for b := range jitters {
				jitters[b] = newJitter(cfg.Seed, rank, b)
			}
			// Calls on one rank are stream-ordered: call k+1's blocks start
			// after every block of call k has finished.
			for k := range cfg.Rounds {
				var blocks sync.WaitGroup
				var summed atomic.Int64
				for b := range cfg.Blocks {
					blocks.Go(func() { summed.Add(int64(m.block(rank, b, k, jitters[b]))) })
				}
				blocks.Wait()
				if m.run.stopped() {
					return
				}
				if n := summed.Load(); n != int64(cfg.Elems) {
					m.run.fail(fmt.Errorf("protomodel: push: rank %d call %d summed %d of %d elements: the grid-stride loop misses some", rank, k, n, cfg.Elems))
					return
				}
			}
		})
	}
	ranks.Wait()
	end()
	return m.run.result()
}

// data draws every call's inputs and computes the expected sums.
func (m *pushModel) data() error {
	cfg := m.cfg
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xda7a))
	m.in = make([][][]uint32, cfg.Rounds)
	m.want = make([][]uint32, cfg.Rounds)
	for k := range cfg.Rounds {
		raw := make([][]byte, cfg.Ranks)
		m.in[k] = make([][]uint32, cfg.Ranks)
		for r := range raw {
			raw[r] = ref.Random(rng, dtype.Float32, 4*cfg.Elems)
			m.in[k][r] = words(raw[r])
		}
		sum, err := ref.Push(dtype.Float32, raw)
		if err != nil {
			return fmt.Errorf("protomodel: reference sum: %w", err)
		}
		m.want[k] = words(sum)
	}
	return nil
}

// words decodes little-endian u32 words.
func words(b []byte) []uint32 {
	w := make([]uint32, len(b)/4)
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return w
}

// pushThread is the state of one modelled thread of a push block: it sends
// each of its elements to every rank, then receives each of them.
type pushThread struct {
	elems []int // this thread's elements, in grid-stride order
	pos   int   // current element in elems
	peer  int   // send: next destination; receive: next source
	recv  bool  // the send loop is done
	rearm bool  // the current element is summed; peer is the next slot to zero
	acc   float32
}

// block runs block b of rank for call k: one kernel block of the push
// algorithm, its threads' steps interleaved in a random order. It returns the
// number of elements it summed.
func (m *pushModel) block(rank, b, k int, j *jitter) (summed int) {
	cfg := m.cfg
	own := m.recv[rank]
	// Every thread reads the block's epoch at the start; it only changes at
	// the end of the block, after the bar.sync.
	e := m.sig[rank][pushEpochWord(b)].Load()
	h := int(e & 1)
	if cfg.Variant == OneHalf {
		h = 0
	}
	for p := range cfg.Ranks {
		if m.done[p][b].Load() < int64(k) {
			m.run.ahead.Add(1)
			break
		}
	}

	var pending []*pushThread
	for t := range cfg.Threads {
		th := &pushThread{elems: threadElems(b, t, cfg.Blocks, cfg.Threads, cfg.Elems)}
		if len(th.elems) > 0 {
			pending = append(pending, th)
		}
	}
	for len(pending) > 0 {
		if m.run.stopped() {
			for _, th := range pending {
				if th.recv && !th.rearm {
					i := th.elems[th.pos]
					m.run.blocked(Wait{
						Rank: rank, Block: b, Peer: th.peer,
						Slot:  fmt.Sprintf("receive half %d source %d element %d", h, th.peer, i),
						Holds: own[m.slot(h, th.peer, i)].Load(),
					})
				}
			}
			return summed
		}
		x := j.rng.IntN(len(pending))
		th := pending[x]
		i := th.elems[th.pos]
		switch {
		case !th.recv:
			// Send: +0.0 would read as "not arrived", so it travels as -0.0.
			v := m.in[k][rank][i]
			if v == 0 {
				v = 1 << 31
			}
			m.recv[th.peer][m.slot(h, rank, i)].Store(v)
			if th.peer++; th.peer == cfg.Ranks {
				th.peer = 0
				if th.pos++; th.pos == len(th.elems) {
					th.pos, th.recv = 0, true
				}
			}
		case !th.rearm:
			// Receive: poll sources in rank order; all-zero bits = not arrived.
			v := own[m.slot(h, th.peer, i)].Load()
			if v == 0 {
				j.idle()
				continue
			}
			f := math.Float32frombits(v)
			if th.peer == 0 {
				th.acc = f
			} else {
				th.acc = float32(th.acc + f)
			}
			if th.peer++; th.peer == cfg.Ranks {
				if got, want := math.Float32bits(th.acc), m.want[k][i]; got != want {
					m.run.fail(fmt.Errorf("protomodel: %w: %v push: rank %d block %d call %d element %d: got %s, want %s",
						ErrWrongSum, cfg.Variant, rank, b, k, i, ref.Format(dtype.Float32, uint64(got)), ref.Format(dtype.Float32, uint64(want))))
					return summed
				}
				th.peer, th.rearm = 0, true
				summed++
				m.run.progress.Add(1)
			}
		default:
			// Re-arm: zero the slots just read, for the call after next.
			own[m.slot(h, th.peer, i)].Store(0)
			if th.peer++; th.peer == cfg.Ranks {
				th.peer, th.rearm = 0, false
				if th.pos++; th.pos == len(th.elems) {
					pending = append(pending[:x], pending[x+1:]...)
				}
			}
		}
		j.pause()
	}
	// After the block's bar.sync, thread 0 advances the block's epoch.
	m.sig[rank][pushEpochWord(b)].Store(e + 1)
	m.done[rank][b].Add(1)
	m.run.rounds.Add(1)
	return summed
}
