package main

// This file binds arsmoke to the GPU: the engine on collective/ and the topology printer on
// internal/topology.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/internal/ref"
	"github.com/goccl/goccl/internal/topology"
	"github.com/goccl/goccl/nccl"
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

// ncclLoads says whether this process can load libnccl (planEngine).
var ncclLoads = func() bool { return nccl.Load() == nil }

// gpuEngine runs arsmoke's cases on the ranks of one process: all of them (collective.
// NewGroup, possibly virtual ranks) or one (a --procs child, collective.New). Each rank has
// up to two communicators (see planEngine) sharing its stream and buffers.
type gpuEngine struct {
	cfg     engineConfig
	world   int // ranks in the communicator, all processes
	first   int // rank of ranks[0]
	ranks   []*engineRank
	header  Header
	rng     *rand.Rand
	sockets int // bootstrap sockets used so far, in a --procs child
}

// engineRank is one rank's communicators, stream and buffers.
type engineRank struct {
	goccl      *collective.Comm // goccl's kernels (Case.Backend "goccl"); nil with --backend nccl
	nccl       *collective.Comm // every call through NCCL; nil with --backend goccl
	stream     *driver.Stream
	in, out    driver.DevicePtr
	start, end *driver.Event     // timing on the rank's own stream
	graph      *collective.Graph // timeRanks' capture, closed when it returns
	// regs are in's and out's registrations with goccl: released before the buffers are
	// freed, as collective asks.
	regs []*collective.Registration
}

// register registers the rank's input and output (n bytes each) with its kernels'
// communicator, in that order on every rank (Register is a collective call).
func (r *engineRank) register(ctx context.Context, n uint64) error {
	for _, p := range []driver.DevicePtr{r.in, r.out} {
		reg, err := r.goccl.Register(ctx, p, n)
		if err != nil {
			return err
		}
		r.regs = append(r.regs, reg)
	}
	return nil
}

// releaseRegs releases the rank's registrations.
func (r *engineRank) releaseRegs() error {
	var errs []error
	for _, reg := range r.regs {
		errs = append(errs, reg.Release())
	}
	r.regs = nil
	return errors.Join(errs...)
}

// comm returns the rank's communicator of backend.
func (r *engineRank) comm(backend string) *collective.Comm {
	if backend == backendNCCL {
		return r.nccl
	}
	return r.goccl
}

// context is the rank's CUDA context, which both communicators share (the device's primary
// context).
func (r *engineRank) context() *driver.Context {
	if r.goccl != nil {
		return r.goccl.Context()
	}
	return r.nccl.Context()
}

// hasNCCL reports whether c has NCCL: the selection hands NCCL the calls past MaxBytes when
// it does.
func hasNCCL(c *collective.Comm) bool { return c.Selected(math.MaxInt64, true) == collective.NCCL }

// kernelsServe reports whether goccl's kernels serve c: NCCL takes even the smallest call of
// a communicator they cannot serve.
func kernelsServe(c *collective.Comm) bool { return c.Selected(16, true) != collective.NCCL }

func newGPUEngine(ctx context.Context, cfg engineConfig) (_ *gpuEngine, err error) {
	e := &gpuEngine{cfg: cfg, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if spec := cfg.Goccl; spec != nil {
		// Each graph's buffers take registration slots until the graph is closed.
		opts := collective.Options{MaxBytes: spec.MaxBytes, PushMaxBytes: spec.PushMaxBytes, NCCL: spec.NCCL, Timeout: cfg.Timeout}
		comms, err := e.communicators(ctx, opts)
		if err != nil {
			return nil, err
		}
		if opts.NCCL == collective.NCCLAuto && opts.MaxBytes < cfg.MaxBytes && !hasNCCL(comms[0]) {
			// NCCL could not be initialised after all (every rank sees the same): the
			// kernels take every size instead.
			closeAll(comms)
			opts.MaxBytes, opts.PushMaxBytes, opts.NCCL = cfg.MaxBytes, 0, collective.NCCLOff
			if comms, err = e.communicators(ctx, opts); err != nil {
				return nil, err
			}
		}
		for i, c := range comms {
			e.rank(i).goccl = c
		}
	}
	if cfg.NCCL {
		// Its kernels are never called: the smallest arena.
		opts := collective.Options{MaxBytes: 16, NCCL: collective.NCCLAlways, Timeout: cfg.Timeout}
		comms, err := e.communicators(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("the NCCL communicator: %w", err)
		}
		for i, c := range comms {
			e.rank(i).nccl = c
		}
	}
	for i, r := range e.ranks {
		if err := r.alloc(uint64(cfg.MaxBytes)); err != nil {
			return nil, fmt.Errorf("rank %d: %w", e.first+i, err)
		}
	}
	// Inputs and outputs are registered once with the kernels' communicator, so pull
	// all-reduces read the inputs in place (zero copy; in place, OneShot goes through the
	// staging buffer, as in an application) and TwoShot writes straight into every rank's
	// output. NCCL needs no registration.
	if r0 := e.ranks[0]; r0.goccl != nil && kernelsServe(r0.goccl) {
		rctx, cancel := context.WithTimeout(ctx, cfg.Timeout+30*time.Second)
		defer cancel()
		if err := e.parallel(func(r *engineRank) error {
			return r.register(rctx, uint64(cfg.MaxBytes))
		}); err != nil {
			return nil, fmt.Errorf("register the input and output buffers: %w", err)
		}
	}
	return e, e.describe()
}

// rank returns the i-th rank this process drives, adding it on first use.
func (e *gpuEngine) rank(i int) *engineRank {
	for len(e.ranks) <= i {
		e.ranks = append(e.ranks, &engineRank{})
	}
	return e.ranks[i]
}

// communicators creates one communicator over the ranks of this process: with the others
// through a new Unix-socket bootstrap in a --procs child, or all of them with NewGroup.
func (e *gpuEngine) communicators(ctx context.Context, opts collective.Options) ([]*collective.Comm, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout+30*time.Second)
	defer cancel()
	if p := e.cfg.Proc; p != nil {
		e.world, e.first = p.World, p.Rank
		sock := p.socket(e.sockets)
		e.sockets++
		boot, err := bootstrap.NewUnix(ctx, sock, p.Rank, p.World)
		if err != nil {
			return nil, err
		}
		c, err := collective.New(ctx, e.cfg.Devices[0], boot, opts)
		if err != nil {
			return nil, err
		}
		return []*collective.Comm{c}, nil
	}
	comms, err := collective.NewGroup(ctx, e.cfg.Devices, opts)
	e.world = len(e.cfg.Devices)
	return comms, err
}

func (r *engineRank) alloc(bytes uint64) (err error) {
	c := r.context()
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
	if r0 := e.ranks[0]; r0.nccl != nil || hasNCCL(r0.goccl) {
		if v, err := nccl.LibraryVersion(); err == nil {
			e.header.NCCL = v.String()
		}
	}
	for i, r := range e.ranks {
		dev := r.context().Device()
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
	var m Measurement
	comm := e.ranks[0].comm(c.Backend)
	if comm == nil {
		return m, fmt.Errorf("no %s communicator in this run", c.Backend)
	}
	algo, err := collective.ParseAlgorithm(c.Algo)
	if err != nil {
		return m, err
	}
	// The algorithm of the eager check and, for -g, of the captured calls: a tuning table may
	// choose differently for graphs, and each result is compared with the reference of the
	// kernel that produced it.
	path, graphPath := algo, algo
	if algo == collective.Auto {
		// both buffers are registered (and a graph shares its outputs anyway)
		path = comm.SelectedFor(c.Bytes, collective.CallKind{SharedOutput: true, InPlace: c.InPlace})
		graphPath = comm.SelectedFor(c.Bytes, collective.CallKind{Captured: true, InPlace: c.InPlace})
	}
	m.Path = path.String()
	if c.Graph {
		m.Path = graphPath.String()
	}
	count := int(c.Bytes) / c.DType.Size()
	inputs, err := e.fill(c) // fresh data every case, also when not checking: never time zeros
	if err != nil {
		return m, err
	}
	if c.Check {
		// One all-reduce on fresh inputs into poisoned outputs, compared with the reference
		// of what ran.
		if err := e.eager(algo, c, count, 1); err != nil {
			return m, err
		}
		if err := e.wait(ctx); err != nil {
			return m, err
		}
		if err := e.compare(c, path, inputs, &m); err != nil {
			return m, err
		}
	}
	if c.Graph {
		if c.Check && !c.InPlace {
			// The replays are checked too: an output the eager call left correct would pass
			// for elements the graph's kernels never write.
			if err := e.poison(c); err != nil {
				return m, err
			}
		}
		m.Time, err = e.timeGraph(ctx, algo, c, count)
	} else {
		m.Time, err = e.timeEager(ctx, algo, c, count)
	}
	if err != nil {
		return m, err
	}
	if c.Check && c.Graph && !c.InPlace {
		// Out of place the inputs survive the replays: the graph's result must be the same.
		// An element wrong in both checks is one wrong element: the row takes the larger
		// count, never the sum, which could pass the number of elements.
		var replayed Measurement
		if err := e.compare(c, graphPath, inputs, &replayed); err != nil {
			return m, err
		}
		m.Wrong = max(m.Wrong, replayed.Wrong)
		if m.First == nil {
			m.First = replayed.First
		}
	}
	return m, nil
}

// fill writes fresh random inputs and poisons the outputs. In a --procs child every process
// derives every rank's input from a seed they share, so each can compute the reference.
func (e *gpuEngine) fill(c Case) ([][]byte, error) {
	seed := e.rng.Uint64()
	if e.cfg.Proc != nil {
		h := fnv.New64a()
		fmt.Fprintf(h, "%+v", c)
		seed = h.Sum64()
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
		if err := r.context().CopyHtoD(r.in, inputs[e.first+i]); err != nil {
			return nil, err
		}
	}
	if !c.InPlace {
		if err := e.poison(c); err != nil {
			return nil, err
		}
	}
	return inputs, nil
}

// poison fills every rank's output with all-ones bits, a NaN in every dtype, so that an
// element no kernel wrote cannot pass the check.
func (e *gpuEngine) poison(c Case) error {
	for _, r := range e.ranks {
		if err := r.context().MemsetD8(r.out, 0xFF, uint64(c.Bytes)); err != nil {
			return err
		}
	}
	return nil
}

// compare reads every rank's output back and counts the elements that are wrong: for
// goccl's kernels, those that differ from the reference of the algorithm that ran (and hence
// from each other); for NCCL, those outside its tolerance (checkNCCL).
func (e *gpuEngine) compare(c Case, path collective.Algorithm, inputs [][]byte, m *Measurement) error {
	read := func(i int, got []byte) error {
		r := e.ranks[i]
		src := r.out
		if c.InPlace {
			src = r.in
		}
		return r.context().CopyDtoH(got, src)
	}
	if path == collective.NCCL {
		// The reference is computed once for every output this process holds.
		outputs := make([][]byte, len(e.ranks))
		ranks := make([]int, len(e.ranks))
		for i := range e.ranks {
			outputs[i], ranks[i] = make([]byte, c.Bytes), e.first+i
			if err := read(i, outputs[i]); err != nil {
				return err
			}
		}
		wrong, first := checkNCCL(c.DType, inputs, outputs, ranks)
		m.Wrong += wrong
		if m.First == nil {
			m.First = first
		}
		return nil
	}
	var want []byte
	var err error
	switch path {
	case collective.OneShot:
		want, err = ref.OneShot(c.DType, inputs)
	case collective.TwoShot:
		want, err = ref.TwoShot(c.DType, inputs)
	case collective.Push:
		want, err = ref.Push(c.DType, inputs)
	default:
		err = fmt.Errorf("no reference for algorithm %v", path)
	}
	if err != nil {
		return err
	}
	got := make([]byte, c.Bytes)
	for i := range e.ranks {
		if err := read(i, got); err != nil {
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
	call := e.allReduce(algo, c, count)
	return e.parallel(func(r *engineRank) error {
		for range n {
			if err := call(r); err != nil {
				return err
			}
		}
		return nil
	})
}

// timeEager times Iters eager all-reduces per rank (timeRanks).
func (e *gpuEngine) timeEager(ctx context.Context, algo collective.Algorithm, c Case, count int) (time.Duration, error) {
	return e.timeRanks(ctx, c.Backend, false, c.Warmup, c.Iters, e.allReduce(algo, c, count))
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
	return e.timeRanks(ctx, c.Backend, true, c.Warmup, c.Iters, e.allReduce(algo, c, count))
}

// allReduce returns one all-reduce of the case on a rank.
func (e *gpuEngine) allReduce(algo collective.Algorithm, c Case, count int) func(r *engineRank) error {
	return func(r *engineRank) error {
		dst := r.out
		if c.InPlace {
			dst = r.in
		}
		return r.comm(c.Backend).AllReduceWith(r.stream, dst, r.in, count, c.DType, algo)
	}
}

// timeRanks times iters calls of call on every rank, each rank from its own goroutine, with
// events on the rank's stream; the slowest rank's mean is the result. Graphs are captured
// through backend's communicator. Eagerly: warmup untimed calls, then iters timed ones. With
// graph: iters calls captured into one CUDA graph per rank (Comm.Capture, as each process of
// a real job would), replayed untimed for the warm-up (graphReplays), then once timed.
//
// Each rank's goroutine enqueues its warm-up and its timed pass in one go, so that its start
// event fires when its warm-up ends on the GPU rather than when the goroutine reaches the
// driver. The ranks' warm-ups end together (their kernels wait for each other); the
// goroutines' launches do not (with virtual ranks they take turns in one process's driver),
// and a start event recorded on an idle stream would put into the slowest rank's time how
// much later its peers' first calls were issued, spread over the iters calls. With no
// warm-up (-w 0) the streams are idle and the timed pass includes that again.
func (e *gpuEngine) timeRanks(ctx context.Context, backend string, graph bool, warmup, iters int, call func(r *engineRank) error) (time.Duration, error) {
	calls := func(r *engineRank, n int) error {
		for range n {
			if err := call(r); err != nil {
				return err
			}
		}
		return nil
	}
	// run enqueues on every rank untimed units of work, then timed more between the rank's
	// events (a unit is a call, or a graph replay), and waits for all of it.
	run := func(untimed int, unit func(r *engineRank, n int) error, timed int) error {
		err := e.parallel(func(r *engineRank) error {
			if err := unit(r, untimed); err != nil {
				return err
			}
			if err := r.start.Record(r.stream); err != nil {
				return err
			}
			if err := unit(r, timed); err != nil {
				return err
			}
			return r.end.Record(r.stream)
		})
		if err != nil {
			return err
		}
		return e.wait(ctx)
	}
	if !graph {
		if err := run(warmup, calls, iters); err != nil {
			return 0, err
		}
		return e.slowest(iters)
	}
	defer func() {
		for _, r := range e.ranks {
			if r.graph != nil {
				r.graph.Close()
				r.graph = nil
			}
		}
	}()
	err := e.parallel(func(r *engineRank) error {
		var err error
		r.graph, err = r.comm(backend).Capture(ctx, r.stream, func() error { return calls(r, iters) })
		return err
	})
	if err != nil {
		return 0, err
	}
	replays := func(r *engineRank, n int) error {
		for range n {
			if err := r.graph.Launch(r.stream); err != nil {
				return err
			}
		}
		return nil
	}
	if err := run(graphReplays(warmup, iters), replays, 1); err != nil {
		return 0, err
	}
	return e.slowest(iters)
}

// graphReplays is how many untimed replays of the timed graph of iters all-reduces make at
// least warmup warm-up all-reduces: warmup rounded up to whole graphs, none for none. The
// warm-up replays the timed graph itself because a graph's first launch also uploads it to
// the GPU, which the timed launch should not pay.
func graphReplays(warmup, iters int) int {
	return (warmup + iters - 1) / iters
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
		for _, c := range []*collective.Comm{r.goccl, r.nccl} {
			if c == nil {
				continue
			}
			if err := c.Err(); err != nil {
				return err
			}
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
	if err := waitIdle(e.streams(), e.cfg.Timeout); err != nil {
		return fmt.Errorf("close: all-reduces still running, GPU memory left allocated: %w", err)
	}
	var errs []error
	for _, r := range e.ranks {
		if r.goccl == nil && r.nccl == nil {
			continue // a rank whose communicators were never made has nothing else
		}
		c := r.context()
		errs = append(errs, r.releaseRegs())
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
	}
	var kernelComms, ncclComms []*collective.Comm
	for _, r := range e.ranks {
		kernelComms, ncclComms = append(kernelComms, r.goccl), append(ncclComms, r.nccl)
	}
	errs = append(errs, closeAll(kernelComms), closeAll(ncclComms))
	return errors.Join(errs...)
}

// closeAll closes the communicators (nil ones skipped) of the ranks of this process at once:
// NCCL's finalisation waits for the peers' ranks, which would wait for each other if closed one
// after the other.
func closeAll(comms []*collective.Comm) error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Close()
		}()
	}
	wg.Wait()
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

// waitIdle waits for streams before their buffers are freed, for at most twice the watchdog's
// timeout and 10 s more: a kernel still running after that is stuck, and freeing memory under
// it would block, so the caller leaves that memory allocated and says so.
func waitIdle(streams []*driver.Stream, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*timeout+10*time.Second)
	defer cancel()
	for _, s := range streams {
		if err := s.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}
