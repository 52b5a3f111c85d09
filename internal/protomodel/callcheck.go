package protomodel

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/ptx"
)

// CallVariant selects the call check a barrier model runs with its barriers: none, the
// kernels' protocol, or a broken one that the model must catch.
type CallVariant int

const (
	// NoCallCheck runs the barriers alone.
	NoCallCheck CallVariant = iota
	// CallChecked is the one-shot and two-shot kernels' check, in block 0 alone: barriers
	// pair up into calls (entry, then exit or middle). At block 0's entry barrier lane 0
	// publishes the rank's call into call as ptx.CallWords tagged with its round, four word
	// stores that land late and in any order (no fence orders them before the arrival).
	// After the barrier lane t of block 0 loads rank t's four words one by one; before its
	// next arrival it compares them with its own call tagged with its round: equal passes,
	// another tag in any word loads again, the same tags with other bits is a mismatch.
	CallChecked
	// CallUntagged is deliberately broken: the words carry no round, so a peer's words of
	// its previous call, still visible, count as its call: a false mismatch whenever two
	// consecutive calls differ.
	CallUntagged
	// CallLate is deliberately broken: the lane loads and tests rank t's call only after
	// its next barrier, when rank t may have published its next call: the round is never
	// found again (a deadlock).
	CallLate
	// CallHalves is the check a one-shot without an exit barrier would need: every barrier
	// is a call's entry, and lane 0 publishes into one of two sets of words, the one the
	// parity of the round picks; lane t loads rank t's words of that set after the barrier
	// and tests them before the block's next arrival, as CallChecked. Rank t publishes its
	// next call into the other set, and the one after only once this rank has arrived at
	// the next barrier, after its test.
	CallHalves
	// CallOneSet is deliberately broken: every barrier a call's entry, as CallHalves, but
	// one set of words, so rank t may publish its next call over the one this rank's lane
	// has not loaded yet: its round is never found again (a deadlock) or, with differing
	// calls, a report of the wrong call.
	CallOneSet
)

// perBarrier reports whether every barrier is a call's entry (no exit barrier).
func (v CallVariant) perBarrier() bool { return v == CallHalves || v == CallOneSet }

// half is the set of call words a call of round val uses: the parity of val with
// CallHalves, else the one set.
func (v CallVariant) half(val uint32) int {
	if v == CallHalves {
		return int(val & 1)
	}
	return 0
}

// String names the variant.
func (v CallVariant) String() string {
	switch v {
	case NoCallCheck:
		return "none"
	case CallChecked:
		return "checked"
	case CallUntagged:
		return "untagged"
	case CallLate:
		return "late"
	case CallHalves:
		return "halves"
	case CallOneSet:
		return "one-set"
	}
	return fmt.Sprintf("CallVariant(%d)", int(v))
}

// modelCall is the fingerprint rank makes for call c: the calls change from one call to the
// next (so stale words differ from fresh ones), and rank c%ranks makes another call when c
// is in mismatches.
func modelCall(c, rank, ranks int, mismatches []int) uint64 {
	count := uint64(1000 + c%3)
	if rank == c%ranks && slices.Contains(mismatches, c) {
		count += 7
	}
	return ptx.Call{Op: ptx.OpAllReduce, Algo: ptx.OneShot, DType: dtype.BFloat16, Count: count}.Fingerprint()
}

// publisher is lane 0's publication of the call into call of its own signal region (block
// 0's): the four word stores are pending until drain lets each through at a random later
// step of the block, so that peers see them late, partly, and after the block's arrival.
type publisher struct {
	own     *signal
	rng     *rand.Rand
	fp      uint64
	variant CallVariant
	pending []pendingStore
}

type pendingStore struct {
	word  int
	value uint32
}

// publish queues the words of fp tagged with round val.
func (p *publisher) publish(val uint32) {
	w := ptx.CallWords(p.fp, uint16(val))
	if p.variant == CallUntagged {
		for i := range w {
			w[i] &= 0xFFFF
		}
	}
	h := p.variant.half(val)
	for _, i := range p.rng.Perm(4) {
		p.pending = append(p.pending, pendingStore{callWord(4*h + i), w[i]})
	}
}

// flush lands every pending store: the kernel's end, which makes its writes visible.
func (p *publisher) flush() {
	for _, st := range p.pending {
		p.own[st.word].Store(st.value)
	}
	p.pending = p.pending[:0]
}

// drain lets each pending store reach memory with probability 1/4.
func (p *publisher) drain() {
	kept := p.pending[:0]
	for _, st := range p.pending {
		if p.rng.IntN(4) == 0 {
			p.own[st.word].Store(st.value)
			continue
		}
		kept = append(kept, st)
	}
	p.pending = kept
}

// callReport is one mismatch a call check reported: rank's lane peer, block b, call c.
type callReport struct {
	rank, block, peer, call int
}

// callChecker is the call check of one run.
type callChecker struct {
	m          *barrier
	variant    CallVariant
	mismatches []int
	mu         sync.Mutex
	reports    []callReport
}

// load reads rank t's call of round val word by word (from the set of words val picks),
// with the block's delays between the words (a vector load that may see a store land in
// between). The lane of the own rank (t == rank) also sees its block's pending stores: in
// the kernel the entry barrier's bar.red orders thread 0's store before every lane's load
// after it.
func (cc *callChecker) load(rank, t int, val uint32, j *jitter, pub *publisher) [4]uint32 {
	var w [4]uint32
	h := cc.variant.half(val)
	for i := range w {
		w[i] = cc.m.sig[t][callWord(4*h+i)].Load()
		if t == rank {
			for _, st := range pub.pending {
				if st.word == callWord(4*h+i) {
					w[i] = st.value
				}
			}
		}
		j.pause()
	}
	return w
}

// verdict is the kernels' test (calldiff): 0 equal, 1 load again, 2 mismatch.
func (cc *callChecker) verdict(loaded, want [4]uint32) int {
	var x uint32
	for i := range loaded {
		x |= loaded[i] ^ want[i]
	}
	switch {
	case x == 0:
		return 0
	case x&0xFFFF0000 != 0:
		return 1
	}
	return 2
}

// check runs lane t's test of call c of rank (in block 0) against the loaded words, loading
// again while rank t's words of round val are not all visible. It returns false when the run
// stopped.
func (cc *callChecker) check(rank, t, c int, val uint32, loaded [4]uint32, j *jitter, pub *publisher) bool {
	want := ptx.CallWords(modelCall(c, rank, len(cc.m.sig), cc.mismatches), uint16(val))
	if cc.variant == CallUntagged {
		for i := range want {
			want[i] &= 0xFFFF
		}
	}
	reloaded := false
	for {
		switch cc.verdict(loaded, want) {
		case 0:
			return true
		case 2:
			cc.mu.Lock()
			cc.reports = append(cc.reports, callReport{rank, 0, t, c})
			cc.mu.Unlock()
			return true
		}
		if !reloaded {
			reloaded = true
			cc.m.run.unpub.Add(1)
		}
		if cc.m.run.stopped() {
			h := cc.variant.half(val)
			cc.m.run.blocked(Wait{Rank: rank, Block: 0, Peer: t, Slot: fmt.Sprintf("call of rank %d", t),
				Want: want[0], Holds: cc.m.sig[t][callWord(4*h)].Load()})
			return false
		}
		j.idle()
		loaded = cc.load(rank, t, val, j, pub)
	}
}

// result compares the reports with the mismatches the run made (see compareReports): block
// 0's, the one block that checks.
func (cc *callChecker) result(ranks, calls int) error {
	cc.mu.Lock()
	got := slices.Clone(cc.reports)
	cc.mu.Unlock()
	return compareReports("call check ("+cc.variant.String()+")", got, cc.mismatches, ranks, calls)
}

// compareReports checks the mismatches a run reported against those it made in its first
// calls calls: every rank pair with different calls reported by both ranks in block 0 (the
// one block that checks), and nothing else.
func compareReports(what string, got []callReport, mismatches []int, ranks, calls int) error {
	var want []callReport
	for _, c := range mismatches {
		if c >= calls {
			continue
		}
		odd := c % ranks
		for r := range ranks {
			if r == odd {
				continue
			}
			want = append(want, callReport{r, 0, odd, c}, callReport{odd, 0, r, c})
		}
	}
	cmp := func(a, b callReport) int {
		for _, d := range [][2]int{{a.call, b.call}, {a.rank, b.rank}, {a.block, b.block}, {a.peer, b.peer}} {
			if d[0] != d[1] {
				return d[0] - d[1]
			}
		}
		return 0
	}
	slices.SortFunc(want, cmp)
	slices.SortFunc(got, cmp)
	for _, g := range got {
		if _, found := slices.BinarySearchFunc(want, g, cmp); !found {
			return fmt.Errorf("protomodel: %w: %s: rank %d block %d reported rank %d in call %d", ErrFalseMismatch, what, g.rank, g.block, g.peer, g.call)
		}
	}
	for _, w := range want {
		if _, found := slices.BinarySearchFunc(got, w, cmp); !found {
			return fmt.Errorf("protomodel: %w: %s: rank %d block %d did not report rank %d in call %d", ErrMissedMismatch, what, w.rank, w.block, w.peer, w.call)
		}
	}
	return nil
}
