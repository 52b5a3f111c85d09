package collective

import (
	"errors"
	"fmt"
	"sync"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/ptx"
)

// kernelSet holds the JIT-compiled kernels of one world size on one device: one function per
// (barrier scope, algorithm, dtype). Ranks of one process on one device share it; it is
// unloaded when the last of them closes. The system-scope kernels are loaded with the set;
// the GPU-scope ones only for a communicator whose ranks all run on this device (useGPUScope).
type kernelSet struct {
	key  kernelKey
	refs int // guarded by kernelCache.mu
	// ctx is the set's own reference to the device's primary context: the modules must be
	// unloaded through a context that is still open when the rank that loaded them has
	// closed its own.
	ctx     *driver.Context
	modules []*driver.Module
	fn      [ptx.ScopeGPU + 1][ptx.Push + 1][dtype.BFloat16 + 1]*driver.Function
	// maxBlocksPerSM is the smallest occupancy of any system-scope kernel at ThreadsPerBlock:
	// what the ranks exchange to cap their grids, before they know the scope.
	maxBlocksPerSM int
	// gpuScopeChecked and gpuScopeUsable remember useGPUScope's answer (guarded by
	// kernelCache.mu).
	gpuScopeChecked, gpuScopeUsable bool
	// fused holds the fused all-reduce + RMSNorm kernels loaded so far (guarded by
	// kernelCache.mu): fusedKernel loads each on its first use, so that communicators that
	// never call AllReduceResidualRMSNorm pay no JIT for them.
	fused [ptx.ScopeGPU + 1][ptx.TwoShot + 1][dtype.BFloat16 + 1]*driver.Function
	// norm holds the single-rank residual add + RMSNorm kernels loaded so far (guarded by
	// kernelCache.mu), one per element type: normKernel loads each on its first use.
	norm [dtype.BFloat16 + 1]*driver.Function
}

type kernelKey struct {
	dev       driver.Device
	worldSize int
	target    ptx.Target
}

// kernelCache maps a device and world size to its loaded kernels. The primary context of a
// device is one per process, so the device identifies the context.
var kernelCache = struct {
	mu   sync.Mutex
	sets map[kernelKey]*kernelSet
}{sets: map[kernelKey]*kernelSet{}}

// acquireKernels returns the kernels for key, loading them on first use.
func acquireKernels(key kernelKey) (*kernelSet, error) {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	if ks := kernelCache.sets[key]; ks != nil {
		ks.refs++
		return ks, nil
	}
	own, err := driver.PrimaryContext(key.dev)
	if err != nil {
		return nil, fmt.Errorf("collective: context for the kernels of device %d: %w", key.dev, err)
	}
	ks := &kernelSet{key: key, refs: 1, ctx: own, maxBlocksPerSM: 1 << 30}
	for _, algo := range ptx.Algorithms {
		for _, dt := range dtype.All {
			fn, occ, err := ks.load(ptx.Spec{Algo: algo, DType: dt, WorldSize: key.worldSize, Target: key.target})
			if err != nil {
				ks.unload()
				return nil, err
			}
			ks.maxBlocksPerSM = min(ks.maxBlocksPerSM, occ)
			ks.fn[ptx.ScopeSystem][algo][dt] = fn
		}
	}
	kernelCache.sets[key] = ks
	return ks, nil
}

// load JIT-compiles the kernel of spec into a module of the set and returns its function and
// its occupancy at ThreadsPerBlock.
func (ks *kernelSet) load(spec ptx.Spec) (*driver.Function, int, error) {
	return ks.loadModule(spec.EntryName(), spec.Target, spec.Generate)
}

// loadModule JIT-compiles the module that generate returns, whose one kernel is entry.
func (ks *kernelSet) loadModule(entry string, target ptx.Target, generate func() ([]byte, error)) (*driver.Function, int, error) {
	src, err := generate()
	if err != nil {
		return nil, 0, fmt.Errorf("collective: generate %s: %w", entry, err)
	}
	mod, err := ks.ctx.LoadModule(entry, src)
	if err != nil {
		return nil, 0, fmt.Errorf("collective: load kernel %s for %s: %w", entry, target, err)
	}
	ks.modules = append(ks.modules, mod)
	fn, err := mod.Function(entry)
	if err != nil {
		return nil, 0, fmt.Errorf("collective: find kernel %s: %w", entry, err)
	}
	occ, err := fn.MaxActiveBlocksPerSM(ptx.ThreadsPerBlock, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("collective: occupancy of %s: %w", entry, err)
	}
	if occ < 1 {
		return nil, 0, fmt.Errorf("collective: kernel %s cannot run %d threads per block on this GPU", entry, ptx.ThreadsPerBlock)
	}
	return fn, occ, nil
}

// useGPUScope makes sure the GPU-scope kernels are loaded and reports whether they can be
// used: a kernel whose occupancy is below the set's maxBlocksPerSM (which the grids were
// capped with) could deadlock, so the caller then keeps the system scope. The barrier kernels
// (OneShot, TwoShot) depend on the scope (ptx.Spec.Scope); Push shares the system-scope
// functions.
func (ks *kernelSet) useGPUScope() (bool, error) {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	if ks.gpuScopeChecked {
		return ks.gpuScopeUsable, nil
	}
	gpu := ks.fn[ptx.ScopeSystem]
	for _, algo := range []ptx.Algorithm{ptx.OneShot, ptx.TwoShot} {
		for _, dt := range dtype.All {
			fn, occ, err := ks.load(ptx.Spec{Algo: algo, DType: dt, WorldSize: ks.key.worldSize, Target: ks.key.target, Scope: ptx.ScopeGPU})
			if err != nil {
				return false, err
			}
			if occ < ks.maxBlocksPerSM {
				ks.gpuScopeChecked = true
				return false, nil
			}
			gpu[algo][dt] = fn
		}
	}
	ks.fn[ptx.ScopeGPU] = gpu
	ks.gpuScopeChecked, ks.gpuScopeUsable = true, true
	return true, nil
}

// release drops one reference and unloads the modules with the last one.
func (ks *kernelSet) release() error {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	ks.refs--
	if ks.refs > 0 {
		return nil
	}
	delete(kernelCache.sets, ks.key)
	return ks.unload()
}

func (ks *kernelSet) unload() error {
	var errs []error
	for _, m := range ks.modules {
		errs = append(errs, m.Close())
	}
	ks.modules = nil
	errs = append(errs, ks.ctx.Close())
	return errors.Join(errs...)
}

// fusedKernel returns the fused kernel of (scope, algo, dt), loading it on first use. Its
// occupancy at ThreadsPerBlock must be at least the set's maxBlocksPerSM, which the ranks
// capped their grids with: fewer resident blocks than the grid could deadlock its barriers.
func (ks *kernelSet) fusedKernel(scope ptx.Scope, algo ptx.Algorithm, dt dtype.DType) (*driver.Function, error) {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	if fn := ks.fused[scope][algo][dt]; fn != nil {
		return fn, nil
	}
	spec := ptx.FusedSpec{Algo: algo, DType: dt, WorldSize: ks.key.worldSize, Target: ks.key.target, Scope: scope}
	fn, occ, err := ks.loadModule(spec.EntryName(), spec.Target, spec.Generate)
	if err != nil {
		return nil, err
	}
	if occ < ks.maxBlocksPerSM {
		return nil, fmt.Errorf("collective: kernel %s fits %d blocks per SM, fewer than the %d the grids were sized for", spec.EntryName(), occ, ks.maxBlocksPerSM)
	}
	ks.fused[scope][algo][dt] = fn
	return fn, nil
}
