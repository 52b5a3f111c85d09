package topology

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// The cache tests expect the cache to be used: a GOCCL_P2P_RECHECK=1 left in the developer's
// shell would turn every Discover into a re-check. Tests that want it set it themselves.
func init() { os.Unsetenv(RecheckEnv) }

// fakeNVML is an NVML whose GPUs and links a test lays out.
type fakeNVML struct {
	initErr error
	driver  string
	devs    []*fakeDev
	// p2p answers P2PStatus; nil: every capability OK.
	p2p func(a, b *fakeDev, c P2PCap) P2PStatus
	// level answers CommonAncestor; nil: LevelSystem.
	level     func(a, b *fakeDev) Level
	inits     int
	shutdowns int
}

// fakeDev is one fake NVML GPU. links[k] is the far end (an NVML-style bus id) of active
// link k; link numbers past len(links) do not exist.
type fakeDev struct {
	f     *fakeNVML
	uuid  string
	bus   string
	links []string
}

func (f *fakeNVML) add(uuid, bus string, links ...string) *fakeDev {
	d := &fakeDev{f: f, uuid: uuid, bus: bus, links: links}
	f.devs = append(f.devs, d)
	return d
}

func (f *fakeNVML) Init() error {
	f.inits++
	return f.initErr
}

func (f *fakeNVML) Shutdown() error {
	f.shutdowns++
	return nil
}

func (f *fakeNVML) DriverVersion() (string, error) { return f.driver, nil }
func (f *fakeNVML) DeviceCount() (int, error)      { return len(f.devs), nil }

func (f *fakeNVML) DeviceByIndex(i int) (NVMLDevice, error) {
	if i < 0 || i >= len(f.devs) {
		return nil, &NVMLError{Op: "nvmlDeviceGetHandleByIndex_v2", Code: NVMLErrorInvalidArgument}
	}
	return f.devs[i], nil
}

func (d *fakeDev) UUID() (string, error)     { return d.uuid, nil }
func (d *fakeDev) PCIBusID() (string, error) { return d.bus, nil }

func (d *fakeDev) P2PStatus(peer NVMLDevice, c P2PCap) (P2PStatus, error) {
	if d.f.p2p == nil {
		return P2POK, nil
	}
	return d.f.p2p(d, peer.(*fakeDev), c), nil
}

func (d *fakeDev) NVLinkActive(link int) (bool, error) {
	if link >= len(d.links) {
		return false, &NVMLError{Op: "nvmlDeviceGetNvLinkState", Code: NVMLErrorInvalidArgument}
	}
	return d.links[link] != "", nil
}

func (d *fakeDev) NVLinkRemoteBusID(link int) (string, error) { return d.links[link], nil }

func (d *fakeDev) CommonAncestor(peer NVMLDevice) (Level, error) {
	if d.f.level == nil {
		return LevelSystem, nil
	}
	return d.f.level(d, peer.(*fakeDev)), nil
}

// fakeCUDA is a CUDA view a test lays out; it records the peer checks asked of it.
type fakeCUDA struct {
	version  int
	gpus     []GPU
	noPeer   map[Pair]bool
	checkErr map[Pair]error
	// cleanupErr is CheckPeers' error outside any pair.
	cleanupErr error
	checked    [][]Pair
}

func (c *fakeCUDA) DriverVersion() (int, error) { return c.version, nil }

func (c *fakeCUDA) GPUs() ([]GPU, error) {
	return append([]GPU(nil), c.gpus...), nil
}

func (c *fakeCUDA) CanAccessPeer(from, to int) (bool, error) {
	return !c.noPeer[Pair{from, to}], nil
}

func (c *fakeCUDA) CheckPeers(ctx context.Context, pairs []Pair, timeout time.Duration) ([]error, error) {
	c.checked = append(c.checked, pairs)
	errs := make([]error, len(pairs))
	for k, p := range pairs {
		errs[k] = c.checkErr[p]
	}
	return errs, c.cleanupErr
}

// h100 is a CUDA GPU fact as the driver reports it.
func h100(uuid, bus string) GPU {
	return GPU{Name: "NVIDIA H100 80GB HBM3", UUID: uuid, BusID: bus, SMs: 132, Major: 9, Minor: 0}
}

// fakeUUID is a stable UUID for GPU k.
func fakeUUID(k int) string { return fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", k, k) }

// requireEnv returns the value of a tool variable, skipping when it is unset, except where
// GOCCL_REQUIRE_TOOLS=1 (CI) makes that a failure.
func requireEnv(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("GOCCL_REQUIRE_TOOLS") == "1" {
			t.Fatalf("%s is not set but GOCCL_REQUIRE_TOOLS=1 (run: eval \"$(scripts/fetch-tools.sh)\")", name)
		}
		t.Skipf("%s not set (run: eval \"$(scripts/fetch-tools.sh)\")", name)
	}
	return v
}
