package protomodel

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
)

// PushVariant selects the receive-buffer protocol a push model runs.
type PushVariant int

const (
	// Immediate is the kernels' protocol below ptx.DeferRearmMinRanks ranks:
	// two parts, each slot re-armed (zeroed) right after it is read.
	Immediate PushVariant = iota
	// Deferred is the kernels' protocol from ptx.DeferRearmMinRanks ranks on:
	// three parts; a call in which every thread has at most one element
	// leaves its re-arm to the next call, which zeroes the previous call's
	// part after its sends, at the indices push_pending recorded.
	Deferred
	// OneHalf is deliberately broken: every call uses the same part, so a
	// rank one call ahead writes into slots a slow peer has not read (a wrong
	// sum) or has not re-armed yet (its zeros then swallow the new data: a
	// deadlock).
	OneHalf
	// DeferredTwoParts is deliberately broken: the deferred re-arm with two
	// parts. The next call zeroes the part a peer may already be writing for
	// the call after it, and the zeros swallow that data (a deadlock).
	DeferredTwoParts
)

// String names the variant.
func (v PushVariant) String() string {
	switch v {
	case Immediate:
		return "immediate"
	case Deferred:
		return "deferred"
	case OneHalf:
		return "one-half"
	case DeferredTwoParts:
		return "deferred-two-parts"
	}
	return fmt.Sprintf("PushVariant(%d)", int(v))
}

// parts is the number of receive parts the variant cycles through.
func (v PushVariant) parts() int {
	switch v {
	case Deferred:
		return 3
	case OneHalf:
		return 1
	}
	return 2
}

// defers reports whether the variant may leave a call's re-arm to the next call.
func (v PushVariant) defers() bool { return v == Deferred || v == DeferredTwoParts }

// PushConfig is one run of the push (Lamport) model.
type PushConfig struct {
	// Ranks (1..MaxRanks), Blocks (1..MaxBlocks) per rank, at most Threads
	// per block and at most Elems float32 elements per rank; Rounds calls.
	// Every call draws fresh random data, its element count and its block
	// size (the grid stays), the same on every rank: half the calls small
	// enough for one element per thread, so that Deferred defers them.
	Ranks, Blocks, Threads, Elems, Rounds int
	// Variant is the protocol under test.
	Variant PushVariant
	// Start is every block's part (push_epoch) at creation, below the
	// variant's number of parts.
	Start uint32
	// Seed drives the data, the call shapes and each block's random delays
	// and thread order.
	Seed uint64
	// Stall is the progress watchdog's limit; 0 means DefaultStall.
	Stall time.Duration
	// Headers is the call-header protocol; the zero value is the kernels'.
	Headers HeaderVariant
	// Fused makes about half the calls fused push calls (the all-reduce +
	// RMSNorm kernel's protocol, docs/kernel-abi.md "fused push"): the plain
	// send, a receive row by row whose mapping differs from the send's (the
	// kernel takes a block a row; the model also spreads a row over several
	// blocks where rows are few), its re-arm never deferred, and the re-arm a
	// previous plain call deferred done as push does.
	Fused bool
	// Mismatches lists the calls (0, 1, ..) in which rank call%Ranks sends a
	// different call header (the same shape and data: another element type).
	Mismatches []int
}

// HeaderVariant selects how a push model's call headers are re-armed.
type HeaderVariant int

const (
	// HeadersRearmed is the kernels' protocol: lane s of block 0 (the one block
	// that carries headers) sends its call to header[0] of slot (t, rank) of rank s
	// after its data; the receiver's lane s of block 0 waits for rank s's header
	// after its receives, compares it with its own call and zeroes it, in the same
	// call even where the data's re-arm is deferred.
	HeadersRearmed HeaderVariant = iota
	// HeadersNotRearmed is deliberately broken: headers are never zeroed, so a
	// part's next use finds the header of the call that used it before (a
	// false mismatch).
	HeadersNotRearmed
)

// String names the variant.
func (v HeaderVariant) String() string {
	switch v {
	case HeadersRearmed:
		return "headers-rearmed"
	case HeadersNotRearmed:
		return "headers-not-rearmed"
	}
	return fmt.Sprintf("HeaderVariant(%d)", int(v))
}

// pushCall is the shape of one call, the same on every rank. A fused push call
// (hvec > 0) sends like a plain one but receives row by row: elems/hvec rows of
// hvec elements, each row spread over pieces blocks (see fusedElems).
type pushCall struct {
	elems, threads int
	hvec, pieces   int
}

// fused reports whether the call is a fused push call.
func (c pushCall) fused() bool { return c.hvec > 0 }

// pushModel is the memory of a push run.
type pushModel struct {
	cfg   PushConfig
	run   *run
	sig   []*signal
	recv  [][]atomic.Uint32 // recv[r]: rank r's receive buffer, [parts][ws sources][Elems]
	calls []pushCall        // calls[k]: call k's shape
	in    [][][]uint32      // in[k][r]: rank r's input of call k
	want  [][]uint32        // want[k]: the call's sum as internal/ref.Push computes it
	done  [][]atomic.Int64  // done[r][b]: calls block b of rank r has finished
	hdr   [][]atomic.Uint32 // hdr[r]: rank r's call headers, [parts][ws sources][Blocks]

	mu      sync.Mutex
	reports []callReport // call headers that differed from the receiver's call
}

// header returns the index in hdr[r] of header[b] of slot (part t, source s).
func (m *pushModel) header(t, s, b int) int { return (t*m.cfg.Ranks+s)*m.cfg.Blocks + b }

// headerValue is the call header rank sends in call k: never 0, different for every call,
// and different for the odd rank of a mismatched call.
func (m *pushModel) headerValue(k, rank int) uint32 {
	v := uint32(k+1) | 1<<31
	if rank == k%m.cfg.Ranks && slices.Contains(m.cfg.Mismatches, k) {
		v ^= 1 << 30
	}
	return v
}

// slot returns the index in a receive buffer of (part t, source s, element i):
// docs/kernel-abi.md's byte offset (t*ws + s)*p_slot + 4*i in words.
func (m *pushModel) slot(t, s, i int) int { return (t*m.cfg.Ranks+s)*m.cfg.Elems + i }

// Push runs the push model: every rank runs Rounds calls in stream order, each
// call Blocks goroutines that send the rank's input to every rank's receive
// buffer, re-arm what the previous call left, then poll, reduce and re-arm
// their own, with random delays. Every received sum is compared bitwise to
// internal/ref.Push. It returns ErrWrongSum, a *DeadlockError, or the
// context's error, with what the run exercised.
func Push(ctx context.Context, cfg PushConfig) (Stats, error) {
	if err := checkShape(cfg.Ranks, cfg.Blocks, cfg.Rounds); err != nil {
		return Stats{}, err
	}
	if cfg.Threads < 1 || cfg.Elems < 1 {
		return Stats{}, fmt.Errorf("protomodel: %d threads, %d elements: want at least 1 of each", cfg.Threads, cfg.Elems)
	}
	if int(cfg.Start) >= cfg.Variant.parts() {
		return Stats{}, fmt.Errorf("protomodel: start part %d: the %v variant has parts 0..%d", cfg.Start, cfg.Variant, cfg.Variant.parts()-1)
	}
	m := &pushModel{cfg: cfg, run: newRun(cfg.Stall), sig: newSignals(cfg.Ranks)}
	if err := m.data(); err != nil {
		return Stats{}, err
	}
	m.recv = make([][]atomic.Uint32, cfg.Ranks)
	m.done = make([][]atomic.Int64, cfg.Ranks)
	m.hdr = make([][]atomic.Uint32, cfg.Ranks)
	for r := range cfg.Ranks {
		m.hdr[r] = make([]atomic.Uint32, cfg.Variant.parts()*cfg.Ranks*cfg.Blocks)
		m.recv[r] = make([]atomic.Uint32, cfg.Variant.parts()*cfg.Ranks*cfg.Elems)
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
				if n := summed.Load(); n != int64(m.calls[k].elems) {
					m.run.fail(fmt.Errorf("protomodel: push: rank %d call %d summed %d of %d elements: the grid-stride loop misses some", rank, k, n, m.calls[k].elems))
					return
				}
			}
		})
	}
	ranks.Wait()
	end()
	st, err := m.run.result()
	if err == nil {
		m.mu.Lock()
		// block 0 alone checks headers: every mismatch is reported by it, once
		err = compareReports("push call headers ("+cfg.Headers.String()+")", m.reports, cfg.Mismatches, cfg.Ranks, cfg.Rounds)
		m.mu.Unlock()
	}
	return st, err
}

// data draws every call's inputs and computes the expected sums.
func (m *pushModel) data() error {
	cfg := m.cfg
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xda7a))
	m.calls = make([]pushCall, cfg.Rounds)
	for k := range m.calls {
		c := &m.calls[k]
		c.threads = 1 + rng.IntN(cfg.Threads)
		limit := cfg.Elems
		if rng.IntN(2) == 0 {
			limit = min(limit, cfg.Blocks*c.threads)
		}
		c.elems = 1 + rng.IntN(limit)
		if cfg.Fused && rng.IntN(2) == 0 {
			// rows of hvec elements; a row over pieces blocks only where every block has at
			// most one piece (rows*pieces <= Blocks), as the host launches it
			c.hvec = 1 + rng.IntN(cfg.Elems)
			rows := 1 + rng.IntN(cfg.Elems/c.hvec)
			c.elems = rows * c.hvec
			c.pieces = 1
			if p := 1 + rng.IntN(4); rows*p <= cfg.Blocks {
				c.pieces = p
			}
		}
	}
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

// pushOp is one memory access of a modelled push thread, in program order.
type pushOp struct {
	kind pushOpKind
	// rank is the buffer's owner (a send's destination, else the own rank);
	// part, src and elem name the slot.
	rank, part, src, elem int
}

type pushOpKind int

const (
	opSend        pushOpKind = iota // store the element to slot (part, src = own rank) of rank
	opReceive                       // poll slot (part, src) until non-zero and add it (src ws-1 checks the sum)
	opRearm                         // store zero to the own slot (part, src)
	opHeaderSend                    // store the call header to header[elem = block] of slot (part, src = own rank) of rank
	opHeaderCheck                   // poll own header[block] of slot (part, src) until non-zero, compare it
	opHeaderRearm                   // store zero to own header[block] of slot (part, src)
)

// pushThread is one modelled thread of a push block: its accesses, in order.
type pushThread struct {
	ops []pushOp
	pos int
	acc float32
}

// threadOps lists thread th's accesses in call k as the kernel makes them:
// the sends, the deferred re-arm of the previous call's part at the indices
// that call gave this block (pending: its {elems, threads}, zero if none),
// then every receive, each followed by its re-arm unless this call defers.
// Lane s < ws of block 0 also sends the call header to rank s after its sends,
// and checks and re-arms rank s's header after its receives (the model's blocks
// may have fewer threads than ranks, where a lane does only that).
func (m *pushModel) threadOps(rank, b, th int, call pushCall, part, prev int, pending pushCall, deferred bool) []pushOp {
	ws := m.cfg.Ranks
	var mine []int
	if th < call.threads {
		mine = threadElems(b, th, m.cfg.Blocks, call.threads, call.elems)
	}
	var ops []pushOp
	for _, i := range mine {
		for r := range ws {
			ops = append(ops, pushOp{opSend, r, part, rank, i})
		}
	}
	if th < ws && b == 0 {
		ops = append(ops, pushOp{opHeaderSend, th, part, rank, b})
	}
	for j := th; th < call.threads && j < pending.threads; j += call.threads {
		for _, i := range threadElems(b, j, m.cfg.Blocks, pending.threads, pending.elems) {
			for s := range ws {
				ops = append(ops, pushOp{opRearm, rank, prev, s, i})
			}
		}
	}
	recv := mine
	if call.fused() {
		recv = nil
		if th < call.threads {
			recv = fusedElems(b, th, m.cfg.Blocks, call)
		}
	}
	for _, i := range recv {
		for s := range ws {
			ops = append(ops, pushOp{opReceive, rank, part, s, i})
		}
		if !deferred {
			for s := range ws {
				ops = append(ops, pushOp{opRearm, rank, part, s, i})
			}
		}
	}
	if th < ws && b == 0 {
		ops = append(ops, pushOp{opHeaderCheck, rank, part, th, b})
		if m.cfg.Headers != HeadersNotRearmed {
			ops = append(ops, pushOp{opHeaderRearm, rank, part, th, b})
		}
	}
	return ops
}

// fusedElems lists the elements thread th of block b receives in a fused push call:
// a row has T = pieces*threads virtual threads, vt taking the row's elements vt,
// vt+T, ..; block b takes piece b mod pieces (vt = piece*threads + th) of row b /
// pieces, and with one piece rows b, b+blocks, ...
func fusedElems(b, th, blocks int, c pushCall) []int {
	rows, T := c.elems/c.hvec, c.pieces*c.threads
	vt := (b%c.pieces)*c.threads + th
	var elems []int
	for row := b / c.pieces; row < rows; row += blocks {
		for vi := vt; vi < c.hvec; vi += T {
			elems = append(elems, row*c.hvec+vi)
		}
		if c.pieces > 1 {
			break
		}
	}
	return elems
}

// block runs block b of rank for call k: one kernel block of the push
// algorithm, its threads' steps interleaved in a random order. It returns the
// number of elements it summed.
func (m *pushModel) block(rank, b, k int, j *jitter) (summed int) {
	cfg := m.cfg
	call := m.calls[k]
	own := m.recv[rank]
	// Every thread reads the block's part and pending re-arm at the start;
	// they only change at the end of the block, after the bar.sync.
	parts := cfg.Variant.parts()
	part := int(m.sig[rank][pushEpochWord(b)].Load())
	prev := (part + parts - 1) % parts
	pending := pushCall{
		elems:   int(m.sig[rank][pushPendingWord(b, 0)].Load()),
		threads: int(m.sig[rank][pushPendingWord(b, 1)].Load()),
	}
	// the kernel's rule: defer when every thread has at most one element (the fused
	// push never defers)
	deferred := cfg.Variant.defers() && call.elems <= cfg.Blocks*call.threads && !call.fused()
	for p := range cfg.Ranks {
		if m.done[p][b].Load() < int64(k) {
			m.run.ahead.Add(1)
			break
		}
	}

	var running []*pushThread
	for th := range max(call.threads, cfg.Ranks) {
		if ops := m.threadOps(rank, b, th, call, part, prev, pending, deferred); len(ops) > 0 {
			running = append(running, &pushThread{ops: ops})
		}
	}
	for len(running) > 0 {
		if m.run.stopped() {
			for _, th := range running {
				switch op := th.ops[th.pos]; op.kind {
				case opReceive:
					m.run.blocked(Wait{
						Rank: rank, Block: b, Peer: op.src,
						Slot:  fmt.Sprintf("receive part %d source %d element %d", op.part, op.src, op.elem),
						Holds: own[m.slot(op.part, op.src, op.elem)].Load(),
					})
				case opHeaderCheck:
					m.run.blocked(Wait{
						Rank: rank, Block: b, Peer: op.src,
						Slot:  fmt.Sprintf("header[%d] of part %d source %d", b, op.part, op.src),
						Holds: m.hdr[rank][m.header(op.part, op.src, b)].Load(),
					})
				}
			}
			return summed
		}
		x := j.rng.IntN(len(running))
		th := running[x]
		op := th.ops[th.pos]
		switch op.kind {
		case opSend:
			// +0.0 would read as "not arrived", so it travels as -0.0.
			v := m.in[k][rank][op.elem]
			if v == 0 {
				v = 1 << 31
			}
			m.recv[op.rank][m.slot(op.part, op.src, op.elem)].Store(v)
		case opReceive:
			// Poll sources in rank order; all-zero bits = not arrived.
			v := own[m.slot(op.part, op.src, op.elem)].Load()
			if v == 0 {
				j.idle()
				continue
			}
			f := math.Float32frombits(v)
			if op.src == 0 {
				th.acc = f
			} else {
				th.acc = float32(th.acc + f)
			}
			if op.src == cfg.Ranks-1 {
				if got, want := math.Float32bits(th.acc), m.want[k][op.elem]; got != want {
					m.run.fail(fmt.Errorf("protomodel: %w: %v push: rank %d block %d call %d element %d: got %s, want %s",
						ErrWrongSum, cfg.Variant, rank, b, k, op.elem, ref.Format(dtype.Float32, uint64(got)), ref.Format(dtype.Float32, uint64(want))))
					return summed
				}
				summed++
				m.run.progress.Add(1)
			}
		case opRearm:
			own[m.slot(op.part, op.src, op.elem)].Store(0)
		case opHeaderSend:
			m.hdr[op.rank][m.header(op.part, op.src, b)].Store(m.headerValue(k, rank))
		case opHeaderCheck:
			v := m.hdr[rank][m.header(op.part, op.src, b)].Load()
			if v == 0 {
				j.idle()
				continue
			}
			if v != m.headerValue(k, rank) {
				m.mu.Lock()
				m.reports = append(m.reports, callReport{rank, b, op.src, k})
				m.mu.Unlock()
			}
		case opHeaderRearm:
			m.hdr[rank][m.header(op.part, op.src, b)].Store(0)
		}
		if th.pos++; th.pos == len(th.ops) {
			running = append(running[:x], running[x+1:]...)
		}
		j.pause()
	}
	// After the block's bar.sync, thread 0 moves the block to the next part
	// and records what the next call must re-arm.
	m.sig[rank][pushEpochWord(b)].Store(uint32((part + 1) % parts))
	if deferred {
		m.sig[rank][pushPendingWord(b, 0)].Store(uint32(call.elems))
		m.sig[rank][pushPendingWord(b, 1)].Store(uint32(call.threads))
	} else {
		m.sig[rank][pushPendingWord(b, 0)].Store(0)
		m.sig[rank][pushPendingWord(b, 1)].Store(0)
	}
	m.done[rank][b].Add(1)
	m.run.rounds.Add(1)
	return summed
}
