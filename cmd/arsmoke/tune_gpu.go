package main

// The GPU side of --tune: communicators of every grid on the ranks of one world size, timed
// with the sweep's timing code (gpuEngine's timeEager and timeGraph) and checked bitwise
// against internal/ref like every arsmoke result.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
)

// gpuTuner is the tuneRunner on GPUs. An anchor communicator with the default grid and the
// built-in selection lives as long as the tuner: it says what the table is keyed by and what
// the built-in selection picks, and keeps the kernels compiled while the grids' communicators
// come and go. Each grid gets its communicators and two sets of buffers: registered ones
// (reg: graphs and eager calls on registered buffers) and plain ones (eager calls that stage
// their input). The inputs are random, the same for every grid and size (a prefix of each
// rank's), and are never overwritten (every call is out of place); the outputs are poisoned
// before each case and compared with the reference afterwards.
type gpuTuner struct {
	cfg           engineConfig
	dt            dtype.DType
	iters, warmup int
	sockets       int // bootstrap sockets used so far, in a --procs child
	world, first  int
	anchor        []*collective.Comm
	target        collective.TuneTarget
	inputs        [][]byte // every rank's input, cfg.MaxBytes each
	refs          map[refKey][]byte
	reg, plain    *gpuEngine // the open grid's; nil when none is open
}

// refKey names a reference result: one algorithm's sum of the first bytes of the inputs.
type refKey struct {
	algo  collective.Algorithm
	bytes int64
}

func newGPUTuner(ctx context.Context, cfg engineConfig, dt dtype.DType, iters, warmup int) (_ *gpuTuner, err error) {
	t := &gpuTuner{cfg: cfg, dt: dt, iters: iters, warmup: warmup, refs: map[refKey][]byte{}}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	if t.anchor, err = t.communicators(ctx, tuneGrid{}); err != nil {
		return nil, err
	}
	if t.target, err = t.anchor[0].TuneTarget(ctx); err != nil {
		return nil, err
	}
	// Every process derives every rank's input from the world size, so that each can compute
	// the reference of what it reads back.
	t.inputs = make([][]byte, t.world)
	var wg sync.WaitGroup
	for r := range t.inputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.inputs[r] = ref.Random(rand.New(rand.NewPCG(uint64(t.world), uint64(r))), dt, int(cfg.MaxBytes))
		}()
	}
	wg.Wait()
	return t, nil
}

// communicators creates the communicators of grid g (the zero grid: the defaults) over the
// tuner's ranks, with the built-in selection: the table being measured must not measure
// itself.
func (t *gpuTuner) communicators(ctx context.Context, g tuneGrid) ([]*collective.Comm, error) {
	e := &gpuEngine{cfg: t.cfg, sockets: t.sockets}
	comms, err := e.communicators(ctx, collective.Options{MaxBytes: t.cfg.MaxBytes, Blocks: g.Blocks, PushBlocks: g.PushBlocks,
		ThreadsPerBlock: g.Threads, NCCL: collective.NCCLOff, NoTune: true, Timeout: t.cfg.Timeout})
	t.sockets, t.world, t.first = e.sockets, e.world, e.first
	return comms, err
}

// Target says what the section is keyed by.
func (t *gpuTuner) Target() collective.TuneTarget { return t.target }

// Builtin asks the anchor what the built-in selection picks.
func (t *gpuTuner) Builtin(m tuneMode, bytes int64) collective.Algorithm {
	return t.anchor[0].Selected(bytes, m != modeEager)
}

// Open makes grid g's communicators and buffers, closing the previous grid's.
func (t *gpuTuner) Open(ctx context.Context, g tuneGrid) (err error) {
	if err := t.closeGrid(); err != nil {
		return err
	}
	comms, err := t.communicators(ctx, g)
	if err != nil {
		return err
	}
	reg := &gpuEngine{cfg: t.cfg, world: t.world, first: t.first}
	plain := &gpuEngine{cfg: t.cfg, world: t.world, first: t.first}
	for i, c := range comms {
		reg.rank(i).goccl = c
	}
	t.reg, t.plain = reg, plain
	defer func() {
		if err != nil {
			err = errors.Join(err, t.closeGrid())
		}
	}()
	n := uint64(t.cfg.MaxBytes)
	for i, r := range reg.ranks {
		if err := r.alloc(n); err != nil {
			return err
		}
		// The plain buffers share the rank's stream and events; closeGrid frees them first.
		p := plain.rank(i)
		p.goccl, p.stream, p.start, p.end = r.goccl, r.stream, r.start, r.end
		if p.in, err = r.context().Alloc(n); err != nil {
			return err
		}
		if p.out, err = r.context().Alloc(n); err != nil {
			return err
		}
		for _, in := range []driver.DevicePtr{r.in, p.in} {
			if err := r.context().CopyHtoD(in, t.inputs[t.first+i]); err != nil {
				return err
			}
		}
	}
	rctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout+30*time.Second)
	defer cancel()
	return reg.parallel(func(r *engineRank) error {
		return r.register(rctx, n)
	})
}

// Time measures one case: outputs poisoned, the warm-up and timed calls (eager, or one graph
// per rank), then every output this process holds compared with the reference.
func (t *gpuTuner) Time(ctx context.Context, tc tuneCase) (time.Duration, error) {
	e := t.reg
	if tc.Mode == modeEager {
		e = t.plain
	}
	if e == nil {
		return 0, errors.New("no grid open")
	}
	c := Case{Bytes: tc.Bytes, DType: t.dt, Backend: backendGoccl, Algo: tc.Algo.String(), Graph: tc.Mode == modeGraph,
		Iters: t.iters, Warmup: t.warmup, Check: true}
	for _, r := range e.ranks {
		// All-ones bits are a NaN in every dtype: an element no call wrote cannot pass.
		if err := r.context().MemsetD8(r.out, 0xFF, uint64(tc.Bytes)); err != nil {
			return 0, err
		}
	}
	count := int(tc.Bytes) / t.dt.Size()
	var d time.Duration
	var err error
	if c.Graph {
		d, err = e.timeGraph(ctx, tc.Algo, c, count)
	} else {
		d, err = e.timeEager(ctx, tc.Algo, c, count)
	}
	if err != nil {
		return 0, err
	}
	return d, t.check(e, tc)
}

// check compares every output this process holds with the reference of the algorithm that
// ran; any wrong element is an error that names the first.
func (t *gpuTuner) check(e *gpuEngine, tc tuneCase) error {
	k := refKey{tc.Algo, tc.Bytes}
	want, ok := t.refs[k]
	if !ok {
		in := make([][]byte, len(t.inputs))
		for r := range in {
			in[r] = t.inputs[r][:tc.Bytes]
		}
		var err error
		switch tc.Algo {
		case collective.OneShot:
			want, err = ref.OneShot(t.dt, in)
		case collective.TwoShot:
			want, err = ref.TwoShot(t.dt, in)
		case collective.Push:
			want, err = ref.Push(t.dt, in)
		default:
			err = fmt.Errorf("no reference for algorithm %v", tc.Algo)
		}
		if err != nil {
			return err
		}
		t.refs[k] = want
	}
	got := make([]byte, tc.Bytes)
	var wrong int
	var first string
	for i, r := range e.ranks {
		if err := r.context().CopyDtoH(got, r.out); err != nil {
			return err
		}
		n, m := ref.Compare(t.dt, want, got)
		if n > 0 && first == "" {
			first = fmt.Sprintf("rank %d, element %d: expected %s, got %s", t.first+i, m.Index, ref.Format(t.dt, m.Want), ref.Format(t.dt, m.Got))
		}
		wrong += n
	}
	if wrong > 0 {
		return fmt.Errorf("%d wrong elements; first: %s", wrong, first)
	}
	return nil
}

// closeGrid releases the open grid: the plain buffers, then the registered ones with the
// streams, events and communicators (gpuEngine.Close).
func (t *gpuTuner) closeGrid() error {
	if t.reg == nil {
		return nil
	}
	reg, plain := t.reg, t.plain
	t.reg, t.plain = nil, nil
	// Nothing may still read the plain buffers: wait for the streams first (Close would).
	if err := waitIdle(reg.streams(), t.cfg.Timeout); err != nil {
		return fmt.Errorf("all-reduces still running, GPU memory left allocated: %w", err)
	}
	var errs []error
	for _, p := range plain.ranks {
		for _, ptr := range []driver.DevicePtr{p.in, p.out} {
			if ptr != 0 {
				errs = append(errs, p.context().Free(ptr))
			}
		}
	}
	errs = append(errs, reg.Close())
	return errors.Join(errs...)
}

// Close releases the open grid and the anchor.
func (t *gpuTuner) Close() error {
	return errors.Join(t.closeGrid(), closeAll(t.anchor))
}
