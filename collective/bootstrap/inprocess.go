package bootstrap

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// NewInProcess returns one Bootstrap per rank for ranks that are goroutines of one process
// (collective.NewGroup). Rank r is result[r]; give each to its own goroutine. AllGatherFDs hands
// every other rank duplicates (dup) of the descriptors, so each rank owns and closes its own.
//
// A failure of one rank (a timeout, a mismatched call, Close) fails the waiting calls of all
// the others at once, with the cause.
func NewInProcess(size int) ([]Bootstrap, error) {
	switch {
	case size < 1:
		return nil, fmt.Errorf("bootstrap: in-process group of %d ranks: need at least 1", size)
	case size > MaxRanks:
		return nil, fmt.Errorf("bootstrap: in-process group of %d ranks is larger than the %d a bootstrap forms", size, MaxRanks)
	}
	g := &group{size: size, rounds: make(map[uint64]*round), failed: make(chan struct{})}
	boots := make([]Bootstrap, size)
	for r := range boots {
		boots[r] = &inProcess{g: g, rank: r}
	}
	return boots, nil
}

// group is the state the ranks of one NewInProcess share.
type group struct {
	size   int
	mu     sync.Mutex
	rounds map[uint64]*round // by call number; a round lives until every rank took its result
	failed chan struct{}     // closed when cause is set
	cause  error             // first failure of any rank; the group is dead after it
}

// round is one call, made by every rank.
type round struct {
	kind    kind
	first   int // the rank that made this call first, named in mismatch errors
	nfds    int
	arrived []bool
	count   int
	blobs   [][]byte
	dups    [][][]int // dups[receiver][sender], made when the sender arrives: it may close its fds as soon as its call returns
	claimed int
	done    chan struct{} // closed when count == size
}

func (g *group) newRound(k kind, first, nfds int) *round {
	rd := &round{
		kind: k, first: first, nfds: nfds,
		arrived: make([]bool, g.size),
		blobs:   make([][]byte, g.size),
		dups:    make([][][]int, g.size),
		done:    make(chan struct{}),
	}
	for r := range rd.dups {
		rd.dups[r] = make([][]int, g.size)
	}
	return rd
}

// failLocked records the group's first failure, wakes every waiting rank and closes the
// duplicates of rounds that can no longer complete (nobody will claim them).
func (g *group) failLocked(cause error) {
	if g.cause != nil {
		return
	}
	g.cause = cause
	close(g.failed)
	for seq, rd := range g.rounds {
		if rd.count == g.size {
			continue // complete: its ranks take their results despite the failure
		}
		for _, bySender := range rd.dups {
			for _, d := range bySender {
				closeFDs(d)
			}
		}
		delete(g.rounds, seq)
	}
}

func (rd *round) missing() []int {
	var m []int
	for r, ok := range rd.arrived {
		if !ok {
			m = append(m, r)
		}
	}
	return m
}

type inProcess struct {
	g      *group
	rank   int
	mu     sync.Mutex // serialises this rank's calls
	seq    uint64
	closed atomic.Bool
}

func (b *inProcess) Rank() int { return b.rank }
func (b *inProcess) Size() int { return b.g.size }

func (b *inProcess) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rd, err := b.exchange(ctx, kindAllGather, mine, nil)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(rd.blobs))
	for r, blob := range rd.blobs {
		out[r] = cloneBlob(blob)
	}
	b.claim(rd)
	return out, nil
}

func (b *inProcess) AllGatherFDs(ctx context.Context, fds []int) ([][]int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rd, err := b.exchange(ctx, kindAllGatherFDs, nil, fds)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(rd.dups[b.rank])
	out[b.rank] = slices.Clone(fds)
	b.claim(rd)
	return out, nil
}

func (b *inProcess) Barrier(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	rd, err := b.exchange(ctx, kindBarrier, nil, nil)
	if err != nil {
		return err
	}
	b.claim(rd)
	return nil
}

// Close fails the group: the other ranks' calls return ErrPeerLost naming this rank.
func (b *inProcess) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.g.mu.Lock()
	b.g.failLocked(fmt.Errorf("rank %d closed its bootstrap: %w", b.rank, ErrPeerLost))
	b.g.mu.Unlock()
	return nil
}

// exchange deposits this rank's part of the next call and waits until every rank has
// deposited its part, the group fails, or ctx ends. It returns the complete round.
func (b *inProcess) exchange(ctx context.Context, k kind, blob []byte, fds []int) (*round, error) {
	g := b.g
	b.seq++
	seq := b.seq
	if b.closed.Load() {
		return nil, callError(b.rank, k, seq, ErrClosed)
	}

	g.mu.Lock()
	if g.cause != nil {
		g.mu.Unlock()
		return nil, callError(b.rank, k, seq, g.cause)
	}
	if err := ctx.Err(); err != nil {
		// Depositing nothing: the call fails for every rank, as it would over a socket.
		g.failLocked(fmt.Errorf("rank %d: context ended before the call: %w", b.rank, err))
		g.mu.Unlock()
		return nil, callError(b.rank, k, seq, g.cause)
	}
	if err := checkArgs(g.size, blob, fds); err != nil {
		g.failLocked(fmt.Errorf("rank %d: %w", b.rank, err))
		g.mu.Unlock()
		return nil, callError(b.rank, k, seq, g.cause)
	}
	rd := g.rounds[seq]
	if rd == nil {
		rd = g.newRound(k, b.rank, len(fds))
		g.rounds[seq] = rd
	}
	if err := b.deposit(rd, k, blob, fds); err != nil {
		g.failLocked(err)
		g.mu.Unlock()
		return nil, callError(b.rank, k, seq, err)
	}
	g.mu.Unlock()

	start := time.Now()
	select {
	case <-rd.done:
	case <-g.failed:
	case <-ctx.Done():
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	if rd.count == g.size {
		return rd, nil // complete, even if the group failed or ctx ended since
	}
	if g.cause == nil {
		g.failLocked(fmt.Errorf("rank %d %w", b.rank,
			timeoutError(ctx, time.Since(start), fmt.Sprintf("ranks %v to make this call", rd.missing()))))
	}
	if b.closed.Load() {
		return nil, callError(b.rank, k, seq, fmt.Errorf("%w during the call", ErrClosed))
	}
	return nil, callError(b.rank, k, seq, g.cause)
}

// deposit adds this rank's part to rd; g.mu is held.
func (b *inProcess) deposit(rd *round, k kind, blob []byte, fds []int) error {
	switch {
	case rd.kind != k:
		return fmt.Errorf("rank %d called %s where rank %d called %s: %w", b.rank, k, rd.first, rd.kind, ErrMismatch)
	case len(fds) != rd.nfds:
		return fmt.Errorf("rank %d passed %d fds where rank %d passed %d fds: %w", b.rank, len(fds), rd.first, rd.nfds, ErrMismatch)
	}
	made := make([][]int, b.g.size)
	for r := range made {
		if r == b.rank || len(fds) == 0 {
			continue
		}
		d, err := dupFDs(fds)
		if err != nil {
			for _, m := range made {
				closeFDs(m)
			}
			return fmt.Errorf("rank %d: %w", b.rank, err)
		}
		made[r] = d
	}
	for r, d := range made {
		rd.dups[r][b.rank] = d
	}
	rd.blobs[b.rank] = cloneBlob(blob)
	rd.arrived[b.rank] = true
	rd.count++
	if rd.count == b.g.size {
		close(rd.done)
	}
	return nil
}

// claim marks this rank's result as taken; the last rank to take it forgets the round.
func (b *inProcess) claim(rd *round) {
	b.g.mu.Lock()
	defer b.g.mu.Unlock()
	rd.claimed++
	if rd.claimed == b.g.size {
		delete(b.g.rounds, b.seq)
	}
}
