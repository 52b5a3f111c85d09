package main

// The fused mode on the GPU: gpuEngine.RunFused checks and times the fused all-reduce +
// residual add + RMSNorm and the unfused pair on the engine's communicators.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/internal/ref"
	"github.com/goccl/goccl/ptx"
)

// fusedRank is one rank's buffers of a fused case, beside the engine's in (the rank's partial
// sum, In of both calls) and out (the pair's all-reduced sum).
type fusedRank struct {
	residual, residOut, normOut, gamma driver.DevicePtr
	regs                               []*collective.Registration
}

// fusedData is the host side of a fused case: every rank's input, and the residual and gamma
// that every rank passes (replicated, as tensor parallelism has them).
type fusedData struct {
	inputs          [][]byte
	residual, gamma []byte
}

// RunFused checks the fused call and the unfused pair (if asked), then times both. Every
// buffer is visible to the peers: In and the pair's sum were registered with the engine, the
// residual and outputs are registered here (and a graph shares them anyway), so the fused
// TwoShot writes the finished rows straight into every rank's outputs, as in a service that
// captures its layers.
func (e *gpuEngine) RunFused(ctx context.Context, c FusedCase) (m FusedMeasurement, err error) {
	comm := e.ranks[0].comm(c.Backend)
	if comm == nil {
		return m, fmt.Errorf("no %s communicator in this run", c.Backend)
	}
	withFused := c.Backend != backendNCCL
	algo := collective.NCCL
	if withFused {
		if algo, err = collective.ParseAlgorithm(c.Algo); err != nil {
			return m, err
		}
	}
	nbytes := int64(c.Rows) * int64(c.Hidden) * int64(c.DType.Size())
	var fusedPath collective.Algorithm
	if withFused {
		fusedPath = algo
		if algo == collective.Auto {
			if fusedPath, err = comm.FusedSelected(c.Rows, c.Hidden, c.DType, true); err != nil {
				return m, err
			}
		}
		m.Path = fusedPath.String()
	}
	// The pair's all-reduce, out of place into a registered output: the eager check's
	// algorithm, and with -g the captured calls' (a tuning table may choose differently for
	// graphs), which the row names. The check runs eagerly, so with -g and such a table the
	// graph's algorithm is timed but not checked.
	pairPath, pairGraphPath := algo, algo
	if algo == collective.Auto {
		pairPath = comm.Selected(nbytes, true)
		pairGraphPath = comm.SelectedFor(nbytes, collective.CallKind{Captured: true})
	}
	m.PairPath = pairPath.String()
	if c.Graph {
		m.PairPath = pairGraphPath.String()
	}

	bufs := map[*engineRank]*fusedRank{}
	defer func() {
		if rerr := e.freeFused(bufs); err == nil {
			err = rerr
		}
	}()
	if err := e.allocFused(ctx, c, nbytes, withFused && kernelsServe(comm), bufs); err != nil {
		return m, err
	}
	data, err := e.fillFused(c, bufs)
	if err != nil {
		return m, err
	}
	// Load both calls' kernels before the first all-reduce is in flight: this process drives
	// every rank, and a module load can wait for the kernels running (Comm.LoadFused). It
	// also keeps the JIT out of the checked and timed calls.
	if err := e.parallel(func(r *engineRank) error { return r.comm(c.Backend).LoadFused(c.DType) }); err != nil {
		return m, err
	}
	fused := func(r *engineRank, outOfPlace bool) error {
		a := fusedArgs(r, bufs[r], c, outOfPlace)
		if algo == collective.Auto {
			return r.comm(c.Backend).AllReduceResidualRMSNorm(r.stream, a)
		}
		return r.comm(c.Backend).AllReduceResidualRMSNormWith(r.stream, a, algo)
	}
	allReduce := func(r *engineRank) error {
		return r.comm(c.Backend).AllReduceWith(r.stream, r.out, r.in, c.Rows*c.Hidden, c.DType, algo)
	}
	pair := func(r *engineRank, outOfPlace bool) error {
		if err := allReduce(r); err != nil {
			return err
		}
		a := fusedArgs(r, bufs[r], c, outOfPlace)
		a.In = r.out
		return r.comm(c.Backend).ResidualRMSNorm(r.stream, a)
	}

	// checked runs call on every rank, waits for it and compares its outputs.
	checked := func(call func(*engineRank) error, compare func() error) error {
		if err := e.parallel(call); err != nil {
			return err
		}
		if err := e.wait(ctx); err != nil {
			return err
		}
		return compare()
	}
	if c.Check {
		// Out of place, into poisoned outputs: an element that no kernel wrote cannot pass.
		if withFused {
			if err := checked(func(r *engineRank) error { return fused(r, true) },
				func() error { return e.compareFused(c, fusedPath, data, bufs, &m) }); err != nil {
				return m, err
			}
			if err := e.poisonOutputs(c, bufs); err != nil {
				return m, err
			}
		}
		if err := checked(func(r *engineRank) error { return pair(r, true) },
			func() error { return e.comparePair(c, pairPath, data, bufs, &m) }); err != nil {
			return m, err
		}
	}
	// Timed in place, ResidualOut over the residual, as a layer runs them.
	if withFused {
		if m.Fused, err = e.timeCalls(ctx, c, func(r *engineRank) error { return fused(r, false) }); err != nil {
			return m, fmt.Errorf("fused call: %w", err)
		}
	}
	if m.Unfused, err = e.timeCalls(ctx, c, func(r *engineRank) error { return pair(r, false) }); err != nil {
		return m, fmt.Errorf("unfused pair: %w", err)
	}
	// The pair's all-reduce alone: what the pair's norm kernel adds to it is the most the
	// fused call can save.
	if m.AllReduce, err = e.timeCalls(ctx, c, allReduce); err != nil {
		return m, fmt.Errorf("the pair's all-reduce alone: %w", err)
	}
	return m, nil
}

// fusedArgs are rank r's arguments of both calls: In its partial sum, ResidualOut the residual
// itself (in place) or, outOfPlace, an output of its own.
func fusedArgs(r *engineRank, b *fusedRank, c FusedCase, outOfPlace bool) collective.FusedArgs {
	a := collective.FusedArgs{In: r.in, Residual: b.residual, ResidualOut: b.residual, NormOut: b.normOut, Gamma: b.gamma,
		Rows: c.Rows, Hidden: c.Hidden, Eps: c.Eps, DType: c.DType}
	if outOfPlace {
		a.ResidualOut = b.residOut
	}
	return a
}

// allocFused allocates every rank's buffers of the case into bufs and, with register, shares
// the residual and both outputs with the peers (a collective call, every rank in the same
// order).
func (e *gpuEngine) allocFused(ctx context.Context, c FusedCase, nbytes int64, register bool, bufs map[*engineRank]*fusedRank) error {
	for i, r := range e.ranks {
		b := &fusedRank{}
		bufs[r] = b
		dctx := r.context()
		for _, p := range []struct {
			ptr *driver.DevicePtr
			n   int64
		}{{&b.residual, nbytes}, {&b.residOut, nbytes}, {&b.normOut, nbytes}, {&b.gamma, int64(c.Hidden * c.DType.Size())}} {
			var err error
			if *p.ptr, err = dctx.Alloc(uint64(p.n)); err != nil {
				return fmt.Errorf("rank %d: %w", e.first+i, err)
			}
		}
	}
	if !register {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout+30*time.Second)
	defer cancel()
	var mu sync.Mutex
	err := e.parallel(func(r *engineRank) error {
		b := bufs[r]
		for _, p := range []driver.DevicePtr{b.residual, b.residOut, b.normOut} {
			reg, err := r.goccl.Register(rctx, p, uint64(nbytes))
			if err != nil {
				return err
			}
			mu.Lock()
			b.regs = append(b.regs, reg)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("register the residual and the outputs: %w", err)
	}
	return nil
}

// freeFused waits for the ranks' streams (bounded), releases the registrations and frees the
// buffers. If a kernel is still stuck, the memory is left allocated (freeing it under a
// running kernel would block) and the error says so.
func (e *gpuEngine) freeFused(bufs map[*engineRank]*fusedRank) error {
	if err := waitIdle(e.streams(), e.cfg.Timeout); err != nil {
		return fmt.Errorf("fused calls still running, their buffers left allocated: %w", err)
	}
	var errs []error
	for r, b := range bufs {
		for _, reg := range b.regs {
			errs = append(errs, reg.Release())
		}
		for _, p := range []driver.DevicePtr{b.residual, b.residOut, b.normOut, b.gamma} {
			if p != 0 {
				errs = append(errs, r.context().Free(p))
			}
		}
	}
	return errors.Join(errs...)
}

// fillFused draws the case's data, writes it to every rank and poisons the outputs and the
// pair's sum. In a --procs child every process derives every rank's input from a seed they
// share, so each can compute the reference.
func (e *gpuEngine) fillFused(c FusedCase, bufs map[*engineRank]*fusedRank) (*fusedData, error) {
	seed := e.rng.Uint64()
	if e.cfg.Proc != nil {
		h := fnv.New64a()
		fmt.Fprintf(h, "fused %+v", c)
		seed = h.Sum64()
	}
	count := c.Rows * c.Hidden
	d := &fusedData{inputs: make([][]byte, e.world)}
	var wg sync.WaitGroup
	for r := range d.inputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.inputs[r] = ref.Activations(rand.New(rand.NewPCG(seed, uint64(r))), c.DType, count, 1)
		}()
	}
	// The scales of newFusedCase in collective's tests: a residual that dominates the
	// layer's output, a gamma around 1.
	d.residual = ref.Activations(rand.New(rand.NewPCG(seed, uint64(e.world))), c.DType, count, 4)
	d.gamma = ref.Activations(rand.New(rand.NewPCG(seed, uint64(e.world+1))), c.DType, c.Hidden, 1.5)
	wg.Wait()
	for i, r := range e.ranks {
		dctx, b := r.context(), bufs[r]
		for _, up := range []struct {
			ptr  driver.DevicePtr
			data []byte
		}{{r.in, d.inputs[e.first+i]}, {b.residual, d.residual}, {b.gamma, d.gamma}} {
			if err := dctx.CopyHtoD(up.ptr, up.data); err != nil {
				return nil, err
			}
		}
		// All-ones bits are a NaN in every element type.
		if err := dctx.MemsetD8(r.out, 0xFF, uint64(len(d.residual))); err != nil {
			return nil, err
		}
	}
	return d, e.poisonOutputs(c, bufs)
}

// poisonOutputs fills both out-of-place outputs of every rank with NaNs.
func (e *gpuEngine) poisonOutputs(c FusedCase, bufs map[*engineRank]*fusedRank) error {
	n := uint64(c.Rows * c.Hidden * c.DType.Size())
	for _, r := range e.ranks {
		for _, p := range []driver.DevicePtr{bufs[r].residOut, bufs[r].normOut} {
			if err := r.context().MemsetD8(p, 0xFF, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// fusedReference is ref.Fused for the case, summing the ranks in the order of path.
func fusedReference(c FusedCase, path collective.Algorithm) ref.Fused {
	order := ref.FusedOneShot
	switch path {
	case collective.TwoShot:
		order = ref.FusedTwoShot
	case collective.Push:
		order = ref.FusedPush
	}
	return ref.Fused{DType: c.DType, Algo: order, Hidden: c.Hidden, Eps: c.Eps,
		Threads: ptx.FusedThreads(c.Hidden * c.DType.Size() / ptx.VectorBytes)}
}

// countWrong compares got with want bitwise and adds the result to m, as the first
// mismatch where it is the first.
func countWrong(c FusedCase, m *FusedMeasurement, call, output string, rank int, want, got []byte) {
	n, first := ref.Compare(c.DType, want, got)
	if call == "fused" {
		m.FusedWrong += int64(n)
	} else {
		m.UnfusedWrong += int64(n)
	}
	if first != nil && m.First == nil {
		m.First = &FusedMismatch{Call: call, Output: output, Mismatch: Mismatch{Rank: rank, Index: int64(first.Index),
			Expected: ref.Format(c.DType, first.Want), Got: ref.Format(c.DType, first.Got)}}
	}
}

// compareFused reads every rank's fused outputs back and compares them bitwise with the
// reference of path (and so with each other).
func (e *gpuEngine) compareFused(c FusedCase, path collective.Algorithm, d *fusedData, bufs map[*engineRank]*fusedRank, m *FusedMeasurement) error {
	wantR, wantN, err := fusedReference(c, path).Run(d.inputs, d.residual, d.gamma)
	if err != nil {
		return err
	}
	got := make([]byte, len(wantR))
	for i, r := range e.ranks {
		for _, out := range []struct {
			name string
			ptr  driver.DevicePtr
			want []byte
		}{{"ResidualOut", bufs[r].residOut, wantR}, {"NormOut", bufs[r].normOut, wantN}} {
			if err := r.context().CopyDtoH(got, out.ptr); err != nil {
				return err
			}
			countWrong(c, m, "fused", out.name, e.first+i, out.want, got)
		}
	}
	return nil
}

// comparePair checks the unfused pair on every rank: its sum against the reference of path
// (bitwise for goccl's kernels, within NCCL's tolerance for NCCL), and its outputs bitwise
// against the single-input reference over the sum that the rank got.
func (e *gpuEngine) comparePair(c FusedCase, path collective.Algorithm, d *fusedData, bufs map[*engineRank]*fusedRank, m *FusedMeasurement) error {
	sums := make([][]byte, len(e.ranks))
	ranks := make([]int, len(e.ranks))
	for i, r := range e.ranks {
		sums[i], ranks[i] = make([]byte, len(d.residual)), e.first+i
		if err := r.context().CopyDtoH(sums[i], r.out); err != nil {
			return err
		}
	}
	if path == collective.NCCL {
		wrong, first := checkNCCL(c.DType, d.inputs, sums, ranks)
		m.UnfusedWrong += wrong
		if first != nil && m.First == nil {
			m.First = &FusedMismatch{Call: "unfused", Output: "sum", Mismatch: *first}
		}
	} else {
		var want []byte
		var err error
		switch path {
		case collective.OneShot:
			want, err = ref.OneShot(c.DType, d.inputs)
		case collective.TwoShot:
			want, err = ref.TwoShot(c.DType, d.inputs)
		case collective.Push:
			want, err = ref.Push(c.DType, d.inputs)
		default:
			err = fmt.Errorf("no reference for algorithm %v", path)
		}
		if err != nil {
			return err
		}
		for i, sum := range sums {
			countWrong(c, m, "unfused", "sum", ranks[i], want, sum)
		}
	}
	norm := fusedReference(c, collective.OneShot)
	var wantR, wantN []byte
	got := make([]byte, len(d.residual))
	for i, r := range e.ranks {
		// The ranks' sums are equal (bitwise for goccl's kernels): one reference serves them.
		if i == 0 || !bytes.Equal(sums[i], sums[i-1]) {
			var err error
			if wantR, wantN, err = norm.Run([][]byte{sums[i]}, d.residual, d.gamma); err != nil {
				return err
			}
		}
		for _, out := range []struct {
			name string
			ptr  driver.DevicePtr
			want []byte
		}{{"ResidualOut", bufs[r].residOut, wantR}, {"NormOut", bufs[r].normOut, wantN}} {
			if err := r.context().CopyDtoH(got, out.ptr); err != nil {
				return err
			}
			countWrong(c, m, "unfused", out.name, ranks[i], out.want, got)
		}
	}
	return nil
}

// timeCalls times c.Iters calls of call on every rank, after c.Warmup untimed ones, eagerly
// or in one graph per rank, as all-reduces are timed (timeRanks).
func (e *gpuEngine) timeCalls(ctx context.Context, c FusedCase, call func(r *engineRank) error) (time.Duration, error) {
	return e.timeRanks(ctx, c.Backend, c.Graph, c.Warmup, c.Iters, call)
}
