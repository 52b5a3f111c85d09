package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/ptx"
	"golang.org/x/sys/unix"
)

// Comm is one rank of a communicator: the memory it shares with its peers, the kernels, and
// the state of its registration table. Methods are safe from several goroutines: calls are
// serialised by a mutex (a launch is a few microseconds, so nobody waits long).
type Comm struct {
	mu sync.Mutex

	rank, size int
	dev        driver.Device
	ctx        *driver.Context
	boot       bootstrap.Bootstrap
	opts       Options
	major      int // compute capability of this rank's GPU (with custom kernels, the lowest of the ranks')
	minor      int // its minor part, this rank's GPU's
	kernels    *kernelSet
	scope      ptx.Scope // of the release/acquire barriers: ScopeGPU when every rank is on this GPU
	pdl        bool      // launch with programmatic dependent launch
	earlyRoom  int       // the largest grid that may trigger its dependents early (ptx.EarlyTriggerRoom)
	// heldNorms are the residual add + RMSNorm kernels, by element type, that a communicator
	// NCCL alone serves (it has no kernel set) holds through UnloadKernels (holdModule).
	heldNorms [4]heldNorm
	// earlyAnyGrid lets the kernels that trigger early only after their entry barrier do it at
	// any grid size (ptx.EarlyTriggerAnyGrid); always set, cleared by benchmarks that measure
	// the room rule alone
	earlyAnyGrid bool
	// entryTrigger moves the early trigger of the kernels with an entry barrier to right
	// after it (ptx.FlagEntryTrigger): where at most entryTriggerMaxRanksOnGPU ranks share a
	// GPU; benchmarks set it either way
	entryTrigger bool
	blocks       int  // block limit of OneShot and TwoShot
	pushBlocks   int  // block count of every Push launch
	allLocal     bool // every rank lives in this process
	sharedGPU    bool // some ranks of this process share a GPU (virtual ranks)
	// blocksPerSM is the least occupancy of the plain kernels over the ranks, and ranksOnGPU
	// the most ranks on one GPU: what the grids were capped with (blockCap).
	blocksPerSM, ranksOnGPU int

	layout  arenaLayout
	arena   *memory.Buffer
	peers   []*memory.Mapping        // every rank's arena in this process (own: local)
	peerCtx []*driver.Context        // primary contexts retained for peer access (other devices)
	errRec  *driver.HostBuffer       // the kernels' error record, readable without a sync
	table   *slotTable               // registration table
	opened  map[ipcKey]*openedBuffer // peers' user buffers opened through IPC

	// Kernel arguments that never change, packed once: p_sig and p_buf arrays.
	sig     [8 * ptx.MaxRanks]byte
	tmp     [8 * ptx.MaxRanks]byte
	recv    [8 * ptx.MaxRanks]byte
	timeout uint64

	args driver.Args
	cfg  driver.LaunchConfig

	registered map[driver.DevicePtr]*Registration // buffer -> its registration: zero-copy inputs, direct TwoShot outputs
	graphs     map[*Graph]struct{}                // captured graphs not yet closed
	capture    *captureState                      // non-nil while Capture records
	work       workTracker                        // this rank's queued work, per stream
	pointers   pointerCache                       // allocations already checked as this rank's device memory
	closed     bool                               // Close was called: no new work
	released   bool                               // Close freed everything
	failed     error                              // sticky asynchronous error
	notes      []string                           // what New met without failing (Notes)
	tuning     tuneState                          // the tuning table loaded, and its section in use

	// The engines: custom kernels (custom), and NCCL where nccl is not nil.
	custom      bool
	notEligible string // why NewGroup found the GPUs not eligible ("" if it did not): NCCL alone serves them
	noCustomWhy string // why the custom kernels cannot serve this communicator
	nccl        *ncclEngine
	ncclWhy     string // why there is no NCCL communicator

	// releasePending: a Close asked for everything to be freed, which a Capture recording at
	// the time does once its fn has returned (releasePendingNow).
	releasePending bool

	drainOverride time.Duration // tests: replaces drainLimit
	// tests: replaces judgeTopology, rank 0's check of the ranks' GPUs
	judgeOverride func(context.Context, []rankInfo) (bool, error)

	startupAt time.Time      // when New (NewGroup) began
	startup   StartupProfile // where New spent its time (Startup)
}

type ipcKey struct {
	process uint64 // memory.ProcessID of the owner
	handle  driver.IPCMemHandle
}

// New creates this process's rank of a communicator on the CUDA device with the given
// ordinal. Every rank calls New with the same options; boot connects them (see package
// bootstrap) and is owned by the Comm afterwards: Close closes it, and so does New when it
// fails, so that the other ranks' New fails at once too. New fails, rather than hangs, when a
// rank does not join before ctx ends.
//
// The ranks' GPUs get the policy of NewGroup: rank 0 checks that they reach each other and,
// for more than two, that NVLink links them all. goccl's kernels serve 2 to 16 ranks on one
// host (for a communicator that may use NCCL, NCCL_HOSTID names the host where set, as for
// NCCL itself); NCCL (Options.NCCL) serves
// every call they cannot: past MaxBytes, GPUs that are not eligible, several hosts, one rank
// or more than 16.
func New(ctx context.Context, device int, boot bootstrap.Bootstrap, opts Options) (*Comm, error) {
	return newComm(ctx, device, boot, opts, "", startupStart{at: time.Now()})
}

// newComm is New; notEligible says why the GPUs are not eligible for the custom kernels ("" if
// they are), start
// when New began (and what NewGroup did before).
func newComm(ctx context.Context, device int, boot bootstrap.Bootstrap, opts Options, notEligible string, start startupStart) (c *Comm, err error) {
	if boot == nil {
		return nil, invalid("nil bootstrap")
	}
	// boot is the communicator's from here on, also when New fails: closing it then makes the
	// peers' calls fail at once (bootstrap.ErrPeerLost) rather than wait out their deadlines.
	// After release closes it, this second Close is a no-op (the Bootstrap contract).
	defer func() {
		if err != nil {
			boot.Close()
		}
	}()
	opts, err = opts.withDefaults()
	if err != nil {
		return nil, err
	}
	size, rank := boot.Size(), boot.Rank()
	if size < 1 || rank < 0 || rank >= size {
		// A Bootstrap of the caller's own that breaks its contract: every rank's facts are
		// indexed by rank.
		return nil, invalid("the bootstrap says rank %d of %d ranks: a Bootstrap's Rank is in [0, Size)", rank, size)
	}
	t := time.Now()
	if err := driver.Init(); err != nil {
		return nil, fmt.Errorf("collective: %w", err)
	}
	dev, err := driver.GetDevice(device)
	if err != nil {
		return nil, fmt.Errorf("collective: rank %d: device %d: %w", rank, device, err)
	}
	c = &Comm{rank: rank, size: size, dev: dev, boot: boot, opts: opts,
		registered: map[driver.DevicePtr]*Registration{}, graphs: map[*Graph]struct{}{},
		opened: map[ipcKey]*openedBuffer{}, notEligible: notEligible,
		startupAt: start.at, startup: StartupProfile{Steps: slices.Clone(start.steps), JITWorkers: cap(modules.slots)}}
	t = c.step(StartupDriver, t)
	defer func() {
		if err != nil {
			c.release()
			c = nil
		}
	}()
	if c.ctx, err = driver.PrimaryContext(dev); err != nil {
		return c, fmt.Errorf("collective: rank %d: context of device %d: %w%s", c.rank, device, err, contextHint(err))
	}
	c.step(StartupContext, t)
	c.work = workTracker{ctx: c.ctx, events: map[uintptr]*driver.Event{}}
	if err := c.init(ctx, device); err != nil {
		return c, fmt.Errorf("collective: rank %d: %w", c.rank, err)
	}
	c.startup.Total = time.Since(c.startupAt)
	return c, nil
}

// NewGroup creates a communicator whose ranks all live in this process, one rank per entry
// of devices (CUDA ordinals). A device may repeat: its ranks are virtual ranks that share the
// GPU, each with its own stream, which is how goccl is tested on one GPU. The comms are
// returned in rank order; close each of them.
//
// Virtual ranks need each rank's stream on its own hardware queue of the GPU: two ranks
// whose streams share one queue wait for each other forever (the watchdog then reports a
// timeout). The driver gives a process 8 queues unless CUDA_DEVICE_MAX_CONNECTIONS says
// otherwise, and it reads that variable once, when the process first uses CUDA: a program
// that runs virtual ranks should set it to 32 before its first CUDA call, as arsmoke does.
//
// Over several distinct GPUs, NewGroup first checks that they can all reach each other (a real
// peer write through every pair, cached per driver and device set; see internal/topology) and,
// for more than two, that NVLink links them all. Where they cannot, NCCL serves every call
// (Options.NCCL); without NCCL, NewGroup fails with an error that names the pair and wraps
// ErrNotEligible.
func NewGroup(ctx context.Context, devices []int, opts Options) ([]*Comm, error) {
	start := startupStart{at: time.Now()}
	notEligible := ""
	if err := checkTopology(ctx, devices, opts); err != nil {
		if !errors.Is(err, ErrNotEligible) || opts.NCCL == NCCLOff {
			return nil, err
		}
		// NCCL alone serves these GPUs, if it can (init fails otherwise, naming both reasons).
		notEligible = err.Error()
	}
	boots, err := bootstrap.NewInProcess(len(devices))
	if err != nil {
		return nil, fmt.Errorf("collective: %w", err)
	}
	start.steps = []StartupStep{{Phase: StartupGroupCheck, Duration: time.Since(start.at)}}
	comms := make([]*Comm, len(devices))
	errs := make([]error, len(devices))
	var wg sync.WaitGroup
	for r, dev := range devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = newComm(ctx, dev, boots[r], opts, notEligible, start)
			if errs[r] != nil {
				// Unblock the ranks still waiting for this one.
				boots[r].Close()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	return comms, nil
}

// barrierScope is the scope of the kernels' barriers: GPU scope when every rank runs on one
// GPU (virtual ranks, or processes sharing it: counted arrivals and GPU-scope release/acquire
// are enough there, and cheaper) unless Options.SystemScope; else system scope, with arrivals
// counted by atomic adds where every rank's GPU has native atomics on the others' memory
// (NVLink, or one GPU: no round number to read before telling the peers) unless
// Options.FlagBarriers, and round-number flags otherwise (PCIe).
func barrierScope(oneGPU, atomics bool, opts Options) ptx.Scope {
	switch {
	case oneGPU && !opts.SystemScope:
		return ptx.ScopeGPU
	case atomics && !opts.FlagBarriers:
		return ptx.ScopeSystemCounted
	}
	return ptx.ScopeSystem
}

// init exchanges the ranks' facts and sets up the engines that can serve the communicator:
// the custom kernels (every rank on one host, 2 to ptx.MaxRanks ranks, an eligible topology)
// and NCCL (Options.NCCL).
func (c *Comm) init(ctx context.Context, ordinal int) error {
	t := time.Now()
	major, minor, err := c.dev.ComputeCapability()
	if err != nil {
		return err
	}
	c.major, c.minor = major, minor
	sms, err := c.dev.SMCount()
	if err != nil {
		return err
	}
	uuid, err := c.dev.UUID()
	if err != nil {
		return err
	}
	mine := rankInfo{rankFacts: rankFacts{PID: int64(os.Getpid()), Process: memory.ProcessID(), Device: int64(ordinal), UUID: uuid, Host: hostID(c.opts.NCCL != NCCLOff),
		SMs: int64(sms), Major: int64(major),
		Blocks: int64(c.opts.Blocks), PushBlocks: int64(c.opts.PushBlocks), ThreadsPerBlock: int64(c.opts.ThreadsPerBlock), MaxBytes: c.opts.MaxBytes,
		PushMaxBytes: c.opts.PushMaxBytes, Algorithm: int64(c.opts.Algorithm), SystemScope: boolInt(c.opts.SystemScope), FlagBarriers: boolInt(c.opts.FlagBarriers),
		NCCL: int64(c.opts.NCCL)}}
	if c.size >= 2 && c.size <= ptx.MaxRanks && c.notEligible == "" {
		mine.Custom = 1 // this rank could run the custom kernels
	}
	t = c.step(StartupDevice, t)
	// Two rounds: the facts first, which tell whether the custom kernels can serve the
	// communicator; only then what they need (kernels, arena), so that a communicator that
	// NCCL alone serves compiles and allocates nothing for them.
	infos, err := c.allGatherInfos(ctx, mine)
	if err != nil {
		return fmt.Errorf("exchange rank info: %w", err)
	}
	t = c.step(StartupExchangeFacts, t)
	if err := agree(infos, c.rank); err != nil {
		return err
	}
	c.custom, c.noCustomWhy = customEligible(infos)
	if !c.custom && c.notEligible != "" {
		// NewGroup's check of the GPUs says why, naming the pair.
		c.noCustomWhy = c.notEligible
	}
	atomics := false
	if c.custom {
		// Every rank takes part in the topology check, or none does: the facts are the same.
		var err error
		switch atomics, err = c.checkPeerTopology(ctx, infos); {
		case errors.Is(err, ErrNotEligible) && c.opts.NCCL != NCCLOff:
			c.custom, c.noCustomWhy = false, err.Error()
		case err != nil:
			return err
		}
		c.step(StartupTopology, t) // prepareCustom times its own steps from here
	}
	fd := -1
	if c.custom {
		// Every rank decides alike, from the same facts, options (agree) and answer about
		// atomics, before it loads the kernels: only those of this scope are compiled, and
		// their occupancy is what the ranks exchange below (with the scope, checked there).
		c.scope = barrierScope(ranksPerGPU(infos) == c.size, atomics, c.opts)
		var part rankInfo
		if part.Arena, fd, err = c.prepareCustom(major, minor); err != nil {
			return err
		}
		t = time.Now()
		if fd >= 0 {
			// The exported VMM fd only travels to the peers; it is ours to close however init ends.
			defer unix.Close(fd)
		}
		part.BlocksPerSM = int64(c.kernels.maxBlocksPerSM)
		part.Scope = int64(c.scope)
		part.Tune = c.loadTuning(ctx, infos)
		parts, err := c.allGatherInfos(ctx, part)
		if err != nil {
			return fmt.Errorf("exchange the arenas: %w", err)
		}
		for r := range infos {
			if parts[r].Scope != part.Scope {
				// One protocol for all: ranks that count arrivals and ranks that store round
				// numbers would wait for each other forever.
				return fmt.Errorf("rank %d chose %v barriers and rank %d %v: the ranks' drivers answered differently whether their GPUs have native atomics on each other's memory; set Options.FlagBarriers on every rank", r, ptx.Scope(parts[r].Scope), c.rank, c.scope)
			}
			if err := checkArena(r, c.rank, parts[r].Arena, c.opts.IPC, c.layout.total); err != nil {
				return err
			}
			infos[r].BlocksPerSM, infos[r].Arena = parts[r].BlocksPerSM, parts[r].Arena
			infos[r].Tune = parts[r].Tune
		}
		c.step(StartupExchangeArenas, t)
	}
	if c.custom {
		if err := c.initCustom(ctx, infos, fd); err != nil {
			return err
		}
	}
	t = time.Now()
	if err := c.initNCCL(ctx, infos); err != nil {
		return err
	}
	t = c.step(StartupNCCL, t)
	if !c.custom && c.nccl == nil {
		return fmt.Errorf("%w: goccl's kernels cannot serve this communicator (%s) and NCCL is not available (%s)", ErrNotEligible, c.noCustomWhy, c.ncclWhy)
	}
	if err := c.boot.Barrier(ctx); err != nil {
		return fmt.Errorf("final barrier: %w", err)
	}
	c.step(StartupBarrier, t)
	return nil
}

// allGatherInfos sends mine to every rank and returns every rank's.
func (c *Comm) allGatherInfos(ctx context.Context, mine rankInfo) ([]rankInfo, error) {
	blob, err := mine.marshal()
	if err != nil {
		return nil, err
	}
	blobs, err := c.boot.AllGather(ctx, blob)
	if err != nil {
		return nil, err
	}
	infos := make([]rankInfo, c.size)
	for r, b := range blobs {
		if infos[r], err = unmarshalRankInfo(b); err != nil {
			return nil, fmt.Errorf("rank info of rank %d: %w", r, err)
		}
	}
	return infos, nil
}

// customEligible says whether the custom kernels can serve ranks with these facts, and why not.
func customEligible(infos []rankInfo) (bool, string) {
	if n := len(infos); n < 2 || n > ptx.MaxRanks {
		return false, fmt.Sprintf("they take 2 to %d ranks, not %d", ptx.MaxRanks, n)
	}
	for r, ri := range infos {
		switch {
		case ri.Custom == 0:
			return false, fmt.Sprintf("rank %d cannot run them (its GPUs are not eligible)", r)
		case ri.Host != infos[0].Host:
			return false, fmt.Sprintf("rank %d runs on another host than rank 0", r)
		}
	}
	return true, ""
}

// prepareCustom loads the kernels and allocates what this rank shares with its peers. It
// returns what the peers need to map the arena: its descriptor and, for VMM, an exported file
// descriptor the caller closes (else -1).
func (c *Comm) prepareCustom(major, minor int) (desc memory.Descriptor, fd int, err error) {
	fd = -1
	target, err := ptx.TargetFor(major, minor)
	if err != nil {
		return desc, fd, err
	}
	if err := checkParams(c.size); err != nil {
		return desc, fd, err
	}
	// Once per process: where the driver takes a launch's context from its stream, every
	// AllReduce then costs one driver call instead of two. A driver that does not is no
	// error: launches keep binding the context. It runs beside the kernels' JIT, which
	// keeps other cores busy.
	probeStart := time.Now()
	probed := make(chan time.Time, 1)
	go func() {
		_ = driver.ProbeStreamLaunch(c.ctx)
		probed <- time.Now()
	}()
	t := time.Now()
	var loads []KernelLoad
	c.kernels, loads, err = acquireKernels(kernelKey{dev: c.dev, worldSize: c.size, target: target, scope: c.scope})
	c.startup.Kernels = loads
	c.step(StartupKernels, t)
	probeEnd := <-probed
	c.startup.Steps = append(c.startup.Steps, StartupStep{Phase: StartupProbe, Start: probeStart.Sub(c.startupAt), Duration: probeEnd.Sub(probeStart)})
	if err != nil {
		return desc, fd, err
	}

	t = time.Now()
	c.layout = newArenaLayout(c.opts, c.size)
	if c.arena, err = memory.Alloc(c.ctx, c.layout.total, c.opts.IPC); err != nil {
		return desc, fd, err
	}
	t = c.step(StartupArena, t)
	if c.errRec, err = c.ctx.AllocHost(ptx.ErrRecordBytes); err != nil {
		return desc, fd, fmt.Errorf("error record: %w", err)
	}
	clear(c.errRec.Bytes())
	if c.table, err = newSlotTable(c.ctx, c.opts.MaxSlots, c.size); err != nil {
		return desc, fd, err
	}
	t = c.step(StartupTables, t)
	desc, fd, err = c.arena.Describe()
	c.step(StartupExport, t)
	return desc, fd, err
}

// initCustom maps the peers' arenas and sets the kernels' launch shape.
func (c *Comm) initCustom(ctx context.Context, infos []rankInfo, fd int) error {
	var err error
	fds := make([][]int, c.size)
	if c.opts.IPC == memory.VMM {
		t := time.Now()
		if fds, err = c.boot.AllGatherFDs(ctx, []int{fd}); err != nil {
			if errors.Is(err, bootstrap.ErrFDPassingUnsupported) {
				return fmt.Errorf("exchange VMM file descriptors: %w: use a bootstrap that passes them (bootstrap.NewUnix) or Options.IPC memory.LegacyIPC", err)
			}
			return fmt.Errorf("exchange VMM file descriptors: %w", err)
		}
		c.step(StartupExchangeArenas, t)
	}

	// Every block of every rank that shares a GPU must be resident at once; the tightest GPU
	// decides, since every rank must launch the same grid.
	blocksPerSM, smsOnGPU := int(infos[0].BlocksPerSM), int(infos[0].SMs)
	c.allLocal = true
	for _, ri := range infos {
		blocksPerSM, smsOnGPU = min(blocksPerSM, int(ri.BlocksPerSM)), min(smsOnGPU, int(ri.SMs))
		c.allLocal = c.allLocal && ri.Process == infos[c.rank].Process
		// The selection table must pick the same algorithm on every rank.
		c.major = min(c.major, int(ri.Major))
	}
	maxOnGPU := ranksPerGPU(infos)
	c.sharedGPU = c.allLocal && maxOnGPU > 1
	c.blocksPerSM, c.ranksOnGPU = blocksPerSM, maxOnGPU
	c.blocks = blockCap(c.opts.Blocks, smsOnGPU, blocksPerSM, maxOnGPU)
	c.pushBlocks = blockCap(c.opts.PushBlocks, smsOnGPU, blocksPerSM, maxOnGPU)
	c.adoptTuning(infos, smsOnGPU, blocksPerSM, maxOnGPU)
	// PDL lets the next kernel launch before this one has finished: by default once this one
	// is past its last wait on a peer, which is safe however the ranks share GPUs; earlier
	// (ptx.FlagEarlyTrigger) where earlyTrigger allows.
	c.pdl = c.major >= 9 && !c.opts.DisablePDL && driver.Has(driver.FeatureLaunchEx)
	c.earlyRoom = ptx.EarlyTriggerRoom(max(c.blocks, c.pushBlocks, c.tuning.table.largestGrid()), smsOnGPU*blocksPerSM, maxOnGPU)
	c.earlyAnyGrid = true
	c.entryTrigger = maxOnGPU <= entryTriggerMaxRanksOnGPU
	c.timeout = c.opts.timeoutNanos()

	t := time.Now()
	if err := c.mapPeers(infos, fds); err != nil {
		return err
	}
	c.step(StartupMapPeers, t)
	// Slot 0: every rank's staging buffer, the input of eager pull all-reduces.
	staging := make([]driver.DevicePtr, c.size)
	for r, m := range c.peers {
		base := m.Ptr()
		staging[r] = base + driver.DevicePtr(c.layout.staging)
		binary.LittleEndian.PutUint64(c.sig[8*r:], uint64(base))
		binary.LittleEndian.PutUint64(c.tmp[8*r:], uint64(base)+c.layout.tmp)
		binary.LittleEndian.PutUint64(c.recv[8*r:], uint64(base)+c.layout.recv)
	}
	if _, err := c.table.fill(staging); err != nil {
		return err
	}
	return nil
}

// checkParams verifies that the kernel catalog lists the parameters in the order AllReduce
// packs them, so a change to one side cannot silently misplace arguments.
func checkParams(worldSize int) error {
	want := []struct {
		name string
		size int
	}{{"p_inputs", 8}, {"p_outputs", 8}, {"p_out", 8}, {"p_nvec", 4}, {"p_rank", 4}, {"p_err", 8}, {"p_timeout", 8},
		{"p_sig", 8 * worldSize}, {"p_buf", 8 * worldSize}, {"p_slot", 8}, {"p_flags", 4}, {"p_tail", 4}, {"p_call", 8}}
	got := ptx.Params(worldSize)
	if len(got) != len(want) {
		return fmt.Errorf("internal error: kernel catalog has %d parameters, launcher packs %d", len(got), len(want))
	}
	for i, p := range got {
		if p.Name != want[i].name || p.Size != want[i].size {
			return fmt.Errorf("internal error: kernel parameter %d is %s (%d bytes), launcher packs %s (%d bytes)", i, p.Name, p.Size, want[i].name, want[i].size)
		}
	}
	return nil
}

// Rank returns this communicator's rank.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *Comm) Size() int { return c.size }

// Device returns the CUDA device of this rank.
func (c *Comm) Device() driver.Device { return c.dev }

// Context returns the primary context of this rank's device, for allocating buffers and
// creating streams. It stays valid until Close.
func (c *Comm) Context() *driver.Context { return c.ctx }

// errWord reads word i of the error record. The kernel writes it through the mapping while
// the host may read it: atomic loads keep the race detector and the compiler honest.
func (c *Comm) errWord(i int) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&c.errRec.Bytes()[4*i])))
}

// boolInt is 1 for true, 0 for false: rank facts travel as int64s.
func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
