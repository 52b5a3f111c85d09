package topology

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/internal/gputest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireGPU skips without a usable GPU (see internal/gputest).
func requireGPU(t *testing.T) { gputest.Require(t) }

// TestGPUDiscover prints the facts (compare the purego and the goccl_nvml_cgo build's
// output: they must be equal) and checks every GPU with itself for real.
func TestGPUDiscover(t *testing.T) {
	requireGPU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cache := t.TempDir()
	topo, err := Discover(ctx, Options{CheckP2P: true, Force: true, CacheDir: cache})
	require.NoError(t, err)

	var b bytes.Buffer
	require.NoError(t, topo.Render(&b))
	fmt.Printf("--- topology facts, NVML binding: %s ---\n%s--- end of topology facts ---\n", nvmlBuild, b.String())

	// A library that loads must give facts: anything else is a broken binding.
	nv := defaultNVML()
	if nerr := nv.Init(); errors.Is(nerr, ErrNoNVML) {
		t.Logf("no NVML here (%v): CUDA facts only", nerr)
	} else {
		require.NoError(t, nerr)
		require.NoError(t, nv.Shutdown())
		require.True(t, topo.HasNVML, "NVML initialised but its facts were dropped: %v", topo.Notes)
		assert.Regexp(t, `^\d+\.\d+`, topo.NVMLDriver)
	}
	assert.Positive(t, topo.CUDADriver)
	uuid := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	for i, g := range topo.GPUs {
		assert.Equal(t, i, g.Ordinal)
		assert.NotEmpty(t, g.Name)
		assert.Regexp(t, uuid, g.UUID)
		assert.Regexp(t, `^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`, g.BusID)
		assert.Positive(t, g.SMs)
		assert.GreaterOrEqual(t, g.Major, 7)
		if topo.HasNVML {
			assert.GreaterOrEqual(t, g.NVMLIndex, 0)
		}
		assert.True(t, topo.Links[i][i].Check.Passed(), "GPU %d with itself: %s", i, topo.Links[i][i].Check.Err)
	}
	assert.Equal(t, CheckRunNow, topo.PeerCheck)
	assert.FileExists(t, topo.CachePath)
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 0, 0, 0}, PolicyOptions{}))

	if len(topo.GPUs) > 1 {
		all := make([]int, len(topo.GPUs))
		for i := range all {
			all[i] = i
		}
		err := topo.CheckCustomAllReduce(all, PolicyOptions{})
		if err != nil {
			require.ErrorIs(t, err, ErrNotEligible)
		}
		t.Logf("custom all-reduce on all %d GPUs: %v", len(all), err)
	}

	again, err := Discover(ctx, Options{CheckP2P: true, CacheDir: cache})
	require.NoError(t, err)
	assert.Equal(t, CheckFromCache, again.PeerCheck)
	assert.Equal(t, topo.Links, again.Links)
}

// TestGPUPeerCheckSelf runs the driver-backed check directly: every GPU with itself passes
// and leaves nothing behind to release with an error.
func TestGPUPeerCheckSelf(t *testing.T) {
	requireGPU(t)
	n, err := driver.DeviceCount()
	require.NoError(t, err)
	var pairs []Pair
	for i := range n {
		pairs = append(pairs, Pair{i, i})
	}
	errs, cleanup := driverCUDA{}.CheckPeers(context.Background(), pairs, DefaultCheckTimeout)
	require.NoError(t, cleanup)
	require.Len(t, errs, n)
	for i, err := range errs {
		assert.NoError(t, err, "GPU %d", i)
	}
}

// TestDiscoverWithoutGPU: on a machine without a GPU, Discover's error is the driver's, with
// the sentinel intact for callers that fall back.
func TestDiscoverWithoutGPU(t *testing.T) {
	initErr := driver.Init()
	if initErr == nil {
		t.Skip("this machine has a GPU")
	}
	_, err := Discover(context.Background(), Options{CheckP2P: true, CacheDir: t.TempDir()})
	require.ErrorContains(t, err, "topology: CUDA driver version: ")
	assert.True(t, errors.Is(err, driver.ErrNoDevice) || errors.Is(err, driver.ErrNoDriver), err)
	assert.ErrorIs(t, err, initErr)
}
