package topology

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"

	"github.com/goccl/goccl/driver"
)

// GPU is what is known of one GPU this process can use.
type GPU struct {
	// Ordinal is the CUDA device number, after CUDA_VISIBLE_DEVICES narrowed and reordered
	// the list; it indexes Topology.GPUs and Topology.Links.
	Ordinal int
	Name    string
	// UUID is "GPU-" and the 16 UUID bytes in the 8-4-4-4-12 form nvidia-smi prints.
	UUID string
	// BusID is the PCI bus id in CUDA's form, lower case: "0000:19:00.0". It is the key that
	// matches CUDA's and NVML's views of a GPU.
	BusID string
	// SMs is the number of streaming multiprocessors.
	SMs int
	// Major and Minor are the compute capability (9.0 for H100/H200).
	Major, Minor int
	// NVMLIndex is NVML's (and nvidia-smi's) number for the GPU, -1 without NVML facts.
	// It is the PCI order, not the CUDA ordinal.
	NVMLIndex int
}

// Link is what is known of the path from one GPU to another (or to itself, on the diagonal
// of Topology.Links).
type Link struct {
	// CanAccessPeer is cuDeviceCanAccessPeer: whether CUDA offers to map the other GPU's
	// memory. True on the diagonal.
	CanAccessPeer bool
	// NVML holds NVML's facts, nil on the diagonal and when NVML is unavailable.
	NVML *NVMLLink
	// Check is the result of the real peer check (see Options.CheckP2P).
	Check Check
}

// NVMLLink is NVML's view of a pair of distinct GPUs.
type NVMLLink struct {
	// Read, Write, NVLink and Atomics are nvmlDeviceGetP2PStatus for those capabilities.
	Read, Write, NVLink, Atomics P2PStatus
	// NVLinks is the number of active NVLinks between the two, counting those through
	// NVSwitches as nvidia-smi does (NV18 between any two H100s of an HGX board).
	NVLinks int
	// Level is the closest common ancestor on the PCIe/system tree.
	Level Level
}

// Check is the result of writing random data from one GPU into another's memory through the
// peer mapping and reading it back.
type Check struct {
	// Ran is false when the check was not run: Options.CheckP2P off, or CUDA offers no peer
	// access between the two.
	Ran bool
	// Err says why the check failed; "" when it passed.
	Err string
}

// Passed reports whether the check ran and the data arrived intact.
func (c Check) Passed() bool { return c.Ran && c.Err == "" }

// CheckSource says where the peer-check results came from.
type CheckSource int

const (
	// CheckNotRun: Options.CheckP2P was off.
	CheckNotRun CheckSource = iota
	// CheckRunNow: the checks ran during Discover.
	CheckRunNow
	// CheckFromCache: an earlier run's results, for the same driver and GPUs, read from
	// Topology.CachePath. Options.Force or GOCCL_P2P_RECHECK=1 runs them again.
	CheckFromCache
)

// String says it in words, as Render prints it.
func (s CheckSource) String() string {
	switch s {
	case CheckRunNow:
		return "run now"
	case CheckFromCache:
		return "from cache"
	}
	return "not run"
}

// Topology is which GPUs this process sees, how they are linked and whether peer access
// between them works. It is a snapshot: build it with Discover, read it from any goroutine.
type Topology struct {
	// CUDADriver is cuDriverGetVersion, e.g. 12040 for CUDA 12.4.
	CUDADriver int
	// NVMLDriver is the kernel driver version, e.g. "550.54.15"; "" without NVML.
	NVMLDriver string
	// GPUs by CUDA ordinal.
	GPUs []GPU
	// Links[i][j] is the path from GPU i to GPU j (i == j: the GPU with itself).
	Links [][]Link
	// HasNVML is false when NVML could not be used: then only CUDA's facts are known
	// (Notes say why) and NVLink counts and PCIe levels are unknown.
	HasNVML bool
	// PeerCheck says where Links[i][j].Check came from; CachePath is the cache file used
	// (read or written), "" when none.
	PeerCheck CheckSource
	CachePath string
	// Notes are the things that went wrong without failing discovery (NVML missing, cache
	// not writable), one sentence each.
	Notes []string
}

// Options tunes Discover.
type Options struct {
	// CheckP2P runs the real peer check for every ordered pair of GPUs (and each GPU with
	// itself), or takes the results from the cache.
	CheckP2P bool
	// Force ignores cached peer-check results: the checks run again and replace the cache.
	// GOCCL_P2P_RECHECK=1 in the environment (RecheckEnv) does the same for programs that
	// do not set Options, such as every communicator of package collective.
	Force bool
	// CacheDir is where peer-check results are kept; "" means os.UserCacheDir()/goccl.
	CacheDir string
	// Timeout bounds each pair's peer check; 0 means DefaultCheckTimeout.
	Timeout time.Duration
	// NVML is the management library; nil uses the build's default (a purego binding of
	// libnvidia-ml, or go-nvml under the goccl_nvml_cgo build tag).
	NVML NVML
	// CUDA is the CUDA side; nil uses package driver.
	CUDA CUDA
}

// DefaultCheckTimeout bounds one pair's peer check. The copy takes microseconds; the rest is
// module load and allocation. A pair that needs longer is hanging.
const DefaultCheckTimeout = 10 * time.Second

// Pair is an ordered pair of CUDA ordinals: From writes into To's memory.
type Pair struct{ From, To int }

// CUDA is the CUDA side of discovery: the devices this process sees and what the driver says
// of them. The default (Options.CUDA nil) asks the driver through package driver; tests pass
// a fake.
type CUDA interface {
	// DriverVersion is cuDriverGetVersion.
	DriverVersion() (int, error)
	// GPUs lists the visible GPUs by ordinal (NVMLIndex is not filled in).
	GPUs() ([]GPU, error)
	// CanAccessPeer is cuDeviceCanAccessPeer(from, to).
	CanAccessPeer(from, to int) (bool, error)
	// CheckPeers runs the peer check for each pair, each bounded by timeout, and returns one
	// error per pair (nil: passed). A verdict against the link (data that arrived wrong, or
	// peer access the driver offered and then refused) wraps ErrPeerCheckFailed; any other
	// failure (a timeout, a fault, out of memory, ctx done) fails the pair without wrapping
	// it, and is not cached. The last error is for what belongs to no pair: releasing what
	// the checks used.
	CheckPeers(ctx context.Context, pairs []Pair, timeout time.Duration) ([]error, error)
}

// ErrPeerCheckFailed marks a verdict against a link: data written through the peer mapping
// was checked and came back wrong, or the driver refused peer access it had offered. Only
// such verdicts are cached; a check that timed out or failed in any other way is not one,
// even if it wraps ErrPeerCheckFailed, and runs again in the next Discover.
var ErrPeerCheckFailed = errors.New("peer check failed")

// RecheckEnv is the environment variable that makes Discover ignore cached peer-check results
// and check again, like Options.Force: "1" (or any strconv.ParseBool true) re-checks, "" or
// "0" uses the cache. Errors that come from a cached verdict name it.
const RecheckEnv = "GOCCL_P2P_RECHECK"

// isVerdict says whether a pair's check error is a verdict worth caching: it wraps
// ErrPeerCheckFailed and is not a timeout. The timeout test holds whatever a CUDA
// implementation marked: a check that ran out of time learned nothing about the link.
func isVerdict(err error) bool {
	return errors.Is(err, ErrPeerCheckFailed) &&
		!errors.Is(err, driver.ErrTimeout) &&
		!errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, context.Canceled)
}

// recheckRequested reads RecheckEnv.
func recheckRequested() (bool, error) {
	v := os.Getenv(RecheckEnv)
	if v == "" {
		return false, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("topology: %s=%q is not understood: set it to 1 to check peer access again (ignoring the cache), or to 0 or nothing to use the cache", RecheckEnv, v)
	}
	return on, nil
}

// Discover finds the GPUs this process sees and how they are linked. CUDA is required (its
// absence is an error from package driver, e.g. driver.ErrNoDriver); NVML is optional: without
// it the topology holds CUDA's facts only and Notes say why. With opts.CheckP2P it also
// checks every pair for real, or reuses cached results for the same driver and GPU set
// (unless opts.Force, or RecheckEnv is set). The peer checks leave peer access enabled in the
// devices' primary contexts.
func Discover(ctx context.Context, opts Options) (*Topology, error) {
	cu := opts.CUDA
	if cu == nil {
		cu = driverCUDA{}
	}
	ver, err := cu.DriverVersion()
	if err != nil {
		return nil, fmt.Errorf("topology: CUDA driver version: %w", err)
	}
	gpus, err := cu.GPUs()
	if err != nil {
		return nil, fmt.Errorf("topology: list CUDA devices: %w", err)
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("topology: CUDA sees no GPU (CUDA_VISIBLE_DEVICES=%q)", os.Getenv("CUDA_VISIBLE_DEVICES"))
	}
	t := &Topology{CUDADriver: ver, GPUs: gpus, Links: make([][]Link, len(gpus))}
	for i := range t.GPUs {
		g := &t.GPUs[i]
		bus, ok := NormalizeBusID(g.BusID)
		if !ok {
			return nil, fmt.Errorf("topology: GPU %d: CUDA gave an unreadable PCI bus id %q", i, g.BusID)
		}
		g.Ordinal, g.BusID, g.NVMLIndex = i, bus, -1
		t.Links[i] = make([]Link, len(gpus))
		for j := range t.Links[i] {
			can := i == j
			if !can {
				if can, err = cu.CanAccessPeer(i, j); err != nil {
					return nil, fmt.Errorf("topology: can GPU %d access GPU %d: %w", i, j, err)
				}
			}
			t.Links[i][j].CanAccessPeer = can
		}
	}

	nv := opts.NVML
	if nv == nil {
		nv = defaultNVML()
	}
	if err := t.addNVML(nv); err != nil {
		t.note("NVML unavailable, CUDA facts only (NVLink and PCIe levels unknown): %v", err)
	}

	if opts.CheckP2P {
		recheck, err := recheckRequested()
		if err != nil {
			return nil, err
		}
		opts.Force = opts.Force || recheck
		if err := t.checkPeers(ctx, cu, opts); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// note records a non-fatal problem.
func (t *Topology) note(format string, args ...any) {
	t.Notes = append(t.Notes, fmt.Sprintf(format, args...))
}

// pairs is every ordered pair worth checking: each GPU with itself, and each pair CUDA offers
// peer access for.
func (t *Topology) pairs() []Pair {
	var ps []Pair
	for i := range t.Links {
		for j, l := range t.Links[i] {
			if l.CanAccessPeer {
				ps = append(ps, Pair{From: i, To: j})
			}
		}
	}
	return ps
}

// checkPeers fills Links[i][j].Check from the cache or by running the checks.
func (t *Topology) checkPeers(ctx context.Context, cu CUDA, opts Options) error {
	pairs := t.pairs()
	c, err := t.openCache(opts.CacheDir)
	if err != nil {
		t.note("peer-check cache disabled: %v", err)
	}
	if c != nil {
		t.CachePath = c.path
		if !opts.Force {
			cached, err := c.load()
			if err != nil {
				t.note("peer-check cache ignored: %v", err)
			} else if cached != nil && t.applyCached(cached, pairs) {
				t.PeerCheck = CheckFromCache
				return nil
			}
		}
	}

	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	errs, cleanupErr := cu.CheckPeers(ctx, pairs, timeout)
	if cleanupErr != nil {
		t.note("after the peer check: %v", cleanupErr)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("topology: peer check interrupted: %w", err)
	}
	if len(errs) != len(pairs) {
		return fmt.Errorf("topology: peer check returned %d results for %d pairs", len(errs), len(pairs))
	}
	conclusive := true
	for k, p := range pairs {
		chk := Check{Ran: true}
		if errs[k] != nil {
			chk.Err = errs[k].Error()
			conclusive = conclusive && isVerdict(errs[k])
		}
		t.Links[p.From][p.To].Check = chk
	}
	t.PeerCheck = CheckRunNow
	switch {
	case c == nil:
	case !conclusive:
		// An older file (read past with Force, or incomplete) holds results this run could
		// not confirm: it goes too, so that the next Discover checks again.
		err := os.Remove(c.path)
		switch {
		case err == nil:
			t.note("peer-check results not cached, and the earlier ones in %s removed: a check ended without a verdict on the link (it timed out or failed for another reason); the next Discover checks again", c.path)
		case errors.Is(err, fs.ErrNotExist):
			t.note("peer-check results not cached: a check ended without a verdict on the link (it timed out or failed for another reason); the next Discover checks again")
		default:
			t.note("peer-check results not cached: a check ended without a verdict on the link; the earlier results in %s could not be removed (%v): delete the file, or set %s=1", c.path, err, RecheckEnv)
		}
	default:
		if err := c.save(t, pairs); err != nil {
			// An older file must not outlive results that replace it.
			rerr := os.Remove(c.path)
			if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				t.note("peer-check results not cached: %v; the earlier results in %s could not be removed either (%v): delete the file, or set %s=1", err, c.path, rerr, RecheckEnv)
			} else {
				t.note("peer-check results not cached: %v", err)
			}
		}
	}
	return nil
}
