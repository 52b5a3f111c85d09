package protomodel

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// TriggerRule says which grids let the next kernel of their stream launch before their wait
// on a peer (ptx.FlagEarlyTrigger) in a residency run.
type TriggerRule int

const (
	// EarlyWhereRoom is goccl's rule: a grid carries the flag when ptx.EarlyTriggerRoom
	// allows its size (the caller passes that room in ResidencyConfig.Room).
	EarlyWhereRoom TriggerRule = iota
	// LateOnly never sets the flag: every kernel triggers when it exits.
	LateOnly
	// EarlyAlways sets the flag on every grid: the broken rule, which the model must catch
	// deadlocking once ranks share the GPU tightly.
	EarlyAlways
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
	}
	return fmt.Sprintf("TriggerRule(%d)", int(r))
}

// ResidencyConfig is one run of the residency model.
type ResidencyConfig struct {
	// Ranks share one GPU that holds Slots resident blocks (SMs times blocks per SM).
	Ranks, Slots int
	// Grids is the block count of every call, in call order; every rank makes the same
	// calls, as the kernels' per-block barriers require.
	Grids []int
	// PDL launches every kernel with programmatic stream serialization.
	PDL bool
	// Rule and Room decide which grids trigger early: with EarlyWhereRoom, those of at most
	// Room blocks.
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
}

// Stages of one block in the residency model.
const (
	stagePending  = iota // launched or not, not on the GPU
	stageWaitPrev        // resident, in griddepcontrol.wait
	stageAtPeer          // past the wait (and the early trigger), waiting for its peers
	stagePastPeer        // past its last wait on a peer (and the late trigger), still resident
	stageDone            // exited; its slot is free
)

// residency is the state of one run: which calls each rank's host has queued, which kernels
// have launched, and where each block is.
type residency struct {
	cfg      ResidencyConfig
	issued   []int       // calls queued by each rank's host
	launched [][]bool    // [rank][call]
	stage    [][][]uint8 // [rank][call][block]
	used     int         // resident blocks
	stats    ResidencyStats
}

// Residency runs the forward-progress side of PDL on a shared GPU, which Barrier, Push and
// OneShot leave out (they assume every block runs). Each rank queues its calls' kernels on its
// own stream; a kernel launches when its predecessor has exited (without PDL) or when every
// block of the predecessor has triggered (with PDL: early, just past griddepcontrol.wait, the
// earliest any kernel triggers, or late, past its wait on peers). A launched kernel's blocks
// take a free slot each, in any order; a block passes griddepcontrol.wait once the previous
// kernel of its stream has exited, then waits until the same block of every rank has got that
// far (the kernels' waits on peers, folded into one), then exits, some steps later. Every
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
	m := &residency{cfg: cfg, issued: make([]int, cfg.Ranks)}
	for range cfg.Ranks {
		m.launched = append(m.launched, make([]bool, len(cfg.Grids)))
		calls := make([][]uint8, len(cfg.Grids))
		for k, g := range cfg.Grids {
			calls[k] = make([]uint8, g)
		}
		m.stage = append(m.stage, calls)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))
	for {
		moves := m.moves()
		if len(moves) == 0 {
			if m.finished() {
				return m.stats, nil
			}
			return m.stats, m.deadlock()
		}
		moves[rng.IntN(len(moves))]()
	}
}

// early says whether call k's grid triggers its dependents early.
func (m *residency) early(k int) bool {
	switch m.cfg.Rule {
	case EarlyAlways:
		return true
	case EarlyWhereRoom:
		return m.cfg.Grids[k] <= m.cfg.Room
	}
	return false
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

// triggered says whether every block of rank r's call k has let its dependents launch.
func (m *residency) triggered(r, k int) bool {
	for _, s := range m.stage[r][k] {
		if s < stagePastPeer && !(m.early(k) && s >= stageAtPeer) {
			return false
		}
	}
	return true
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

// moves lists the transitions enabled now, each as a function that takes it.
func (m *residency) moves() []func() {
	var moves []func()
	for r := range m.cfg.Ranks {
		if m.issued[r] < len(m.cfg.Grids) {
			moves = append(moves, func() { m.issued[r]++ })
		}
		for k := range m.issued[r] {
			if !m.launched[r][k] {
				if m.mayLaunch(r, k) {
					moves = append(moves, func() { m.launched[r][k] = true })
				}
				continue
			}
			for b, s := range m.stage[r][k] {
				switch {
				case s == stagePending && m.used < m.cfg.Slots:
					moves = append(moves, func() {
						m.stage[r][k][b] = stageWaitPrev
						m.used++
						if k > 0 && !m.exited(r, k-1) {
							m.stats.Overlaps++
						}
					})
				case s == stageWaitPrev && (k == 0 || m.exited(r, k-1)):
					moves = append(moves, func() { m.stage[r][k][b] = stageAtPeer })
				case s == stageAtPeer && m.peersAt(k, b):
					moves = append(moves, func() { m.stage[r][k][b] = stagePastPeer })
				case s == stagePastPeer:
					moves = append(moves, func() {
						m.stage[r][k][b] = stageDone
						m.used--
					})
				}
			}
		}
	}
	return moves
}

// peersAt says whether block b of call k of every rank has passed griddepcontrol.wait.
func (m *residency) peersAt(k, b int) bool {
	for p := range m.cfg.Ranks {
		if m.stage[p][k][b] < stageAtPeer {
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

// deadlock describes a stuck run: what holds the slots and what is launched without one.
func (m *residency) deadlock() error {
	var holding, pending []string
	for r := range m.cfg.Ranks {
		for k := range m.issued[r] {
			var resident, waiting int
			for _, s := range m.stage[r][k] {
				switch s {
				case stageWaitPrev, stageAtPeer, stagePastPeer:
					resident++
				case stagePending:
					waiting++
				}
			}
			if resident > 0 {
				holding = append(holding, fmt.Sprintf("rank %d call %d: %d blocks", r, k, resident))
			}
			if waiting > 0 && m.launched[r][k] {
				pending = append(pending, fmt.Sprintf("rank %d call %d: %d blocks", r, k, waiting))
			}
		}
	}
	return fmt.Errorf("protomodel: %w: %d ranks, %d slots, rule %v: nothing can move; %d slots held (%s); launched but not resident: %s",
		ErrDeadlock, m.cfg.Ranks, m.cfg.Slots, m.cfg.Rule, m.used, strings.Join(holding, ", "), strings.Join(pending, ", "))
}
