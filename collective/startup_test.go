package collective

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/ptx"
)

// fakeJIT stands in for the driver in a module cache: it counts compiles per kernel and how
// many run at once, takes delay per compile, fails the kernels in fail once each, and gives
// each kernel the occupancy occ returns.
type fakeJIT struct {
	delay     time.Duration
	occ       func(entry string) int
	mu        sync.Mutex
	compiles  map[string]int
	fail      map[string]bool
	running   atomic.Int32
	most      atomic.Int32
	retains   atomic.Int32
	generated atomic.Int32
}

func newFakeJIT(delay time.Duration) *fakeJIT {
	return &fakeJIT{delay: delay, compiles: map[string]int{}, fail: map[string]bool{},
		occ: func(string) int { return 2 }}
}

func (f *fakeJIT) cache(workers int) *moduleCache {
	mc := newModuleCache(workers, func(driver.Device) (*driver.Context, error) {
		f.retains.Add(1)
		return nil, nil
	}, f.compile)
	return &mc
}

func (f *fakeJIT) compile(_ *driver.Context, key moduleKey, src []byte) (compiled, error) {
	n := f.running.Add(1)
	defer f.running.Add(-1)
	for {
		most := f.most.Load()
		if n <= most || f.most.CompareAndSwap(most, n) {
			break
		}
	}
	time.Sleep(f.delay)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.compiles[key.entry]++
	if f.fail[key.entry] {
		delete(f.fail, key.entry)
		return compiled{}, fmt.Errorf("fake JIT refuses %s", key.entry)
	}
	if !strings.Contains(string(src), ".entry "+key.entry+"(") {
		return compiled{}, fmt.Errorf("PTX of %s does not hold its entry", key.entry)
	}
	return compiled{fn: &driver.Function{}, occ: f.occ(key.entry), load: f.delay}, nil
}

func (f *fakeJIT) count(entry string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.compiles[entry]
}

func (f *fakeJIT) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.compiles {
		n += c
	}
	return n
}

// generator returns a PTX generator for a kernel named entry that counts its calls.
func (f *fakeJIT) generator(entry string) func() ([]byte, error) {
	return func() ([]byte, error) {
		f.generated.Add(1)
		return []byte(".visible .entry " + entry + "(\n"), nil
	}
}

// TestModuleCacheBoundsParallelJIT: distinct kernels compile side by side, never more at
// once than the cache's workers.
func TestModuleCacheBoundsParallelJIT(t *testing.T) {
	f := newFakeJIT(20 * time.Millisecond)
	mc := f.cache(3)
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			entry := fmt.Sprintf("k%d", i)
			m, src, err := mc.get(moduleKey{dev: 900, target: ptx.SM90, entry: entry}, f.generator(entry))
			assert.NoError(t, err)
			assert.Equal(t, KernelCompiled, src)
			assert.Equal(t, entry, m.load.Name)
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, f.most.Load(), int32(3), "compiles at once")
	assert.Greater(t, f.most.Load(), int32(1), "compiles side by side")
	assert.Equal(t, 12, f.total())
	assert.Equal(t, int32(1), f.retains.Load(), "one context retain per device")
}

// TestModuleCacheCompilesOnce: callers asking for a kernel being compiled wait for that
// compile; later callers find it loaded.
func TestModuleCacheCompilesOnce(t *testing.T) {
	f := newFakeJIT(30 * time.Millisecond)
	mc := f.cache(4)
	key := moduleKey{dev: 901, target: ptx.SM90, entry: "k"}
	srcs := make([]KernelSource, 8)
	var wg sync.WaitGroup
	for i := range srcs {
		wg.Go(func() {
			var err error
			_, srcs[i], err = mc.get(key, f.generator("k"))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	assert.Equal(t, 1, f.count("k"))
	assert.Equal(t, int32(1), f.generated.Load(), "PTX generated once")
	n := map[KernelSource]int{}
	for _, s := range srcs {
		n[s]++
	}
	assert.Equal(t, 1, n[KernelCompiled], "sources %v", srcs)
	assert.Equal(t, len(srcs)-1, n[KernelShared]+n[KernelCached], "sources %v", srcs)
	_, src, err := mc.get(key, f.generator("k"))
	require.NoError(t, err)
	assert.Equal(t, KernelCached, src)
	assert.Equal(t, 1, f.count("k"))
}

// TestModuleCacheRetriesFailures: a failed compile reaches every caller waiting for it and
// is forgotten, so that the next request compiles again.
func TestModuleCacheRetriesFailures(t *testing.T) {
	f := newFakeJIT(20 * time.Millisecond)
	f.fail["k"] = true
	mc := f.cache(2)
	key := moduleKey{dev: 902, target: ptx.SM80, entry: "k"}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			_, _, err := mc.get(key, f.generator("k"))
			assert.ErrorContains(t, err, "fake JIT refuses k")
		})
	}
	wg.Wait()
	assert.Equal(t, 1, f.count("k"))
	_, src, err := mc.get(key, f.generator("k"))
	require.NoError(t, err)
	assert.Equal(t, KernelCompiled, src)
	assert.Equal(t, 2, f.count("k"))

	// A generator failure compiles nothing.
	_, _, err = mc.get(moduleKey{dev: 902, target: ptx.SM80, entry: "bad"}, func() ([]byte, error) {
		return nil, errors.New("no template")
	})
	assert.ErrorContains(t, err, "generate bad: no template")
	assert.Zero(t, f.count("bad"))
}

// TestPlanKernels: a set holds every algorithm and element type of its scope, push's
// system-scope kernel in every scope.
func TestPlanKernels(t *testing.T) {
	for _, scope := range ptx.Scopes {
		specs := planKernels(kernelKey{worldSize: 8, target: ptx.SM90, scope: scope})
		require.Len(t, specs, len(ptx.Algorithms)*len(dtype.All))
		seen := map[string]bool{}
		for _, s := range specs {
			require.NoError(t, s.Validate())
			assert.Equal(t, 8, s.WorldSize)
			assert.Equal(t, ptx.SM90, s.Target)
			want := scope
			if s.Algo == ptx.Push {
				want = ptx.ScopeSystem
			}
			assert.Equal(t, want, s.Scope, "%s", s.EntryName())
			seen[s.EntryName()] = true
		}
		assert.Len(t, seen, len(specs), "distinct kernels")
	}
}

// TestAcquireKernels: the first acquire of a set compiles its nine kernels in parallel;
// ranks acquiring it meanwhile wait and share them; later acquires find them loaded, also
// after every user released the set. Sets of the two scopes share push. UnloadKernels
// unloads what no set in use needs, and the next acquire compiles again.
func TestAcquireKernels(t *testing.T) {
	f := newFakeJIT(10 * time.Millisecond)
	f.occ = func(entry string) int {
		if strings.Contains(entry, "twoshot_bf16") {
			return 1
		}
		return 3
	}
	mc := f.cache(4)
	gpuKey := kernelKey{dev: 903, worldSize: 4, target: ptx.SM90, scope: ptx.ScopeGPU}
	const ranks = 4
	sets := make([]*kernelSet, ranks)
	loads := make([][]KernelLoad, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() {
			var err error
			sets[r], loads[r], err = acquireFrom(mc, gpuKey)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	ks := sets[0]
	for _, s := range sets {
		require.Same(t, ks, s)
	}
	assert.Equal(t, 9, f.total(), "every kernel compiled once")
	assert.Greater(t, f.most.Load(), int32(1), "compiled side by side")
	assert.LessOrEqual(t, f.most.Load(), int32(4), "compiled side by side")
	assert.Equal(t, 1, ks.maxBlocksPerSM, "the least occupancy of the set")
	compiled := 0
	for _, l := range loads {
		require.Len(t, l, 9)
		for _, k := range l {
			if k.Source == KernelCompiled {
				compiled++
			}
			assert.Positive(t, k.PTXBytes)
		}
	}
	assert.Equal(t, 9, compiled, "each kernel compiled by one rank")
	for _, algo := range ptx.Algorithms {
		for _, dt := range dtype.All {
			assert.NotNil(t, ks.fn[ptx.ScopeGPU][algo][dt], "%v %v", algo, dt)
			assert.Nil(t, ks.fn[ptx.ScopeSystem][algo][dt], "the other scope is not loaded")
		}
	}
	for range ranks {
		require.NoError(t, ks.release())
	}

	again, l, err := acquireFrom(mc, gpuKey)
	require.NoError(t, err)
	require.Same(t, ks, again)
	for _, k := range l {
		assert.Equal(t, KernelCached, k.Source, k.Name)
	}
	assert.Equal(t, 9, f.total())

	// The system-scope set of the same world size compiles its barrier kernels only.
	sysKey := gpuKey
	sysKey.scope = ptx.ScopeSystem
	sys, l, err := acquireFrom(mc, sysKey)
	require.NoError(t, err)
	assert.Equal(t, 15, f.total(), "push is shared")
	cached := 0
	for _, k := range l {
		if k.Source == KernelCached {
			cached++
			assert.Contains(t, k.Name, "push")
		}
	}
	assert.Equal(t, 3, cached)

	// A lazily loaded kernel is kept while its set is in use.
	fn, occ, err := func() (*driver.Function, int, error) {
		kernelCache.mu.Lock()
		defer kernelCache.mu.Unlock()
		return again.loadModule("extra", ptx.SM90, f.generator("extra"))
	}()
	require.NoError(t, err)
	assert.NotNil(t, fn)
	assert.Equal(t, 3, occ)
	require.NoError(t, sys.release())
	require.NoError(t, unloadKernels(mc))
	mc.mu.Lock()
	left := len(mc.entries)
	mc.mu.Unlock()
	assert.Equal(t, 10, left, "the GPU-scope set in use keeps its nine kernels and the lazy one")
	kernelCache.mu.Lock()
	_, sysCached := kernelCache.sets[sysKey]
	kernelCache.mu.Unlock()
	assert.False(t, sysCached, "an unused set is dropped")

	require.NoError(t, again.release())
	require.NoError(t, unloadKernels(mc))
	mc.mu.Lock()
	assert.Empty(t, mc.entries)
	assert.Empty(t, mc.ctxs, "the device's context is released with its last kernel")
	mc.mu.Unlock()
	fresh, l, err := acquireFrom(mc, gpuKey)
	require.NoError(t, err)
	assert.NotSame(t, ks, fresh)
	for _, k := range l {
		assert.Equal(t, KernelCompiled, k.Source, k.Name)
	}
	assert.Equal(t, 25, f.total())
	require.NoError(t, fresh.release())
	require.NoError(t, unloadKernels(mc))
}

// TestAcquireKernelsFailure: a set whose kernel fails is not kept; every rank waiting for it
// gets the error, and the next acquire tries again.
func TestAcquireKernelsFailure(t *testing.T) {
	f := newFakeJIT(10 * time.Millisecond)
	key := kernelKey{dev: 904, worldSize: 2, target: ptx.SM80, scope: ptx.ScopeSystem}
	bad := ptx.Spec{Algo: ptx.TwoShot, DType: dtype.Float16, WorldSize: 2, Target: ptx.SM80}.EntryName()
	f.fail[bad] = true
	mc := f.cache(2)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			_, _, err := acquireFrom(mc, key)
			assert.ErrorContains(t, err, "fake JIT refuses "+bad)
		})
	}
	wg.Wait()
	ks, _, err := acquireFrom(mc, key)
	require.NoError(t, err)
	assert.Equal(t, 2, f.count(bad))
	assert.Equal(t, 10, f.total(), "the kernels that loaded were kept")
	require.NoError(t, ks.release())
	require.NoError(t, unloadKernels(mc))
}

// TestStartupProfileTable: the profile's sums, counts and table.
func TestStartupProfileTable(t *testing.T) {
	p := StartupProfile{
		Total: 40 * time.Millisecond,
		Steps: []StartupStep{{StartupDriver, 0, 5 * time.Millisecond}, {StartupKernels, 5 * time.Millisecond, 30 * time.Millisecond},
			{StartupExchangeArenas, 35 * time.Millisecond, time.Millisecond}, {StartupExchangeArenas, 36 * time.Millisecond, 2 * time.Millisecond}},
		Kernels: []KernelLoad{{Name: "goccl_push_f32_w2", Source: KernelCompiled, Load: 25 * time.Millisecond, BlocksPerSM: 2},
			{Name: "goccl_push_f16_w2", Source: KernelCached}, {Name: "goccl_push_bf16_w2", Source: KernelShared}},
		JITWorkers: 16,
	}
	assert.Equal(t, 30*time.Millisecond, p.Phase(StartupKernels))
	assert.Equal(t, 3*time.Millisecond, p.Phase(StartupExchangeArenas))
	assert.Zero(t, p.Phase(StartupNCCL))
	assert.Equal(t, 1, p.Count(KernelCompiled))
	assert.Equal(t, 1, p.Count(KernelShared))
	assert.Equal(t, 1, p.Count(KernelCached))
	s := p.String()
	for _, want := range []string{"total 40.00 ms", "kernels", "30.00 ms", "goccl_push_f32_w2", "compiled", "25.00 ms",
		"1 compiled, 1 shared, 1 cached; 16 JIT workers"} {
		assert.Contains(t, s, want)
	}
	assert.Equal(t, "shared", KernelShared.String())

	c := &Comm{startup: p}
	got := c.Startup()
	got.Steps[0].Duration = 0
	assert.Equal(t, 5*time.Millisecond, c.startup.Steps[0].Duration, "Startup returns a copy")
}

// TestDumpStartupPTX writes the PTX of the kernels that New loads into the folder named by
// GOCCL_DUMP_PTX, for scripts/bench/startup.c to load the same texts: one folder per target,
// world size and scope (<target>/w<ws>-gpu, w<ws>-sys), and w<ws>-both with the kernels of
// both scopes (a communicator on one GPU loaded those fifteen before it chose its scope
// first). Files are numbered in load order. GOCCL_DUMP_RANKS lists the world sizes (default
// 2,4,8). Without GOCCL_DUMP_PTX it skips.
func TestDumpStartupPTX(t *testing.T) {
	dir := os.Getenv("GOCCL_DUMP_PTX")
	if dir == "" {
		t.Skip("set GOCCL_DUMP_PTX to a folder to write the PTX of the kernels New loads (scripts/bench/startup.c)")
	}
	sizes := []int{2, 4, 8}
	if env := os.Getenv("GOCCL_DUMP_RANKS"); env != "" {
		sizes = nil
		for _, f := range strings.Split(env, ",") {
			ws, err := strconv.Atoi(strings.TrimSpace(f))
			require.NoError(t, err, "GOCCL_DUMP_RANKS=%q: a comma-separated list of world sizes", env)
			sizes = append(sizes, ws)
		}
	}
	write := func(folder string, specs []ptx.Spec) {
		path := filepath.Join(dir, folder)
		require.NoError(t, os.MkdirAll(path, 0o755))
		for i, s := range specs {
			src, err := s.Generate()
			require.NoError(t, err)
			require.Contains(t, string(src), ".entry "+s.EntryName()+"(")
			require.NoError(t, os.WriteFile(filepath.Join(path, fmt.Sprintf("%02d-%s.ptx", i, s.EntryName())), src, 0o644))
		}
		t.Logf("%s: %d kernels", path, len(specs))
	}
	for _, target := range []ptx.Target{ptx.SM80, ptx.SM90} {
		for _, ws := range sizes {
			key := kernelKey{worldSize: ws, target: target}
			sys := planKernels(key)
			key.scope = ptx.ScopeGPU
			gpu := planKernels(key)
			write(fmt.Sprintf("%s/w%d-sys", target, ws), sys)
			write(fmt.Sprintf("%s/w%d-gpu", target, ws), gpu)
			both := slices.Clone(sys)
			for _, s := range gpu {
				if s.Scope == ptx.ScopeGPU {
					both = append(both, s)
				}
			}
			write(fmt.Sprintf("%s/w%d-both", target, ws), both)
		}
	}
}

// TestUnloadKeepsHeldNormKernel: a communicator that NCCL alone serves has no kernel set, and
// launches the residual add + RMSNorm kernel straight from the module cache: UnloadKernels
// keeps that kernel while the communicator is open (from the moment it took it, before its
// launch), and unloads it once the communicator is closed.
func TestUnloadKeepsHeldNormKernel(t *testing.T) {
	mc := newFakeJIT(time.Millisecond).cache(2)
	entries := func() int {
		mc.mu.Lock()
		defer mc.mu.Unlock()
		return len(mc.entries)
	}

	c := &Comm{rank: 0, size: 2, major: 9, dev: 905} // no kernel set: NCCL alone serves it
	_, err := c.heldNormKernel(mc, dtype.BFloat16)
	require.NoError(t, err)
	_, err = c.heldNormKernel(mc, dtype.BFloat16)
	require.NoError(t, err)
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = c.heldNormKernel(mc, dtype.BFloat16) }),
		"every call of the NCCL route takes the kernel: after the first, without allocating")
	require.NoError(t, unloadKernels(mc))
	assert.Equal(t, 1, entries(), "the open communicator's norm kernel stays loaded")

	require.NoError(t, c.release())
	require.NoError(t, unloadKernels(mc))
	assert.Zero(t, entries(), "once the communicator is closed, UnloadKernels unloads it")
	kernelCache.mu.Lock()
	assert.Empty(t, kernelCache.held, "every hold was given back")
	kernelCache.mu.Unlock()
}
