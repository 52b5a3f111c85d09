package topology

import (
	"errors"
	"fmt"
	"slices"
)

// ErrNotEligible is matched (errors.Is) by every *PolicyError: the GPUs cannot run the custom
// all-reduce, and the caller should use another backend.
var ErrNotEligible = errors.New("custom all-reduce not usable on these GPUs")

// PolicyOptions relaxes CheckCustomAllReduce.
type PolicyOptions struct {
	// AllowNonNVLink accepts more than two GPUs without a full NVLink mesh. Over PCIe every
	// rank reads from every other through the shared root complex, which is usually slower
	// than NCCL's ring beyond two GPUs; correctness is unaffected.
	AllowNonNVLink bool
}

// PolicyError says which pair of GPUs rules the custom all-reduce out, and why.
type PolicyError struct {
	// From and To are CUDA ordinals; From writes into To's memory.
	From, To int
	// FromBus and ToBus are their PCI bus ids.
	FromBus, ToBus string
	Reason         string
	// Cache is the peer-check cache file the verdict was read from, "" when the verdict
	// does not come from a cache. A cached verdict can be stale (a driver or firmware fix
	// under the same version): Force or RecheckEnv checks again.
	Cache string
}

// Error names both GPUs, by ordinal and bus id, and the reason; for a cached verdict also
// the cache file and how to check again.
func (e *PolicyError) Error() string {
	s := fmt.Sprintf("custom all-reduce not usable between GPU %d (%s) and GPU %d (%s): %s",
		e.From, e.FromBus, e.To, e.ToBus, e.Reason)
	if e.Cache != "" {
		s += fmt.Sprintf(" (verdict cached in %s by an earlier check; to check again set %s=1 in the environment or topology.Options.Force, or delete the file)",
			e.Cache, RecheckEnv)
	}
	return s
}

// Unwrap makes errors.Is(err, ErrNotEligible) true.
func (e *PolicyError) Unwrap() error { return ErrNotEligible }

// CheckCustomAllReduce says whether ranks on these GPUs (CUDA ordinals, one per rank, in rank
// order) may use the custom all-reduce: every pair of distinct GPUs needs CUDA peer access and
// a passing peer check in both directions (each GPU with itself too), and more than two
// distinct GPUs need an NVLink between every pair unless opts.AllowNonNVLink. A device
// repeated (virtual ranks on one GPU) needs nothing. The error is a *PolicyError naming the
// first offending pair, or a plain error for ordinals this topology does not know.
func (t *Topology) CheckCustomAllReduce(ordinals []int, opts PolicyOptions) error {
	if len(ordinals) == 0 {
		return errors.New("topology: CheckCustomAllReduce: no ranks")
	}
	for r, o := range ordinals {
		if o < 0 || o >= len(t.GPUs) {
			return fmt.Errorf("topology: rank %d is on GPU %d, but only GPUs 0..%d are visible", r, o, len(t.GPUs)-1)
		}
	}
	gpus := slices.Clone(ordinals)
	slices.Sort(gpus)
	gpus = slices.Compact(gpus)
	if len(gpus) == 1 {
		return nil
	}

	fail := func(a, b int, format string, args ...any) *PolicyError {
		return &PolicyError{From: a, To: b, FromBus: t.GPUs[a].BusID, ToBus: t.GPUs[b].BusID,
			Reason: fmt.Sprintf(format, args...)}
	}
	for _, a := range gpus {
		for _, b := range gpus {
			l := t.Links[a][b]
			switch {
			case !l.CanAccessPeer:
				return fail(a, b, "CUDA reports no peer access (cuDeviceCanAccessPeer)")
			case !l.Check.Ran:
				return fail(a, b, "peer access not verified (run Discover with CheckP2P)")
			case l.Check.Err != "":
				pe := fail(a, b, "peer check failed: %s", l.Check.Err)
				if t.PeerCheck == CheckFromCache {
					pe.Cache = t.CachePath
				}
				return pe
			}
		}
	}
	if len(gpus) <= 2 || opts.AllowNonNVLink {
		return nil
	}
	for x, a := range gpus {
		for _, b := range gpus[x+1:] {
			n := t.Links[a][b].NVML
			switch {
			case n == nil:
				return fail(a, b, "NVLink unknown without NVML, and %d GPUs need a full NVLink mesh (AllowNonNVLink accepts PCIe)", len(gpus))
			case n.NVLinks == 0:
				return fail(a, b, "no NVLink (path %s), and %d GPUs need a full NVLink mesh (AllowNonNVLink accepts PCIe)", n.Level, len(gpus))
			}
		}
	}
	return nil
}
