package collective

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/ptx"
)

// Kernels are JIT-compiled once per process and device and stay loaded.
//
// A communicator's New loads the plain kernels of the one barrier scope it will launch: the
// GPU-scope one-shot and two-shot when every rank runs on one GPU (unless
// Options.SystemScope), the system-scope ones otherwise (counting arrivals where the GPUs
// have native atomics on each other's memory), and push (one kernel for every scope), each
// for every element type: nine modules, compiled side by side by a pool of
// JIT workers (jitWorkers). The fused and single-rank RMSNorm kernels are compiled on their
// first call.
//
// Every compiled module stays loaded in the device's primary context, which the module cache
// retains for that, until the process exits or UnloadKernels: a later New of the same world
// size and scope finds its kernels ready, and another world size or scope compiles only the
// modules it does not share (push is the same in every scope; the RMSNorm kernel in every
// world size). What that costs is the device memory of the modules' code (each a few tens of
// KiB of SASS) and the primary context staying retained after the last communicator closes,
// as the CUDA runtime keeps it for a program that has used the GPU. The alternative, keeping
// JIT output as cubins in host memory (cuLinkComplete) and loading those into a fresh module
// for every New, would give the context back but pay a module load per kernel on every New;
// the driver's own on-disk cache (~/.nv/ComputeCache) already spares a later process most of
// the JIT.

// numScopes sizes the tables indexed by ptx.Scope.
const numScopes = ptx.ScopeSystemCounted + 1

// kernelSet holds the plain kernels of one world size and barrier scope on one device, and
// the fused and RMSNorm kernels that its communicators loaded on first use: one function per
// (scope, algorithm, dtype), the row of key.scope filled. Ranks of one process on one device
// share it; it stays cached when the last of them closes (see UnloadKernels).
type kernelSet struct {
	key  kernelKey
	mc   *moduleCache // where its kernels are loaded: the process's (modules), or a test's
	refs int          // communicators using the set; guarded by kernelCache.mu
	// ready is closed once the plain kernels are loaded or failed to (err); fn,
	// maxBlocksPerSM and loads are written before, by the New that created the set.
	ready chan struct{}
	err   error
	fn    [numScopes][ptx.Push + 1][dtype.BFloat16 + 1]*driver.Function
	// maxBlocksPerSM is the smallest occupancy at ThreadsPerBlock of the set's plain kernels,
	// the kernels a communicator of its scope launches: what the ranks exchange to cap their
	// grids so that every block of every rank sharing a GPU is resident at once.
	maxBlocksPerSM int
	// loads says how each plain kernel was found, in load order (Comm.Startup).
	loads []KernelLoad
	// modules lists the modules the set uses (plain, and lazily loaded ones), which
	// UnloadKernels keeps while the set is in use; guarded by kernelCache.mu.
	modules []moduleKey
	// fused holds the fused all-reduce + RMSNorm kernels loaded so far (guarded by
	// kernelCache.mu): fusedKernel loads each on its first use, so that communicators that
	// never call AllReduceResidualRMSNorm pay no JIT for them.
	// The last index is ptx.FusedSpec.RowCache (1: the one-shot with the row cache).
	fused [numScopes][ptx.Columns + 1][dtype.BFloat16 + 1][2]*driver.Function
	// fusedOcc is each loaded fused kernel's occupancy at ThreadsPerBlock (blocks per SM).
	fusedOcc [numScopes][ptx.Columns + 1][dtype.BFloat16 + 1][2]int
	// norm holds the single-rank residual add + RMSNorm kernels loaded so far (guarded by
	// kernelCache.mu), one per element type: normKernel loads each on its first use.
	norm [dtype.BFloat16 + 1]*driver.Function
}

// kernelKey names a kernel set: the device (whose primary context is one per process, so
// the device identifies the context), the world size, the target of the device and the
// barrier scope of the communicators that use it.
type kernelKey struct {
	dev       driver.Device
	worldSize int
	target    ptx.Target
	scope     ptx.Scope
}

// kernelCache maps a kernel key to its set.
var kernelCache = struct {
	mu   sync.Mutex
	sets map[kernelKey]*kernelSet
	// held counts, per module, the open communicators without a kernel set (NCCL alone
	// serves them) that launch it: their residual add + RMSNorm kernel, which UnloadKernels
	// must keep as it keeps the sets' modules.
	held map[moduleKey]int
}{sets: map[kernelKey]*kernelSet{}, held: map[moduleKey]int{}}

// holdModule keeps key's module through UnloadKernels until releaseModule: for a
// communicator that launches it without a kernel set.
func holdModule(key moduleKey) {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	kernelCache.held[key]++
}

// releaseModule gives back a holdModule.
func releaseModule(key moduleKey) {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	if kernelCache.held[key]--; kernelCache.held[key] <= 0 {
		delete(kernelCache.held, key)
	}
}

// planKernels lists the plain kernels of a set, in load order: for each algorithm and
// element type, the spec of key's scope; push's is the system-scope spec, the same kernel in
// every scope (it has no barrier). Every algorithm, also where Options.Algorithm forces one:
// AllReduceWith may launch any of them on any call, straight from the set's table, and the
// grids are capped by the least occupancy of all three (maxBlocksPerSM), which the fused
// kernels, loaded later, are checked against.
func planKernels(key kernelKey) []ptx.Spec {
	var specs []ptx.Spec
	for _, algo := range ptx.Algorithms {
		scope := key.scope
		if algo == ptx.Push {
			scope = ptx.ScopeSystem
		}
		for _, dt := range dtype.All {
			specs = append(specs, ptx.Spec{Algo: algo, DType: dt, WorldSize: key.worldSize, Target: key.target, Scope: scope})
		}
	}
	return specs
}

// acquireKernels returns the kernel set of key with one more reference, and how each of its
// plain kernels was found by this call: loading them on first use (the JIT in parallel), or
// waiting for the New of another rank of this process that is loading them.
func acquireKernels(key kernelKey) (*kernelSet, []KernelLoad, error) {
	return acquireFrom(&modules, key)
}

// acquireFrom is acquireKernels with the kernels loaded through mc.
func acquireFrom(mc *moduleCache, key kernelKey) (*kernelSet, []KernelLoad, error) {
	specs := planKernels(key)
	kernelCache.mu.Lock()
	ks := kernelCache.sets[key]
	if ks != nil {
		ks.refs++
		kernelCache.mu.Unlock()
		cached := true
		select {
		case <-ks.ready:
		default:
			cached = false
			<-ks.ready
		}
		if ks.err != nil {
			return nil, nil, ks.err // the creator dropped the set; this reference goes with it
		}
		loads := slices.Clone(ks.loads)
		for i := range loads {
			if cached {
				loads[i].Source = KernelCached
			} else if loads[i].Source == KernelCompiled {
				loads[i].Source = KernelShared
			}
		}
		return ks, loads, nil
	}
	keys := make([]moduleKey, len(specs))
	for i, s := range specs {
		keys[i] = moduleKey{dev: key.dev, target: key.target, entry: s.EntryName()}
	}
	ks = &kernelSet{key: key, mc: mc, refs: 1, ready: make(chan struct{}), maxBlocksPerSM: 1 << 30,
		modules: slices.Clone(keys)}
	kernelCache.sets[key] = ks
	kernelCache.mu.Unlock()

	// Each kernel in its own goroutine; the module cache bounds how many compile at once.
	got := make([]*module, len(specs))
	srcs := make([]KernelSource, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, s := range specs {
		wg.Go(func() { got[i], srcs[i], errs[i] = mc.get(keys[i], s.Generate) })
	}
	wg.Wait()
	// The first failure in load order; the others most likely share its cause.
	if i := slices.IndexFunc(errs, func(err error) bool { return err != nil }); i >= 0 {
		err := errs[i]
		ks.err = err
		kernelCache.mu.Lock()
		delete(kernelCache.sets, key)
		kernelCache.mu.Unlock()
		close(ks.ready)
		return nil, nil, err
	}
	for i, s := range specs {
		ks.fn[key.scope][s.Algo][s.DType] = got[i].fn
		ks.maxBlocksPerSM = min(ks.maxBlocksPerSM, got[i].occ)
		load := got[i].load
		load.Source = srcs[i]
		ks.loads = append(ks.loads, load)
	}
	close(ks.ready)
	return ks, slices.Clone(ks.loads), nil
}

// loadModule returns the kernel entry of the module that generate returns, compiled for
// target, and its occupancy at ThreadsPerBlock, from the module cache (compiling it on first
// use). The caller holds kernelCache.mu.
func (ks *kernelSet) loadModule(entry string, target ptx.Target, generate func() ([]byte, error)) (*driver.Function, int, error) {
	key := moduleKey{dev: ks.key.dev, target: target, entry: entry}
	if !slices.Contains(ks.modules, key) {
		ks.modules = append(ks.modules, key)
	}
	m, _, err := ks.mc.get(key, generate)
	if err != nil {
		return nil, 0, err
	}
	return m.fn, m.occ, nil
}

// release drops one reference. The kernels stay loaded for the next communicator of the
// same key (see UnloadKernels).
func (ks *kernelSet) release() error {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	ks.refs--
	return nil
}

// fusedKernel returns the fused kernel of (scope, algo, dt, rowCache: see
// ptx.FusedSpec.RowCache), loading it on first use, and its occupancy at ThreadsPerBlock. It
// may be below the plain kernels' (the blocks per SM the ranks sized their grids for): the
// caller then shrinks the grid (Comm.fusedLimit).
func (ks *kernelSet) fusedKernel(scope ptx.Scope, algo ptx.Algorithm, dt dtype.DType, rowCache bool) (*driver.Function, int, error) {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	rc := 0
	if rowCache {
		rc = 1
	}
	if fn := ks.fused[scope][algo][dt][rc]; fn != nil {
		return fn, ks.fusedOcc[scope][algo][dt][rc], nil
	}
	spec := ptx.FusedSpec{Algo: algo, DType: dt, WorldSize: ks.key.worldSize, Target: ks.key.target, Scope: scope, RowCache: rowCache}
	fn, occ, err := ks.loadModule(spec.EntryName(), spec.Target, spec.Generate)
	if err != nil {
		return nil, 0, err
	}
	ks.fused[scope][algo][dt][rc], ks.fusedOcc[scope][algo][dt][rc] = fn, occ
	return fn, occ, nil
}

// UnloadKernels unloads the kernels that no open communicator uses, and gives back the
// process's retain of a device's primary context once none of its kernels is left. goccl
// keeps every kernel it JIT-compiled loaded until the process exits, so that a later New
// (NewGroup) of the same shape compiles nothing; a program that is done with goccl calls
// UnloadKernels to free their device memory, or to make the next New compile afresh (to
// measure it, say). Communicators still open keep theirs.
//
// CUDA graphs captured from a closed communicator (Comm.Capture, or the caller's own capture)
// launch kernels of these modules: they must not be launched after UnloadKernels. A program
// that resets a device (cuDevicePrimaryCtxReset, cudaDeviceReset), which destroys the modules
// in its context, closes its communicators and calls UnloadKernels first. Safe from several
// goroutines.
func UnloadKernels() error {
	if err := unloadKernels(&modules); err != nil {
		return fmt.Errorf("collective: unload kernels: %w", err)
	}
	return nil
}

// unloadKernels drops the unused sets of mc and unloads the kernels of mc that no set in use
// needs.
func unloadKernels(mc *moduleCache) error {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	keep := map[moduleKey]bool{}
	for key := range kernelCache.held {
		keep[key] = true
	}
	for key, ks := range kernelCache.sets {
		switch {
		case ks.mc != mc:
		case ks.refs == 0:
			delete(kernelCache.sets, key)
		default:
			for _, m := range ks.modules {
				keep[m] = true
			}
		}
	}
	return mc.unloadExcept(keep)
}

// moduleKey names one JIT-compiled kernel: the device fixes the context and the target goes
// with it; the entry name spells out everything else that varies in the PTX (kernel,
// algorithm, element type, world size, scope).
type moduleKey struct {
	dev    driver.Device
	target ptx.Target
	entry  string
}

// module is one kernel loaded into the primary context of its device, or being loaded: done
// is closed once mod, fn, occ and load (or err) are set.
type module struct {
	done chan struct{}
	mod  *driver.Module
	fn   *driver.Function
	occ  int        // blocks per SM at ThreadsPerBlock
	load KernelLoad // how long it took; Source is the reader's
	err  error
}

// moduleCache holds every kernel the process loaded, each compiled once. Loads of distinct
// kernels run in parallel, at most cap(slots) at once; a second request for a kernel being
// compiled waits for that compile. Failed loads are forgotten, so that a later request tries
// again.
type moduleCache struct {
	mu      sync.Mutex
	entries map[moduleKey]*module
	ctxs    map[driver.Device]*driver.Context // the cache's retain of each device's primary context
	// slots bounds the compiles that run at once: each keeps a driver thread busy on a core.
	slots chan struct{}
	// retain and compile reach the driver; tests replace them.
	retain  func(driver.Device) (*driver.Context, error)
	compile func(ctx *driver.Context, key moduleKey, src []byte) (compiled, error)
}

// compiled is what compile returns for one kernel.
type compiled struct {
	mod         *driver.Module
	fn          *driver.Function
	occ         int
	load, setup time.Duration
}

// modules is the process's module cache.
var modules = newModuleCache(jitWorkers(), driver.PrimaryContext, jitCompile)

// jitWorkers is how many kernels the process JIT-compiles at once: one per core Go may use
// (GOMAXPROCS, which follows the CPU quota of a container). The driver's JIT of one module
// runs on the calling thread and is CPU-bound.
func jitWorkers() int { return max(1, runtime.GOMAXPROCS(0)) }

func newModuleCache(workers int, retain func(driver.Device) (*driver.Context, error),
	compile func(*driver.Context, moduleKey, []byte) (compiled, error)) moduleCache {
	return moduleCache{entries: map[moduleKey]*module{}, ctxs: map[driver.Device]*driver.Context{},
		slots: make(chan struct{}, workers), retain: retain, compile: compile}
}

// get returns the loaded kernel of key, compiling the PTX that generate returns on first
// use, and says whether this call compiled it, waited for another call compiling it, or
// found it loaded.
func (mc *moduleCache) get(key moduleKey, generate func() ([]byte, error)) (*module, KernelSource, error) {
	mc.mu.Lock()
	if m := mc.entries[key]; m != nil {
		mc.mu.Unlock()
		source := KernelCached
		select {
		case <-m.done:
		default:
			source = KernelShared
			<-m.done
		}
		return m, source, m.err
	}
	ctx, retained := mc.ctxs[key.dev]
	if !retained {
		var err error
		if ctx, err = mc.retain(key.dev); err != nil {
			mc.mu.Unlock()
			return nil, KernelCompiled, fmt.Errorf("collective: context for the kernels of device %d: %w", key.dev, err)
		}
		mc.ctxs[key.dev] = ctx
	}
	m := &module{done: make(chan struct{})}
	mc.entries[key] = m
	mc.mu.Unlock()

	mc.slots <- struct{}{}
	m.load.Name = key.entry
	start := time.Now()
	src, err := generate()
	m.load.Generate = time.Since(start)
	m.load.PTXBytes = len(src)
	if err != nil {
		err = fmt.Errorf("collective: generate %s: %w", key.entry, err)
	} else {
		var c compiled
		c, err = mc.compile(ctx, key, src)
		m.mod, m.fn, m.occ = c.mod, c.fn, c.occ
		m.load.Load, m.load.Setup, m.load.BlocksPerSM = c.load, c.setup, c.occ
	}
	<-mc.slots
	if err != nil {
		m.err = err
		mc.mu.Lock()
		if mc.entries[key] == m {
			delete(mc.entries, key)
		}
		mc.mu.Unlock()
	}
	close(m.done)
	return m, KernelCompiled, m.err
}

// unloadExcept unloads every loaded kernel not in keep (kernels being compiled stay), then
// releases the contexts of devices with no kernel left.
func (mc *moduleCache) unloadExcept(keep map[moduleKey]bool) error {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	var errs []error
	used := map[driver.Device]bool{}
	for key, m := range mc.entries {
		select {
		case <-m.done:
		default:
			used[key.dev] = true
			continue
		}
		if keep[key] {
			used[key.dev] = true
			continue
		}
		if err := m.mod.Close(); err != nil {
			errs = append(errs, fmt.Errorf("unload %s: %w", key.entry, err))
		}
		delete(mc.entries, key)
	}
	for dev, ctx := range mc.ctxs {
		if !used[dev] {
			errs = append(errs, ctx.Close())
			delete(mc.ctxs, dev)
		}
	}
	return errors.Join(errs...)
}

// jitCompile loads the PTX of one kernel into ctx (the driver's JIT, or its on-disk cache)
// and looks up the kernel and its occupancy at ThreadsPerBlock. On failure nothing stays
// loaded.
func jitCompile(ctx *driver.Context, key moduleKey, src []byte) (c compiled, err error) {
	start := time.Now()
	mod, err := ctx.LoadModule(key.entry, src)
	c.load = time.Since(start)
	if err != nil {
		return c, fmt.Errorf("collective: load kernel %s for %s: %w", key.entry, key.target, err)
	}
	defer func() {
		if err != nil {
			mod.Close()
		}
	}()
	start = time.Now()
	fn, err := mod.Function(key.entry)
	if err != nil {
		return c, fmt.Errorf("collective: find kernel %s: %w", key.entry, err)
	}
	occ, err := fn.MaxActiveBlocksPerSM(ptx.ThreadsPerBlock, 0)
	if err != nil {
		return c, fmt.Errorf("collective: occupancy of %s: %w", key.entry, err)
	}
	if occ < 1 {
		return c, fmt.Errorf("collective: kernel %s cannot run %d threads per block on this GPU", key.entry, ptx.ThreadsPerBlock)
	}
	c.setup = time.Since(start)
	c.mod, c.fn, c.occ = mod, fn, occ
	return c, nil
}
