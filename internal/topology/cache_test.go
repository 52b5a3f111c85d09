package topology

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/goccl/goccl/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPeerCheckRunsEveryPairThenComesFromCache(t *testing.T) {
	nv, cu := pcieBox()
	broken := fmt.Errorf("4096 of 1048576 bytes differ (%w)", ErrPeerCheckFailed)
	cu.checkErr = map[Pair]error{{1, 0}: broken}
	dir := t.TempDir()
	opts := Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: dir}

	topo, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	require.Len(t, cu.checked, 1)
	assert.ElementsMatch(t, []Pair{{0, 0}, {0, 1}, {1, 0}, {1, 1}}, cu.checked[0])
	assert.Equal(t, CheckRunNow, topo.PeerCheck)
	assert.Empty(t, topo.Notes)
	assert.True(t, topo.Links[0][1].Check.Passed())
	assert.True(t, topo.Links[1][1].Check.Passed())
	assert.Equal(t, Check{Ran: true, Err: broken.Error()}, topo.Links[1][0].Check)
	require.FileExists(t, topo.CachePath)
	assert.Equal(t, dir, filepath.Dir(topo.CachePath))
	assert.Contains(t, filepath.Base(topo.CachePath), "550.54.15")

	again, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Len(t, cu.checked, 1, "second Discover must not re-check")
	assert.Equal(t, CheckFromCache, again.PeerCheck)
	assert.Equal(t, topo.CachePath, again.CachePath)
	assert.Equal(t, topo.Links, again.Links, "cached results equal fresh ones")

	// The same GPUs in the other CUDA order share the cache: it is keyed by bus id.
	cu.gpus[0], cu.gpus[1] = cu.gpus[1], cu.gpus[0]
	swapped, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Len(t, cu.checked, 1)
	assert.Equal(t, CheckFromCache, swapped.PeerCheck)
	assert.Equal(t, broken.Error(), swapped.Links[0][1].Check.Err, "the failing pair follows the GPUs")
	assert.True(t, swapped.Links[1][0].Check.Passed())

	opts.Force = true
	cu.checkErr = nil
	forced, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Len(t, cu.checked, 2, "Force re-checks")
	assert.Equal(t, CheckRunNow, forced.PeerCheck)
	assert.True(t, forced.Links[0][1].Check.Passed())

	opts.Force = false
	fresh, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Equal(t, CheckFromCache, fresh.PeerCheck)
	assert.True(t, fresh.Links[0][1].Check.Passed(), "Force rewrote the cache")
}

func TestPeerCheckCacheKeys(t *testing.T) {
	dir := t.TempDir()
	run := func(nv *fakeNVML, cu *fakeCUDA) *Topology {
		t.Helper()
		topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: dir})
		require.NoError(t, err)
		return topo
	}
	nv, cu := pcieBox()
	first := run(nv, cu)

	nv.driver = "550.90.07" // a driver update
	updated := run(nv, cu)
	assert.Equal(t, CheckRunNow, updated.PeerCheck)
	assert.NotEqual(t, first.CachePath, updated.CachePath)

	nv, cu = pcieBox()
	cu.gpus = cu.gpus[:1] // CUDA_VISIBLE_DEVICES narrowed further
	narrowed := run(nv, cu)
	assert.Equal(t, CheckRunNow, narrowed.PeerCheck)
	assert.NotEqual(t, first.CachePath, narrowed.CachePath)

	// Other GPUs in the same slots, with the same driver: another host whose cache folder is
	// a shared home's, or a GPU replaced. Bus ids name slots: the UUIDs tell them apart.
	nv, cu = pcieBox()
	for i := range cu.gpus {
		cu.gpus[i].UUID = "GPU-ffffffff" + cu.gpus[i].UUID[len("GPU-ffffffff"):]
	}
	for _, d := range nv.devs {
		d.uuid = "GPU-ffffffff" + d.uuid[len("GPU-ffffffff"):]
	}
	otherGPUs := run(nv, cu)
	assert.Equal(t, CheckRunNow, otherGPUs.PeerCheck, "another set of GPUs in the same slots checks again")
	assert.NotEqual(t, first.CachePath, otherGPUs.CachePath)

	nv, cu = pcieBox()
	nv.initErr = ErrNoNVML // no NVML: the key falls back to CUDA's version
	noNVML := run(nv, cu)
	assert.Contains(t, filepath.Base(noNVML.CachePath), "cuda12040")
}

func TestPeerCheckCacheDamaged(t *testing.T) {
	nv, cu := pcieBox()
	opts := Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()}
	topo, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(topo.CachePath, []byte("{not json"), 0o644))

	again, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Equal(t, CheckRunNow, again.PeerCheck)
	require.Len(t, again.Notes, 1)
	assert.Contains(t, again.Notes[0], "peer-check cache ignored")
	assert.Len(t, cu.checked, 2)

	third, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Equal(t, CheckFromCache, third.PeerCheck, "the damaged file was replaced")
}

func TestPeerCheckInconclusiveNotCached(t *testing.T) {
	nv, cu := pcieBox()
	cu.checkErr = map[Pair]error{{0, 1}: errors.New("cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory")}
	opts := Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()}
	topo, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Contains(t, topo.Links[0][1].Check.Err, "out of memory")
	require.Len(t, topo.Notes, 1)
	assert.Contains(t, topo.Notes[0], "not cached")
	assert.NoFileExists(t, topo.CachePath)

	_, err = Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Len(t, cu.checked, 2, "an out-of-memory failure is retried, not remembered")
}

func TestPeerCheckUnwritableCacheIsNotFatal(t *testing.T) {
	nv, cu := pcieBox()
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: filepath.Join(file, "sub")})
	require.NoError(t, err)
	assert.True(t, topo.Links[0][1].Check.Passed())
	require.NotEmpty(t, topo.Notes)
	assert.Contains(t, topo.Notes[len(topo.Notes)-1], "peer-check results not cached: mkdir")
}

func TestPeerCheckSkipsPairsWithoutPeerAccess(t *testing.T) {
	nv, cu := pcieBox()
	cu.noPeer = map[Pair]bool{{0, 1}: true}
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()})
	require.NoError(t, err)
	require.Len(t, cu.checked, 1)
	assert.ElementsMatch(t, []Pair{{0, 0}, {1, 0}, {1, 1}}, cu.checked[0])
	assert.False(t, topo.Links[0][1].CanAccessPeer)
	assert.False(t, topo.Links[0][1].Check.Ran)
}

func TestPeerCheckInterrupted(t *testing.T) {
	nv, cu := pcieBox()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Discover(ctx, Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()})
	require.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "peer check interrupted")
}

func TestPeerCheckCleanupErrorIsANote(t *testing.T) {
	nv, cu := pcieBox()
	cu.cleanupErr = errors.New("release GPU 1: cuDevicePrimaryCtxRelease_v2: CUDA_ERROR_UNKNOWN (999): unknown error")
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()})
	require.NoError(t, err)
	assert.True(t, topo.Links[0][1].Check.Passed(), "the checks themselves passed")
	assert.Equal(t, []string{"after the peer check: " + cu.cleanupErr.Error()}, topo.Notes)
}

// timeoutErr is what the driver-backed check returns when the copy over the link does not
// finish in time.
func timeoutErr() error {
	return fmt.Errorf("copy over the link did not finish within 10s: %w",
		fmt.Errorf("wait for stream: %w (%w)", driver.ErrTimeout, context.DeadlineExceeded))
}

func TestPeerCheckTimeoutNotCached(t *testing.T) {
	for name, err := range map[string]error{
		"plain": timeoutErr(),
		// Marked as a verdict (as a CUDA implementation might): a timeout is still none.
		"marked": fmt.Errorf("%w: %w", ErrPeerCheckFailed, timeoutErr()),
	} {
		t.Run(name, func(t *testing.T) {
			nv, cu := pcieBox()
			cu.checkErr = map[Pair]error{{0, 1}: err}
			opts := Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()}
			topo, derr := Discover(context.Background(), opts)
			require.NoError(t, derr)
			assert.Equal(t, Check{Ran: true, Err: err.Error()}, topo.Links[0][1].Check)
			requirePolicyRefusal(t, topo, "did not finish within 10s")
			require.Len(t, topo.Notes, 1)
			assert.Contains(t, topo.Notes[0], "not cached")
			assert.Contains(t, topo.Notes[0], "timed out")
			assert.NoFileExists(t, topo.CachePath)

			cu.checkErr = nil // the link was fine, the GPU was busy
			again, derr := Discover(context.Background(), opts)
			require.NoError(t, derr)
			assert.Len(t, cu.checked, 2, "a timeout is checked again, not remembered")
			assert.Equal(t, CheckRunNow, again.PeerCheck)
			assert.NoError(t, again.CheckCustomAllReduce([]int{0, 1}, PolicyOptions{}))
		})
	}
}

// requirePolicyRefusal checks that topo refuses GPUs 0 and 1 for a fresh (not cached)
// check failure whose reason contains why.
func requirePolicyRefusal(t *testing.T, topo *Topology, why string) {
	t.Helper()
	err := topo.CheckCustomAllReduce([]int{0, 1}, PolicyOptions{})
	var pe *PolicyError
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, pe.Reason, why)
	assert.Empty(t, pe.Cache)
	assert.NotContains(t, err.Error(), "cached")
}

func TestPeerCheckTimeoutRemovesTheVerdictItReplaces(t *testing.T) {
	nv, cu := pcieBox()
	cu.checkErr = map[Pair]error{{0, 1}: fmt.Errorf("4096 of 1048576 bytes differ (%w)", ErrPeerCheckFailed)}
	opts := Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()}
	first, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	require.FileExists(t, first.CachePath)

	// Re-checked, the pair times out: the old verdict is neither confirmed nor kept.
	cu.checkErr = map[Pair]error{{0, 1}: timeoutErr()}
	opts.Force = true
	forced, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	require.Len(t, forced.Notes, 1)
	assert.Contains(t, forced.Notes[0], "earlier ones in "+first.CachePath+" removed")
	assert.NoFileExists(t, first.CachePath)

	cu.checkErr = nil
	opts.Force = false
	next, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Equal(t, CheckRunNow, next.PeerCheck, "nothing cached to trust: checked again")
	assert.Len(t, cu.checked, 3)
	assert.True(t, next.Links[0][1].Check.Passed())
}

func TestPeerCheckDriverRefusalIsCached(t *testing.T) {
	nv, cu := pcieBox()
	refused := fmt.Errorf("enable peer access: cuCtxEnablePeerAccess: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (217): %w", ErrPeerCheckFailed)
	cu.checkErr = map[Pair]error{{1, 0}: refused}
	opts := Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()}
	_, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	again, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Equal(t, CheckFromCache, again.PeerCheck)
	assert.Equal(t, refused.Error(), again.Links[1][0].Check.Err)
}

func TestCachedVerdictErrorNamesTheCacheAndTheRecheck(t *testing.T) {
	nv, cu := pcieBox()
	cu.checkErr = map[Pair]error{{1, 0}: fmt.Errorf("4096 of 1048576 bytes differ (%w)", ErrPeerCheckFailed)}
	opts := Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()}
	fresh, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	err = fresh.CheckCustomAllReduce([]int{0, 1}, PolicyOptions{})
	require.ErrorIs(t, err, ErrNotEligible)
	assert.NotContains(t, err.Error(), fresh.CachePath, "a verdict of this run is not a cached one")

	cached, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	require.Equal(t, CheckFromCache, cached.PeerCheck)
	err = cached.CheckCustomAllReduce([]int{0, 1}, PolicyOptions{})
	require.ErrorIs(t, err, ErrNotEligible)
	var pe *PolicyError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, cached.CachePath, pe.Cache)
	assert.Contains(t, err.Error(), "4096 of 1048576 bytes differ")
	assert.Contains(t, err.Error(), "verdict cached in "+cached.CachePath)
	assert.Contains(t, err.Error(), "GOCCL_P2P_RECHECK=1")
	assert.Contains(t, err.Error(), "topology.Options.Force")

	// A refusal for another reason (no NVLink) has nothing to do with the cache.
	three := meshTopology(3, 0)
	three.PeerCheck, three.CachePath = CheckFromCache, cached.CachePath
	err = three.CheckCustomAllReduce([]int{0, 1, 2}, PolicyOptions{})
	require.ErrorAs(t, err, &pe)
	assert.Empty(t, pe.Cache)
}

func TestRecheckEnvBypassesTheCache(t *testing.T) {
	nv, cu := pcieBox()
	cu.checkErr = map[Pair]error{{1, 0}: fmt.Errorf("4096 of 1048576 bytes differ (%w)", ErrPeerCheckFailed)}
	opts := Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()}
	_, err := Discover(context.Background(), opts)
	require.NoError(t, err)

	cu.checkErr = nil // the link was repaired (a driver fix of the same version)
	t.Setenv(RecheckEnv, "1")
	rechecked, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Len(t, cu.checked, 2, "GOCCL_P2P_RECHECK=1 checks again")
	assert.Equal(t, CheckRunNow, rechecked.PeerCheck)
	assert.NoError(t, rechecked.CheckCustomAllReduce([]int{0, 1}, PolicyOptions{}))

	t.Setenv(RecheckEnv, "0")
	cached, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	assert.Len(t, cu.checked, 2, "GOCCL_P2P_RECHECK=0 uses the cache")
	assert.Equal(t, CheckFromCache, cached.PeerCheck)
	assert.NoError(t, cached.CheckCustomAllReduce([]int{0, 1}, PolicyOptions{}), "the re-check replaced the cached verdict")

	t.Setenv(RecheckEnv, "please")
	_, err = Discover(context.Background(), opts)
	require.ErrorContains(t, err, `GOCCL_P2P_RECHECK="please" is not understood`)
	assert.ErrorContains(t, err, "set it to 1")

	_, err = Discover(context.Background(), Options{NVML: nv, CUDA: cu, CacheDir: opts.CacheDir})
	assert.NoError(t, err, "without CheckP2P the variable is not read")
}
