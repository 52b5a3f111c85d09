package topology

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccl/goccl/internal/atomicfile"
)

// peerCache is the file holding peer-check results for one driver version and one set of
// GPUs. Results are keyed by bus id, so a CUDA_VISIBLE_DEVICES that only reorders the same
// GPUs reuses them. The set is named by bus ids and UUIDs both: bus ids name slots, so
// another host with the same boards (a cache folder on a shared home) or a GPU replaced in
// its slot has the same bus ids, and must not take this set's verdicts.
type peerCache struct {
	path    string
	driver  string
	devices []string // sorted bus ids
	uuids   []string // the GPUs' UUIDs, in the order of devices
}

// cacheFile is the JSON stored on disk.
type cacheFile struct {
	Driver  string        `json:"driver"`
	Devices []string      `json:"devices"`
	UUIDs   []string      `json:"uuids"`
	Checked time.Time     `json:"checked"`
	Results []cacheResult `json:"results"`
}

type cacheResult struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Error string `json:"error,omitempty"`
}

// driverKey names the driver in the cache: NVML's full version when known (a driver update
// within one CUDA version can change peer behaviour), else CUDA's.
func (t *Topology) driverKey() string {
	if t.NVMLDriver != "" {
		return t.NVMLDriver
	}
	return "cuda" + strconv.Itoa(t.CUDADriver)
}

// openCache names t's cache file under dir ("" = the user cache dir); it does not read it.
func (t *Topology) openCache(dir string) (*peerCache, error) {
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("no user cache directory (set Options.CacheDir): %w", err)
		}
		dir = filepath.Join(base, "goccl")
	}
	gpus := slices.Clone(t.GPUs)
	slices.SortFunc(gpus, func(a, b GPU) int { return strings.Compare(a.BusID, b.BusID) })
	devices, uuids := make([]string, len(gpus)), make([]string, len(gpus))
	for i, g := range gpus {
		devices[i], uuids[i] = g.BusID, g.UUID
	}
	sum := sha256.Sum256([]byte(strings.Join(devices, ",") + ";" + strings.Join(uuids, ",")))
	driver := t.driverKey()
	safe := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r == '.' {
			return r
		}
		return '_'
	}, driver)
	name := fmt.Sprintf("p2p-%s-%x.json", safe, sum[:8])
	return &peerCache{path: filepath.Join(dir, name), driver: driver, devices: devices, uuids: uuids}, nil
}

// load reads the cache; nil, nil when there is none yet.
func (c *peerCache) load() (*cacheFile, error) {
	b, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f cacheFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w (delete it, or set %s=1 or Options.Force to check again)", c.path, err, RecheckEnv)
	}
	// The name is only a hash: make sure the file is about these GPUs and this driver.
	if f.Driver != c.driver || !slices.Equal(f.Devices, c.devices) || !slices.Equal(f.UUIDs, c.uuids) {
		return nil, fmt.Errorf("%s: written for driver %s and GPUs %v (%v), not %s and %v (%v)",
			c.path, f.Driver, f.Devices, f.UUIDs, c.driver, c.devices, c.uuids)
	}
	return &f, nil
}

// applyCached fills the checks of pairs from f; false (t unchanged) when f lacks one.
func (t *Topology) applyCached(f *cacheFile, pairs []Pair) bool {
	type key struct{ from, to string }
	res := make(map[key]string, len(f.Results))
	for _, r := range f.Results {
		res[key{r.From, r.To}] = r.Error
	}
	checks := make([]Check, len(pairs))
	for k, p := range pairs {
		e, ok := res[key{t.GPUs[p.From].BusID, t.GPUs[p.To].BusID}]
		if !ok {
			return false
		}
		checks[k] = Check{Ran: true, Err: e}
	}
	for k, p := range pairs {
		t.Links[p.From][p.To].Check = checks[k]
	}
	return true
}

// save writes the checks of pairs, atomically so that a concurrent Discover never reads half
// a file.
func (c *peerCache) save(t *Topology, pairs []Pair) error {
	f := cacheFile{Driver: c.driver, Devices: c.devices, UUIDs: c.uuids, Checked: time.Now().UTC()}
	for _, p := range pairs {
		f.Results = append(f.Results, cacheResult{
			From:  t.GPUs[p.From].BusID,
			To:    t.GPUs[p.To].BusID,
			Error: t.Links[p.From][p.To].Check.Err,
		})
	}
	b, err := json.MarshalIndent(&f, "", "  ")
	if err != nil {
		return err
	}
	// The file is private to its user, as os.CreateTemp made it before.
	return atomicfile.Write(c.path, ".p2p-*.tmp", append(b, '\n'), 0o600)
}
