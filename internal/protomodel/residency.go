package protomodel

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// TriggerRule says which grids let the next kernel of their stream launch before their last
// wait on a peer (ptx.FlagEarlyTrigger) in a residency run.
type TriggerRule int

const (
	// EarlyWhereRoom is goccl's rule: a grid carries the flag when ptx.EarlyTriggerRoom
	// allows its size (the caller passes that room in ResidencyConfig.Room).
	EarlyWhereRoom TriggerRule = iota
	// LateOnly never sets the flag: every kernel triggers when it exits.
	LateOnly
	// EarlyAlways sets the flag on every grid: the broken rule for SendFirst kernels, which
	// the model must catch deadlocking once ranks share the GPU tightly. With every call
	// EntryFirst it is safe (see EarlyAfterEntry).
	EarlyAlways
	// EarlyAfterEntry sets the flag on every EntryFirst and Local grid, whatever its size,
	// and on the SendFirst grids that EarlyWhereRoom allows. An EntryFirst kernel triggers
	// only once every one of its blocks is past the entry barrier, so block b of every rank's
	// same call is resident, for every b: the next kernel's blocks can no longer keep any
	// rank's current kernel from becoming resident, and the current kernels finish without
	// another slot. A Local kernel triggers once every one of its blocks is resident and past
	// griddepcontrol.wait, and those blocks finish without waiting for anything.
	EarlyAfterEntry
)

// String names the rule.
func (r TriggerRule) String() string {
	switch r {
	case EarlyWhereRoom:
		return "early where room"
	case LateOnly:
		return "late only"
	case EarlyAlways:
		return "early always"
	case EarlyAfterEntry:
		return "early after entry"
	}
	return fmt.Sprintf("TriggerRule(%d)", int(r))
}

// KernelKind says where a kernel's early trigger sits, which decides what its blocks have
// made sure of when the next kernel of the stream may launch.
type KernelKind int

const (
	// SendFirst is the push kernel: it triggers early just past griddepcontrol.wait (after
	// its sends), before any wait on a peer, so a triggered kernel says nothing about its
	// peers' blocks being resident.
	SendFirst KernelKind = iota
	// EntryFirst is one-shot, direct two-shot and the fused kernels: they trigger early after
	// their entry barrier (block b of every rank has arrived, so is resident), then wait on
	// their peers again at the exit barrier. The push kernel without the early flag is one
	// too: it triggers once a thread's first vector has arrived from every rank, which came
	// from block b of every rank (every rank splits the message alike), and its later
	// receives are the exit wait; when the message is smaller than its grid, its last blocks
	// have no vector and wait for no peer (ResidencyConfig.Idle).
	EntryFirst
	// Local is a kernel of one rank that waits on no peer: the residual add + RMSNorm of the
	// unfused pair, between two all-reduces. Its early trigger sits just past
	// griddepcontrol.wait, as SendFirst's, but nothing it does afterwards waits for another
	// block, so EarlyAfterEntry lets it trigger early at any grid.
	Local
)

// String names the kind.
func (k KernelKind) String() string {
	switch k {
	case SendFirst:
		return "send first"
	case EntryFirst:
		return "entry first"
	case Local:
		return "local"
	}
	return fmt.Sprintf("KernelKind(%d)", int(k))
}

// ResidencyConfig is one run of the residency model.
type ResidencyConfig struct {
	// Ranks share one GPU that holds Slots resident blocks (SMs times blocks per SM).
	Ranks, Slots int
	// Grids is the block count of every call, in call order; every rank makes the same
	// calls, as the kernels' per-block barriers require.
	Grids []int
	// Kinds is the kernel kind of every call, parallel to Grids; the calls past its end
	// (all of them when it is nil) are SendFirst, the kind the model had before EntryFirst.
	Kinds []KernelKind
	// Idle is the number of idle blocks of every call, parallel to Grids; the calls past its
	// end (all of them when it is nil) have none. Call k's idle blocks are its last ones,
	// Grids[k]-Idle[k] to Grids[k]-1, on every rank alike (the same call has the same shape
	// everywhere): they wait for no peer, so they pass griddepcontrol.wait and exit, and
	// trigger only by exiting, whatever the rule. Only EntryFirst calls have them, and block
	// 0 never is one (the kernels always give it work): 0 <= Idle[k] <= Grids[k]-1.
	Idle []int
	// PDL launches every kernel with programmatic stream serialization.
	PDL bool
	// Rule and Room decide which grids trigger early: with EarlyWhereRoom, those of at most
	// Room blocks; with EarlyAfterEntry, those and every EntryFirst grid.
	Rule TriggerRule
	Room int
	// Seed drives the scheduler's choices.
	Seed uint64
}

// ResidencyStats says what a residency run exercised.
type ResidencyStats struct {
	// Overlaps counts the blocks placed on the GPU while the same rank's previous kernel
	// was still there: the situation the trigger rule is about.
	Overlaps int
	// EarlyOverlaps[k] counts the blocks of call k placed while a block of the same rank's
	// call k-1 had not yet passed its last wait on a peer: only an early trigger of call k-1
	// allows that, so tests can tell which calls' early triggers a run exercised.
	EarlyOverlaps []int
	// IdleLags counts the blocks placed while another rank still had an idle block of an
	// earlier call not resident: a rank that moved on then competes for slots with a lagging
	// rank's idle block, which nothing waits for but which needs a slot to exit, and which
	// its own rank's next kernel waits for before it can launch.
	IdleLags int
}

// Stages of one block in the residency model, in order: a block only moves forward, and a
// wait on peers compares their stages with one of these. A SendFirst block goes from
// stageAtPeer straight to stagePastPeer (its waits on peers folded into one); an EntryFirst
// block passes stageEntered between its entry and its exit barrier; an idle block goes from
// stageWaitPrev straight to stagePastPeer, and triggers only at stageDone.
const (
	stagePending  = iota // launched or not, not on the GPU
	stageWaitPrev        // resident, in griddepcontrol.wait
	stageAtPeer          // past the wait (and SendFirst's early trigger), waiting for its peers
	stageEntered         // EntryFirst: past the entry barrier (and the early trigger), at the exit barrier
	stagePastPeer        // past its last wait on a peer (and the late trigger), still resident
	stageDone            // exited; its slot is free
)

// residency is the state of one run: which calls each rank's host has queued, which kernels
// have launched, and where each block is.
type residency struct {
	cfg      ResidencyConfig
	issued   []int       // calls queued by each rank's host
	live     []int       // each rank's first call not yet exited: those before have no moves
	launched [][]bool    // [rank][call]
	stage    [][][]uint8 // [rank][call][block]
	used     int         // resident blocks
	stats    ResidencyStats
}

// Residency runs the forward-progress side of PDL on a shared GPU, which Barrier, Push and
// OneShot leave out (they assume every block runs). Each rank queues its calls' kernels on its
// own stream; a kernel launches when its predecessor has exited (without PDL) or when every
// block of the predecessor has triggered (with PDL: early, where its kind puts the early
// trigger, or late, past its last wait on peers). A launched kernel's blocks take a free slot
// each, in any order; a block passes griddepcontrol.wait once the previous kernel of its
// stream has exited, then waits until the same block of every rank has got that far. A
// SendFirst block, whose early trigger is just past griddepcontrol.wait (the earliest any
// kernel triggers), folds its waits on peers into that one; an EntryFirst block calls it the
// entry barrier, triggers early past it, and waits again at the exit barrier until the same
// block of every rank is past the entry barrier. A Local block triggers past
// griddepcontrol.wait too, and waits for no one. An idle block (ResidencyConfig.Idle) waits
// for no peer and triggers only by exiting. Then the block exits, some steps later. Every
// step takes one enabled transition at random, hosts queuing calls included, so one rank can
// run ahead while another's host lags. A run ends when every block has exited, or with an
// error wrapping ErrDeadlock when blocks are left and no transition is enabled (the error
// says which kernels hold the slots and which cannot get one).
func Residency(cfg ResidencyConfig) (ResidencyStats, error) {
	if cfg.Ranks < 1 || cfg.Ranks > MaxRanks {
		return ResidencyStats{}, fmt.Errorf("protomodel: %d ranks: want 1 to %d", cfg.Ranks, MaxRanks)
	}
	if len(cfg.Grids) == 0 {
		return ResidencyStats{}, fmt.Errorf("protomodel: no calls: give Grids at least one block count")
	}
	for k, g := range cfg.Grids {
		if g < 1 || g > MaxBlocks || g > cfg.Slots {
			return ResidencyStats{}, fmt.Errorf("protomodel: call %d has %d blocks: want 1 to min(%d, Slots %d)", k, g, MaxBlocks, cfg.Slots)
		}
	}
	if len(cfg.Kinds) > len(cfg.Grids) {
		return ResidencyStats{}, fmt.Errorf("protomodel: %d kinds for %d calls: want at most one a call", len(cfg.Kinds), len(cfg.Grids))
	}
	for k, kind := range cfg.Kinds {
		if kind != SendFirst && kind != EntryFirst && kind != Local {
			return ResidencyStats{}, fmt.Errorf("protomodel: call %d has kind %v: want SendFirst, EntryFirst or Local", k, kind)
		}
	}
	if len(cfg.Idle) > len(cfg.Grids) {
		return ResidencyStats{}, fmt.Errorf("protomodel: idle blocks for %d calls, %d calls: want at most one count a call", len(cfg.Idle), len(cfg.Grids))
	}
	m := &residency{cfg: cfg, issued: make([]int, cfg.Ranks), live: make([]int, cfg.Ranks)}
	for k, n := range cfg.Idle {
		switch {
		case n < 0 || n > cfg.Grids[k]-1:
			return ResidencyStats{}, fmt.Errorf("protomodel: call %d has %d idle blocks of %d: want 0 to %d (block 0 always has work)", k, n, cfg.Grids[k], cfg.Grids[k]-1)
		case n > 0 && cfg.kind(k) != EntryFirst:
			return ResidencyStats{}, fmt.Errorf("protomodel: call %d has %d idle blocks but is %v: only EntryFirst calls have idle blocks (the push kernel has them without its early flag, when it triggers after its first receive)", k, n, cfg.kind(k))
		}
	}
	m.stats.EarlyOverlaps = make([]int, len(cfg.Grids))
	for range cfg.Ranks {
		m.launched = append(m.launched, make([]bool, len(cfg.Grids)))
		calls := make([][]uint8, len(cfg.Grids))
		for k, g := range cfg.Grids {
			calls[k] = make([]uint8, g)
		}
		m.stage = append(m.stage, calls)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))
	var moves []move
	for {
		moves = m.moves(moves)
		if len(moves) == 0 {
			if m.finished() {
				return m.stats, nil
			}
			return m.stats, m.deadlock()
		}
		m.take(moves[rng.IntN(len(moves))])
	}
}

// kind is call k's kernel kind: SendFirst past the end of Kinds.
func (c *ResidencyConfig) kind(k int) KernelKind {
	if k < len(c.Kinds) {
		return c.Kinds[k]
	}
	return SendFirst
}

// idleBlocks is call k's number of idle blocks: 0 past the end of Idle.
func (c *ResidencyConfig) idleBlocks(k int) int {
	if k < len(c.Idle) {
		return c.Idle[k]
	}
	return 0
}

// early says whether the rule lets call k's grid trigger its dependents early (with PDL).
func (c *ResidencyConfig) early(k int) bool {
	switch c.Rule {
	case EarlyAlways:
		return true
	case EarlyWhereRoom:
		return c.Grids[k] <= c.Room
	case EarlyAfterEntry:
		return c.kind(k) != SendFirst || c.Grids[k] <= c.Room
	}
	return false
}

// kind is call k's kernel kind.
func (m *residency) kind(k int) KernelKind { return m.cfg.kind(k) }

// idle says whether block b of call k is idle: one of its last Idle[k] blocks.
func (m *residency) idle(k, b int) bool {
	return b >= m.cfg.Grids[k]-m.cfg.idleBlocks(k)
}

// early says whether call k's grid triggers its dependents early.
func (m *residency) early(k int) bool { return m.cfg.early(k) }

// triggerStage is the stage from which a block of call k that is not idle has let its
// dependents launch (an idle block lets them launch only by exiting: triggered).
func (m *residency) triggerStage(k int) uint8 {
	switch {
	case !m.early(k):
		return stagePastPeer
	case m.kind(k) == EntryFirst:
		return stageEntered
	}
	return stageAtPeer
}

// exited says whether every block of rank r's call k has exited.
func (m *residency) exited(r, k int) bool {
	for _, s := range m.stage[r][k] {
		if s != stageDone {
			return false
		}
	}
	return true
}

// triggered says whether every block of rank r's call k has let its dependents launch. An
// idle block has only when it has exited, whatever the rule: a grid's dependents launch once
// each of its blocks has triggered or completed, and an idle block reaches no trigger (its
// kind's early trigger sits after a receive it does not make).
func (m *residency) triggered(r, k int) bool {
	at := m.triggerStage(k)
	for b, s := range m.stage[r][k] {
		if s < at || s < stageDone && m.idle(k, b) {
			return false
		}
	}
	return true
}

// waiting says whether a block of rank r's call k has not yet passed its last wait on a peer
// (idle blocks wait on none).
func (m *residency) waiting(r, k int) bool {
	for b, s := range m.stage[r][k] {
		if s < stagePastPeer && !m.idle(k, b) {
			return true
		}
	}
	return false
}

// idleLag says whether a rank other than r has an idle block of a call before k not yet
// resident (for ResidencyStats.IdleLags).
func (m *residency) idleLag(r, k int) bool {
	for p := range m.cfg.Ranks {
		if p == r {
			continue
		}
		for j := m.live[p]; j < k && j < len(m.cfg.Idle); j++ {
			for b := m.cfg.Grids[j] - m.cfg.Idle[j]; b < m.cfg.Grids[j]; b++ {
				if m.stage[p][j][b] == stagePending {
					return true
				}
			}
		}
	}
	return false
}

// mayLaunch says whether rank r's queued call k can launch now.
func (m *residency) mayLaunch(r, k int) bool {
	switch {
	case k == 0:
		return true
	case !m.launched[r][k-1]:
		return false
	case m.cfg.PDL:
		return m.triggered(r, k-1)
	}
	return m.exited(r, k-1)
}

// move is one transition of a residency run: a rank's host queuing its next call, a queued
// kernel launching, or a block moving on to stage to (taking a slot into stageWaitPrev,
// freeing it into stageDone). Moves are values, not closures, since a run lists them at
// every step.
type move struct {
	op      uint8 // moveIssue, moveLaunch or moveBlock
	r, k, b int   // rank, call, block (moveIssue uses r only, moveLaunch r and k)
	to      uint8 // moveBlock's stage
}

// Ops of a move.
const (
	moveIssue = iota
	moveLaunch
	moveBlock
)

// moves lists the transitions enabled now into buf, reusing its storage.
func (m *residency) moves(buf []move) []move {
	moves := buf[:0]
	for r := range m.cfg.Ranks {
		if m.issued[r] < len(m.cfg.Grids) {
			moves = append(moves, move{op: moveIssue, r: r})
		}
		for k := m.live[r]; k < m.issued[r]; k++ {
			if !m.launched[r][k] {
				if m.mayLaunch(r, k) {
					moves = append(moves, move{op: moveLaunch, r: r, k: k})
				}
				continue
			}
			prevExited := k == 0 || m.exited(r, k-1)
			for b, s := range m.stage[r][k] {
				to := uint8(stagePending)
				switch {
				case s == stagePending && m.used < m.cfg.Slots:
					to = stageWaitPrev
				case s == stageWaitPrev && prevExited && m.idle(k, b):
					// An idle block waits for no peer: past griddepcontrol.wait it
					// is past every wait. Block b is idle on every rank alike, and
					// peersAt only compares block b of every rank, so no block that is
					// not idle ever waits on an idle one.
					to = stagePastPeer
				case s == stageWaitPrev && prevExited:
					to = stageAtPeer
				case s == stageAtPeer && m.kind(k) == Local:
					// No wait on a peer: past griddepcontrol.wait (and the early
					// trigger), the block runs to its end.
					to = stagePastPeer
				case s == stageAtPeer && m.kind(k) == EntryFirst && m.peersAt(k, b, stageAtPeer):
					// The entry barrier: block b of every rank is resident and past
					// griddepcontrol.wait.
					to = stageEntered
				case s == stageAtPeer && m.peersAt(k, b, stageAtPeer):
					to = stagePastPeer
				case s == stageEntered && m.peersAt(k, b, stageEntered):
					// The exit barrier: block b of every rank is past the entry barrier.
					// Its blocks are all resident already, so this wait needs no slot.
					to = stagePastPeer
				case s == stagePastPeer:
					to = stageDone
				}
				if to != stagePending {
					moves = append(moves, move{op: moveBlock, r: r, k: k, b: b, to: to})
				}
			}
		}
	}
	return moves
}

// take makes move mv, which moves listed as enabled.
func (m *residency) take(mv move) {
	r, k := mv.r, mv.k
	switch mv.op {
	case moveIssue:
		m.issued[r]++
	case moveLaunch:
		m.launched[r][k] = true
	case moveBlock:
		switch mv.to {
		case stageWaitPrev:
			m.used++
			if k > 0 && !m.exited(r, k-1) {
				m.stats.Overlaps++
			}
			if k > 0 && m.waiting(r, k-1) {
				m.stats.EarlyOverlaps[k]++
			}
			if m.idleLag(r, k) {
				m.stats.IdleLags++
			}
		case stageDone:
			m.used--
		}
		m.stage[r][k][mv.b] = mv.to
		for m.live[r] < len(m.cfg.Grids) && m.exited(r, m.live[r]) {
			m.live[r]++
		}
	}
}

// peersAt says whether block b of call k of every rank has got to stage at or past it:
// stageAtPeer, past griddepcontrol.wait; stageEntered, past the entry barrier.
func (m *residency) peersAt(k, b int, at uint8) bool {
	for p := range m.cfg.Ranks {
		if m.stage[p][k][b] < at {
			return false
		}
	}
	return true
}

func (m *residency) finished() bool {
	for r := range m.cfg.Ranks {
		if m.issued[r] < len(m.cfg.Grids) || !m.exited(r, len(m.cfg.Grids)-1) {
			return false
		}
	}
	return true
}

// deadlock describes a stuck run: what holds the slots and what is launched without one
// (with each call's kind where the config gives kinds).
func (m *residency) deadlock() error {
	var holding, pending []string
	for r := range m.cfg.Ranks {
		for k := range m.issued[r] {
			var resident, waiting int
			for _, s := range m.stage[r][k] {
				switch s {
				case stageWaitPrev, stageAtPeer, stageEntered, stagePastPeer:
					resident++
				case stagePending:
					waiting++
				}
			}
			call := fmt.Sprintf("rank %d call %d", r, k)
			switch {
			case m.cfg.idleBlocks(k) > 0:
				call += fmt.Sprintf(" (%v, %d idle)", m.kind(k), m.cfg.idleBlocks(k))
			case m.cfg.Kinds != nil:
				call += fmt.Sprintf(" (%v)", m.kind(k))
			}
			if resident > 0 {
				holding = append(holding, fmt.Sprintf("%s: %d blocks", call, resident))
			}
			if waiting > 0 && m.launched[r][k] {
				pending = append(pending, fmt.Sprintf("%s: %d blocks", call, waiting))
			}
		}
	}
	return fmt.Errorf("protomodel: %w: %d ranks, %d slots, rule %v: nothing can move; %d slots held (%s); launched but not resident: %s",
		ErrDeadlock, m.cfg.Ranks, m.cfg.Slots, m.cfg.Rule, m.used, strings.Join(holding, ", "), strings.Join(pending, ", "))
}
