package main

// This file binds arsmoke to the GPU: the engine on collective/ and the topology printer on
// internal/topology.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/internal/ref"
	"github.com/goccl/goccl/internal/topology"
)

// errNoDriver is the error countDevices wraps when libcuda.so.1 cannot be loaded;
// arsmoke then hints at GOCCL_LIBCUDA.
var errNoDriver = driver.ErrNoDriver

// countDevices returns the number of visible CUDA devices; no device is (0, nil).
var countDevices = func() (int, error) {
	if err := driver.Init(); err != nil {
		if errors.Is(err, driver.ErrNoDevice) {
			return 0, nil
		}
		return 0, err
	}
	return driver.DeviceCount()
}

// newEngine builds the engine for cfg.
var newEngine = func(ctx context.Context, cfg engineConfig) (engine, error) { return newGPUEngine(ctx, cfg) }

// showTopo prints the GPUs, their links and the result of a real peer check (--topo).
var showTopo = func(ctx context.Context, w io.Writer) error {
	t, err := topology.Discover(ctx, topology.Options{CheckP2P: true})
	if err != nil {
		return err
	}
	return t.Render(w)
}

// gpuEngine runs arsmoke's cases on the ranks of one process: all of them (collective.
// NewGroup, possibly virtual ranks) or one (a --procs child, collective.New).
type gpuEngine struct {
	cfg    engineConfig
	world  int // ranks in the communicator, all processes
	first  int // rank of ranks[0]
	ranks  []*engineRank
	header Header
	rng    *rand.Rand
}

// engineRank is one rank's communicator, stream and buffers.
type engineRank struct {
	comm       *collective.Comm
	stream     *driver.Stream
	in, out    driver.DevicePtr
	start, end *driver.Event     // timing on the rank's own stream
	graph      *collective.Graph // timeGraph's capture, closed when it returns
}

func newGPUEngine(ctx context.Context, cfg engineConfig) (_ *gpuEngine, err error) {
	// Push takes every size of the sweep, so that -a push and -a all can measure it anywhere.
	maxBytes := max(cfg.MaxBytes, 16)
	// Each graph's buffers take registration slots until the graph is closed.
	opts := collective.Options{MaxBytes: maxBytes, PushMaxBytes: maxBytes, Timeout: cfg.Timeout}
	e := &gpuEngine{cfg: cfg, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	var comms []*collective.Comm
	bctx, cancel := context.WithTimeout(ctx, cfg.Timeout+30*time.Second)
	defer cancel()
	if cfg.Proc != nil {
		boot, err := bootstrap.NewUnix(bctx, cfg.Proc.Socket, cfg.Proc.Rank, cfg.Proc.World)
		if err != nil {
			return nil, err
		}
		c, err := collective.New(bctx, cfg.Devices[0], boot, opts)
		if err != nil {
			return nil, err
		}
		comms, e.world, e.first = []*collective.Comm{c}, cfg.Proc.World, cfg.Proc.Rank
	} else {
		if comms, err = collective.NewGroup(bctx, cfg.Devices, opts); err != nil {
			return nil, err
		}
		e.world = len(comms)
	}
	for _, c := range comms {
		r := &engineRank{comm: c}
		e.ranks = append(e.ranks, r)
		if err := r.alloc(uint64(opts.MaxBytes)); err != nil {
			return nil, fmt.Errorf("rank %d: %w", c.Rank(), err)
		}
	}
	// Inputs and outputs are registered once, so pull all-reduces read the inputs in place
	// (zero copy; in place, OneShot goes through the staging buffer, as in an application) and
	// TwoShot writes straight into every rank's output.
	if err := e.parallel(func(r *engineRank) error {
		if _, err := r.comm.Register(bctx, r.in, uint64(opts.MaxBytes)); err != nil {
			return err
		}
		_, err := r.comm.Register(bctx, r.out, uint64(opts.MaxBytes))
		return err
	}); err != nil {
		return nil, fmt.Errorf("register the input and output buffers: %w", err)
	}
	return e, e.describe()
}

func (r *engineRank) alloc(bytes uint64) (err error) {
	c := r.comm.Context()
	if r.stream, err = c.NewStream(); err != nil {
		return err
	}
	if r.in, err = c.Alloc(bytes); err != nil {
		return err
	}
	if r.out, err = c.Alloc(bytes); err != nil {
		return err
	}
	for _, ev := range []**driver.Event{&r.start, &r.end} {
		if *ev, err = c.NewEvent(true); err != nil {
			return err
		}
	}
	return nil
}

func (e *gpuEngine) describe() error {
	v, err := driver.DriverVersion()
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	e.header = Header{Host: host, Driver: fmt.Sprintf("%d.%d", v/1000, v%1000/10)}
	for i, r := range e.ranks {
		dev := r.comm.Device()
		name, err := dev.Name()
		if err != nil {
			return err
		}
		bus, err := dev.PCIBusID()
		if err != nil {
			return err
		}
		e.header.Devices = append(e.header.Devices, RankDevice{Rank: e.first + i, Pid: os.Getpid(),
			Device: e.cfg.Devices[i], Name: name, BusID: bus})
	}
	return nil
}

// Describe reports the ranks' devices and the driver.
func (e *gpuEngine) Describe() Header { return e.header }

// Run checks one case (if asked) and then times it.
func (e *gpuEngine) Run(ctx context.Context, c Case) (Measurement, error) {
	algo, err := collective.ParseAlgorithm(c.Algo)
	if err != nil {
		return Measurement{}, err
	}
	count := int(c.Bytes) / c.DType.Size()
	var m Measurement
	inputs, err := e.fill(c) // fresh data every case, also when not checking: never time zeros
	if err != nil {
		return m, err
	}
	if c.Check {
		// One all-reduce on fresh inputs into poisoned outputs, compared bitwise with the
		// reference of the algorithm that ran.
		if err := e.eager(algo, c, count, 1); err != nil {
			return m, err
		}
		if err := e.wait(ctx); err != nil {
			return m, err
		}
		if err := e.compare(c, algo, inputs, &m); err != nil {
			return m, err
		}
	}
	if c.Graph {
		m.Time, err = e.timeGraph(ctx, algo, c, count)
	} else {
		m.Time, err = e.timeEager(ctx, algo, c, count)
	}
	if err != nil {
		return m, err
	}
	if c.Check && c.Graph && !c.InPlace {
		// Out of place the inputs survive the replays: the graph's result must be the same.
		if err := e.compare(c, algo, inputs, &m); err != nil {
			return m, err
		}
	}
	return m, nil
}

// fill writes fresh random inputs and poisons the outputs. In a --procs child every process
// derives every rank's input from a seed they share, so each can compute the reference.
func (e *gpuEngine) fill(c Case) ([][]byte, error) {
	seed := e.rng.Uint64()
	if e.cfg.Proc != nil {
		seed = uint64(c.Bytes)*31 + uint64(c.DType)*7 + boolBit(c.InPlace) + uint64(len(c.Algo))*131
	}
	inputs := make([][]byte, e.world)
	var wg sync.WaitGroup
	for r := range inputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inputs[r] = ref.Random(rand.New(rand.NewPCG(seed, uint64(r))), c.DType, int(c.Bytes))
		}()
	}
	wg.Wait()
	for i, r := range e.ranks {
		ctx := r.comm.Context()
		if err := ctx.CopyHtoD(r.in, inputs[e.first+i]); err != nil {
			return nil, err
		}
		if !c.InPlace {
			// All-ones bits are a NaN in every dtype: an element the kernel did not write
			// cannot pass.
			if err := ctx.MemsetD8(r.out, 0xFF, uint64(c.Bytes)); err != nil {
				return nil, err
			}
		}
	}
	return inputs, nil
}

func boolBit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// compare reads every rank's output back and counts the elements that differ from the
// reference of the algorithm the communicator chose (and hence from each other).
func (e *gpuEngine) compare(c Case, algo collective.Algorithm, inputs [][]byte, m *Measurement) error {
	if algo == collective.Auto {
		// both buffers are registered (and a graph shares its outputs anyway)
		algo = e.ranks[0].comm.Selected(c.Bytes, true)
	}
	var want []byte
	var err error
	switch algo {
	case collective.OneShot:
		want, err = ref.OneShot(c.DType, inputs)
	case collective.TwoShot:
		want, err = ref.TwoShot(c.DType, inputs)
	default:
		want, err = ref.Push(c.DType, inputs)
	}
	if err != nil {
		return err
	}
	got := make([]byte, c.Bytes)
	for i, r := range e.ranks {
		src := r.out
		if c.InPlace {
			src = r.in
		}
		if err := r.comm.Context().CopyDtoH(got, src); err != nil {
			return err
		}
		n, first := ref.Compare(c.DType, want, got)
		m.Wrong += int64(n)
		if first != nil && m.First == nil {
			m.First = &Mismatch{Rank: e.first + i, Index: int64(first.Index),
				Expected: ref.Format(c.DType, first.Want), Got: ref.Format(c.DType, first.Got)}
		}
	}
	return nil
}

// eager issues n all-reduces on every rank, each rank from its own goroutine as separate
// processes would.
func (e *gpuEngine) eager(algo collective.Algorithm, c Case, count, n int) error {
	return e.parallel(func(r *engineRank) error {
		dst := r.out
		if c.InPlace {
			dst = r.in
		}
		for range n {
			if err := r.comm.AllReduceWith(r.stream, dst, r.in, count, c.DType, algo); err != nil {
				return err
			}
		}
		return nil
	})
}

// timeEager runs the warm-up, then times Iters eager all-reduces per rank with events on the
// rank's stream; the slowest rank's mean is the result.
func (e *gpuEngine) timeEager(ctx context.Context, algo collective.Algorithm, c Case, count int) (time.Duration, error) {
	if err := e.eager(algo, c, count, c.Warmup); err != nil {
		return 0, err
	}
	if err := e.wait(ctx); err != nil {
		return 0, err
	}
	err := e.parallel(func(r *engineRank) error {
		if err := r.start.Record(r.stream); err != nil {
			return err
		}
		dst := r.out
		if c.InPlace {
			dst = r.in
		}
		for range c.Iters {
			if err := r.comm.AllReduceWith(r.stream, dst, r.in, count, c.DType, algo); err != nil {
				return err
			}
		}
		return r.end.Record(r.stream)
	})
	if err != nil {
		return 0, err
	}
	if err := e.wait(ctx); err != nil {
		return 0, err
	}
	return e.slowest(c.Iters)
}

// timeGraph captures Iters all-reduces into one CUDA graph per rank (Comm.Capture, as each
// process of a real job would) and times the replay of every rank's graph on its own stream;
// the slowest rank's mean is the result.
//
// One graph for all ranks, with an event fork to every rank's stream and a join back around
// each all-reduce (the fork/join harness of collective's BenchmarkAllReduceForkJoin), is not
// used here: the graph executor does not promise to run the ranks' kernels of one all-reduce
// at once, and with virtual ranks a barrier then waits for a peer's kernel queued behind it
// until the watchdog fires. One graph per rank is also what the processes of a real job run.
func (e *gpuEngine) timeGraph(ctx context.Context, algo collective.Algorithm, c Case, count int) (time.Duration, error) {
	defer func() {
		for _, r := range e.ranks {
			if r.graph != nil {
				r.graph.Close()
				r.graph = nil
			}
		}
	}()
	err := e.parallel(func(r *engineRank) error {
		dst := r.out
		if c.InPlace {
			dst = r.in
		}
		var err error
		r.graph, err = r.comm.Capture(ctx, r.stream, func() error {
			for range c.Iters {
				if err := r.comm.AllReduceWith(r.stream, dst, r.in, count, c.DType, algo); err != nil {
					return err
				}
			}
			return nil
		})
		return err
	})
	if err != nil {
		return 0, err
	}
	// Warm-up replays, then one timed replay per rank, each rank from its own goroutine.
	replay := func(timed bool) error {
		return e.parallel(func(r *engineRank) error {
			if timed {
				if err := r.start.Record(r.stream); err != nil {
					return err
				}
			}
			if err := r.graph.Launch(r.stream); err != nil {
				return err
			}
			if timed {
				return r.end.Record(r.stream)
			}
			return nil
		})
	}
	for range max(1, c.Warmup/c.Iters) {
		if err := replay(false); err != nil {
			return 0, err
		}
	}
	if err := e.wait(ctx); err != nil {
		return 0, err
	}
	if err := replay(true); err != nil {
		return 0, err
	}
	if err := e.wait(ctx); err != nil {
		return 0, err
	}
	return e.slowest(c.Iters)
}

// slowest returns the largest start-to-end time over the ranks, divided by n.
func (e *gpuEngine) slowest(n int) (time.Duration, error) {
	var slowest time.Duration
	for _, r := range e.ranks {
		d, err := driver.Elapsed(r.start, r.end)
		if err != nil {
			return 0, err
		}
		slowest = max(slowest, d)
	}
	return slowest / time.Duration(n), nil
}

// wait waits for every stream, bounded by the watchdog timeout plus slack, and reports a
// kernel's recorded error (a peer that never arrived).
func (e *gpuEngine) wait(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*e.cfg.Timeout+10*time.Second)
	defer cancel()
	for _, s := range e.streams() {
		if err := s.Wait(ctx); err != nil {
			return err
		}
	}
	for _, r := range e.ranks {
		if err := r.comm.Err(); err != nil {
			return err
		}
	}
	return nil
}

// parallel runs fn for every rank in its own goroutine (collective calls block until every
// rank has made them).
func (e *gpuEngine) parallel(fn func(r *engineRank) error) error {
	errs := make([]error, len(e.ranks))
	var wg sync.WaitGroup
	for i, r := range e.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(r)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close releases everything; it tolerates a partly built engine. It waits for the streams
// for a bounded time: if a kernel is still stuck, the memory is left allocated (freeing it
// under a running kernel would block) and the error says so.
func (e *gpuEngine) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*e.cfg.Timeout+10*time.Second)
	defer cancel()
	for _, s := range e.streams() {
		if err := s.Wait(ctx); err != nil {
			return fmt.Errorf("close: all-reduces still running, GPU memory left allocated: %w", err)
		}
	}
	var errs []error
	for _, r := range e.ranks {
		c := r.comm.Context()
		for _, ev := range []*driver.Event{r.start, r.end} {
			if ev != nil {
				errs = append(errs, ev.Close())
			}
		}
		for _, p := range []driver.DevicePtr{r.in, r.out} {
			if p != 0 {
				errs = append(errs, c.Free(p))
			}
		}
		if r.stream != nil {
			errs = append(errs, r.stream.Close())
		}
		errs = append(errs, r.comm.Close())
	}
	return errors.Join(errs...)
}

func (e *gpuEngine) streams() []*driver.Stream {
	var s []*driver.Stream
	for _, r := range e.ranks {
		if r.stream != nil {
			s = append(s, r.stream)
		}
	}
	return s
}
