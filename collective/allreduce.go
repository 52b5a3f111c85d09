package collective

import (
	"fmt"
	"runtime"
	"time"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/ptx"
)

// AllReduce sums count elements of type dt over all ranks: when it completes on stream, dst
// on every rank holds the same sum, bitwise. dst == src is an in-place all-reduce; buffers that
// overlap otherwise are refused. Every rank must call it with the same count and dt, in the
// same order as its other collective calls: a kernel that sees a peer make a different call
// records a KernelError matching ErrCallMismatch.
//
// Any count of at least one element is accepted, up to Options.MaxBytes. src and dst must be
// 16-byte aligned device memory of this rank's device (checked once per allocation with the
// driver: a host pointer, a freed allocation or another device's memory is refused before
// anything is launched). The kernels read whole 16-byte vectors, so up to 14 bytes after the
// last element of src are read (never written); they lie inside the same aligned vector, and
// so inside the allocation's last page.
//
// It only enqueues work on stream (a kernel, and before a TwoShot kernel that reads src
// through the staging buffer, a copy) and returns; the stream must belong
// to this rank's device. A peer that does not arrive makes the kernel give up after
// Options.Timeout; that error is reported by Err and by every later call. An all-reduce
// handed to NCCL has no such kernel: the NCCL watchdog follows it instead, eager or replayed
// with Graph.Launch (Options.Timeout); one captured into a graph of the caller's own, outside
// Capture, waits for its peers as long as NCCL does.
//
// Inputs: Push reads src directly. OneShot and TwoShot need src to be visible to the peers:
// a src registered with Register is read in place (OneShot: if dst does not overlap it;
// TwoShot: also if dst == src); otherwise it goes through this rank's staging buffer: OneShot's
// kernel copies it there itself before its entry barrier, TwoShot's call enqueues a copy
// before the kernel. Under Capture (a call on the stream that Capture records or a stream
// forked from it; a call on any other stream meanwhile is eager) the pointers are exchanged
// after capture instead (an in-place OneShot still stages, in its kernel).
//
// Outputs: when dst is visible to the peers too (registered, or any dst under Capture),
// TwoShot writes every rank's share of the sum straight into every rank's dst: one barrier
// and one pass over the data fewer. Such an in-place call takes TwoShot wherever the
// selection would take OneShot out of place, since it needs no staging (SelectedFor).
// Registered buffers are matched across ranks by their
// order of registration, so when one rank passes a registered src or dst, every rank must
// pass its own counterpart, registered in the same order.
func (c *Comm) AllReduce(stream *driver.Stream, dst, src driver.DevicePtr, count int, dt DType) error {
	if c == nil {
		return errNilComm
	}
	return c.AllReduceWith(stream, dst, src, count, dt, c.opts.Algorithm)
}

// AllReduceWith is AllReduce with the algorithm chosen by the caller for this call (Auto:
// the selection table). Every rank must pass the same algorithm. It exists for benchmarks
// and tests that run each algorithm on one communicator; services use AllReduce.
func (c *Comm) AllReduceWith(stream *driver.Stream, dst, src driver.DevicePtr, count int, dt DType, algo Algorithm) error {
	if c == nil {
		return errNilComm
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Captured only on the stream Capture records; any other call is eager, also while
	// another goroutine captures.
	defer c.endCall(c.callOn(stream))
	if err := c.usable(); err != nil {
		return err
	}
	nbytes, err := c.validate(stream, dst, src, count, dt)
	if err != nil {
		return err
	}
	outReg, direct := c.sharedOutput(dst, uint64(nbytes))
	if algo, err = c.route(algo, nbytes, direct, dst == src); err != nil {
		return err
	}
	if algo == NCCL {
		return c.ncclAllReduce(stream, dst, src, count, dt)
	}
	// Whole vectors; the last one may be partly the message's (p_tail bytes of it).
	nvec := int((nbytes + ptx.VectorBytes - 1) / ptx.VectorBytes)
	tail := uint32(nbytes - int64(nvec-1)*ptx.VectorBytes)

	var inputs, outputs driver.DevicePtr
	var buf *[8 * ptx.MaxRanks]byte
	var slot uint64
	var flags uint32
	var staged bool
	switch algo {
	case Push:
		inputs, buf, slot = src, &c.recv, c.layout.recvSlot
	default:
		if inputs, staged, err = c.inputSlot(algo, dst, src, uint64(nbytes)); err != nil {
			return err
		}
		switch {
		case staged && algo == OneShot:
			// The kernel copies src into the staging buffer itself, each thread the vectors it
			// reduces, before its entry barrier: no copy to enqueue (a driver call per rank and
			// call, which virtual ranks pay in turn on one host thread) and none to run on the
			// GPU. src travels in p_outputs, which OneShot has no other use for.
			outputs, flags = src, ptx.FlagStageInput
		case staged:
			if err = c.stage(stream, src, uint64(nbytes)); err != nil {
				return err
			}
		}
		if algo == TwoShot && direct {
			if outputs, err = c.pullOutput(dst, uint64(nbytes), outReg); err != nil {
				return err
			}
		}
		buf = &c.tmp
	}

	blocks, threads := c.shape(algo, nvec, nbytes, direct)
	kernel, _ := algo.kernel()
	ws8 := 8 * c.size
	a := &c.args
	a.Reset()
	a.Ptr(inputs)
	a.Ptr(outputs)
	a.Ptr(dst)
	a.U32(uint32(nvec))
	a.U32(uint32(c.rank))
	a.Ptr(c.errRec.DevicePtr())
	a.U64(c.timeout)
	a.Bytes(c.sig[:ws8], 8)
	a.Bytes(buf[:ws8], 8)
	a.U64(slot)
	flags |= c.triggerFlags(kernel, blocks)
	a.U32(flags)
	a.U32(tail)
	a.U64(allReduceCall(kernel, dt, count, staged, algo == TwoShot && direct))
	return c.launch(stream, c.kernels.fn[c.scope][kernel][dt], blocks, threads, a)
}

// allReduceCall is the call fingerprint of an all-reduce launch of kernel. Staged and direct
// are part of the call: every rank must read its peers' inputs through the same table slot
// (a rank that stages, slot 0, beside one reading its registered input in place would read
// stale data), and every rank must deliver TwoShot's sums the same way (a rank that gathers
// from the peers' tmp buffers beside one that wrote straight into the registered outputs
// instead would gather stale data; the two kernels pass as many barriers). Whether a src or
// dst is registered is this rank's knowledge alone (a rank may pass an unregistered
// counterpart, or release its registration before a peer does); the kernels then report
// ErrCallMismatch instead of returning such sums.
func allReduceCall(kernel ptx.Algorithm, dt DType, count int, staged, direct bool) uint64 {
	return ptx.Call{Op: ptx.OpAllReduce, Algo: kernel, DType: dt, Count: uint64(count), Staged: staged, Direct: direct}.Fingerprint()
}

// earlyTrigger reports whether a launch of kernel over blocks blocks carries
// ptx.FlagEarlyTrigger: at any grid where the kernel triggers early only after its entry
// barrier (ptx.EarlyTriggerAnyGrid), else within the room of ptx.EarlyTriggerRoom. Every rank
// computes the same answer for the same call.
func (c *Comm) earlyTrigger(kernel ptx.Algorithm, blocks int) bool {
	return blocks <= c.earlyRoom || c.earlyAnyGrid && ptx.EarlyTriggerAnyGrid(kernel)
}

// entryTriggerMaxRanksOnGPU is the most ranks sharing one GPU for which the pull kernels
// trigger their dependents right after their entry barrier (ptx.FlagEntryTrigger) rather than
// before their last wait on a peer. On an H100 with 2 virtual ranks and one graph per rank
// that took 0.45 to 0.7 us off the 4 MiB all-reduce and 0.15 to 0.35 off the fused call at 8
// rows, against 0.1 to 0.3 more for the in-place two-shot at 1 and 4 MiB in some runs; with 4
// ranks several points were up to 0.4 us slower in one of two runs, with 8 the fused call at 1
// and 8 rows was 0.4 slower (docs/benchmarks.md, "PDL trigger at the entry barrier"). With
// one rank per GPU no other rank's kernels share the GPU with the next kernel's blocks.
const entryTriggerMaxRanksOnGPU = 2

// triggerFlags are the PDL bits of p_flags for a launch of kernel over blocks blocks:
// ptx.FlagEarlyTrigger where earlyTrigger allows it, with ptx.FlagEntryTrigger for the
// kernels that have an entry barrier (all but Push) where few enough ranks share the GPU
// (c.entryTrigger). Every rank computes the same bits for the same call.
func (c *Comm) triggerFlags(kernel ptx.Algorithm, blocks int) uint32 {
	if !c.earlyTrigger(kernel, blocks) {
		return 0
	}
	if c.entryTrigger && kernel != ptx.Push {
		return ptx.FlagEarlyTrigger | ptx.FlagEntryTrigger
	}
	return ptx.FlagEarlyTrigger
}

// launch starts fn on stream with the packed arguments (with PDL where the communicator uses
// it) and lets Close wait for it.
func (c *Comm) launch(stream *driver.Stream, fn *driver.Function, blocks, threads int, args *driver.Args) error {
	c.cfg = driver.LaunchConfig{Grid: [3]uint32{uint32(blocks), 1, 1}, Block: [3]uint32{uint32(threads), 1, 1}}
	var err error
	if c.pdl {
		err = driver.LaunchEx(stream, fn, &c.cfg, args, true)
	} else {
		err = driver.Launch(stream, fn, &c.cfg, args)
	}
	if err != nil {
		return c.fail(fmt.Errorf("collective: rank %d: launch %s: %w", c.rank, fn.Name(), err))
	}
	// A call that Capture records runs when its graph does (Graph.Launch notes it); any
	// other, also one on another stream while a Capture runs (callOn hid the capture from
	// it), is this communicator's work now.
	if c.capture == nil {
		if err := c.noteWork(stream); err != nil {
			return c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, err))
		}
	} else {
		c.capture.launches++
	}
	return nil
}

// noteWork lets Close wait for the call just enqueued on stream, unless the stream is being
// captured into the caller's own graph: that work runs when the graph does, outside this
// communicator's sight (see Graph.Exec).
func (c *Comm) noteWork(stream *driver.Stream) error {
	capturing, err := stream.IsCapturing()
	if err != nil || capturing {
		return err
	}
	return c.work.note(stream)
}

// Selected returns the algorithm that AllReduce picks for an out-of-place message of nbytes:
// the forced one (Options.Algorithm or GOCCL_ALGO), NCCL where the kernels cannot serve the
// call (past MaxBytes, or a communicator they cannot serve) and NCCL is available, or the
// selection table's kernel. sharedOutput says whether the call's dst is visible to the peers
// (registered with Register, or the call is captured by Capture): TwoShot then writes
// straight into it, which moves its crossover with OneShot. The selection table is the
// tuning table's section where the communicator uses one (TuneFile), else the built-in one;
// a tuning table may choose differently for captured calls, which SelectedCaptured answers
// (Selected answers for eager calls, or for captured ones while Capture records). An
// in-place call may take another algorithm: SelectedFor answers for any kind of call.
func (c *Comm) Selected(nbytes int64, sharedOutput bool) Algorithm {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.selected(nbytes, sharedOutput)
}

// selected is Selected for an out-of-place call made now: captured (inside Capture) or eager.
func (c *Comm) selected(nbytes int64, sharedOutput bool) Algorithm {
	return c.selectedIn(c.capture != nil, nbytes, sharedOutput, false)
}

// CallKind is what the selection of a call depends on beside its size (see SelectedFor).
type CallKind struct {
	// SharedOutput: the call's dst is visible to the peers, registered with Register with
	// room for the call (a captured call's always is).
	SharedOutput bool
	// InPlace: dst == src.
	InPlace bool
	// Captured: the call is recorded by Capture (a tuning table may choose differently for
	// graphs than for eager calls).
	Captured bool
}

// SelectedFor returns the algorithm that AllReduce picks for a call of nbytes of the given
// kind: Selected's answer, except that an in-place call whose output the peers see takes
// TwoShot where OneShot would serve it out of place (an in-place OneShot must stage its
// input; the direct TwoShot reads each element of the buffer before it writes it, in the same
// thread).
func (c *Comm) SelectedFor(nbytes int64, kind CallKind) Algorithm {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.selectedIn(kind.Captured, nbytes, kind.SharedOutput || kind.Captured, kind.InPlace)
}

// Engines says what serves this communicator: goccl's kernels, NCCL, or both.
type Engines struct {
	// Kernels: goccl's kernels serve calls up to Options.MaxBytes.
	Kernels bool
	// NCCL: an NCCL communicator serves what the kernels cannot (see Options.NCCL).
	NCCL bool
	// NoKernels and NoNCCL say why an engine is missing ("" when it is there).
	NoKernels, NoNCCL string
}

// Engines returns what serves this communicator; every rank gets the same answer.
func (c *Comm) Engines() Engines {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := Engines{Kernels: c.custom, NCCL: c.nccl != nil}
	if !e.Kernels {
		e.NoKernels = c.noCustomWhy
	}
	if !e.NCCL {
		e.NoNCCL = c.ncclWhy
	}
	return e
}

// route resolves the algorithm of one call (Auto: the selection for a call made now, eager or
// captured, whose output the peers see (direct) or not, in place or not) and refuses what its
// engine cannot take.
func (c *Comm) route(algo Algorithm, nbytes int64, direct, inPlace bool) (Algorithm, error) {
	if algo == Auto {
		algo = c.selectedIn(c.capture != nil, nbytes, direct, inPlace)
	}
	if algo == NCCL {
		if c.nccl == nil {
			return 0, invalid("the call needs NCCL, which this communicator does not have: %s", c.ncclWhy)
		}
		return NCCL, nil
	}
	if _, ok := algo.kernel(); !ok {
		return 0, invalid("unknown algorithm %v", algo)
	}
	switch {
	case !c.custom:
		return 0, invalid("goccl's kernels cannot serve this communicator (%s): %s", c.noCustomWhy, c.ncclAlternative())
	case nbytes > c.opts.MaxBytes:
		return 0, invalid("%d bytes is more than MaxBytes (%d): raise Options.MaxBytes, or %s", nbytes, c.opts.MaxBytes, c.ncclAlternative())
	case algo == Push && nbytes > c.opts.PushMaxBytes:
		// The kernel writes nbytes into every peer's receive slot.
		return 0, invalid("%d bytes is more than PushMaxBytes (%d) for the Push algorithm", nbytes, c.opts.PushMaxBytes)
	}
	return algo, nil
}

// sharedOutput reports whether a pull kernel could write into the peers' dst of this call:
// dst is registered (with room for nbytes; reg is its registration), or the call is being
// captured (Capture exchanges the outputs afterwards).
func (c *Comm) sharedOutput(dst driver.DevicePtr, nbytes uint64) (reg *Registration, ok bool) {
	if c.capture != nil {
		return nil, true
	}
	reg, ok = c.registered[dst]
	return reg, ok && nbytes <= reg.bytes
}

// pullOutput returns the registration slot through which the direct TwoShot finds every
// rank's dst; reg is what sharedOutput returned.
func (c *Comm) pullOutput(dst driver.DevicePtr, nbytes uint64, reg *Registration) (driver.DevicePtr, error) {
	if c.capture != nil {
		return c.capture.share(c, dst, nbytes)
	}
	return c.table.addr(reg.slot), nil
}

// pullInput returns the registration slot a pull kernel reads its inputs through, having
// enqueued the copy of src into the staging buffer where the peers read that. The fused
// kernels take their input this way; AllReduce's OneShot uses inputSlot and lets its kernel
// stage (ptx.FlagStageInput).
func (c *Comm) pullInput(stream *driver.Stream, algo Algorithm, dst, src driver.DevicePtr, nbytes uint64) (driver.DevicePtr, error) {
	slot, staged, err := c.inputSlot(algo, dst, src, nbytes)
	if err == nil && staged {
		err = c.stage(stream, src, nbytes)
	}
	return slot, err
}

// inputSlot returns the registration slot a pull kernel reads its inputs through, and whether
// that is slot 0, the ranks' staging buffers, which src must reach before the peers read it:
// when the peers cannot read src in place (see readsInPlace), or, eager, src is not
// registered with room for the call. Under Capture the peers' buffers are exchanged after
// capture (captureState.record).
func (c *Comm) inputSlot(algo Algorithm, dst, src driver.DevicePtr, nbytes uint64) (slot driver.DevicePtr, staged bool, err error) {
	if c.capture != nil {
		return c.capture.record(c, algo, dst, src, nbytes)
	}
	if reg, ok := c.registered[src]; ok && nbytes <= reg.bytes && readsInPlace(algo, dst, src, nbytes) {
		return c.table.addr(reg.slot), false, nil
	}
	return c.table.addr(0), true, nil
}

// stage enqueues the copy of src into this rank's staging buffer, which every peer reads
// through slot 0. Only the kernels that do not stage their input themselves need it: TwoShot
// (block b of rank p reads every input at p's shard only, so a copy in the kernel that the
// per-block entry barrier orders would have to cover block b's part of every shard, a loop
// of its own) and the fused kernels (AllReduceResidualRMSNorm), whose templates have no
// ptx.FlagStageInput.
func (c *Comm) stage(stream *driver.Stream, src driver.DevicePtr, nbytes uint64) error {
	staging := c.peers[c.rank].Ptr() + driver.DevicePtr(c.layout.staging)
	if err := stream.CopyDtoDAsync(staging, src, nbytes); err != nil {
		return c.fail(fmt.Errorf("collective: rank %d: copy input to staging: %w", c.rank, err))
	}
	return nil
}

// readsInPlace reports whether the peers may read src itself rather than a staging copy.
// Out of place, always. In place, OneShot would overwrite element i while slower peers still
// read it; TwoShot reads and writes each element of a shard in the same thread (direct) or
// writes its output only after the middle barrier, when no peer reads the inputs any more,
// so an exact in-place TwoShot is safe (a partial overlap is not: it would shift elements
// between threads).
func readsInPlace(algo Algorithm, dst, src driver.DevicePtr, nbytes uint64) bool {
	return !overlap(dst, src, nbytes) || (algo == TwoShot && dst == src)
}

// usable returns the error that stops this communicator from taking more work, if any. It
// costs no driver call: the error record is host memory, and a CUDA error that leaves the
// context unusable surfaces in the next driver call (launch, copy), where fail keeps it.
func (c *Comm) usable() error {
	if c.closed {
		return ErrClosed
	}
	return c.latchFailure()
}

// latchFailure makes the first asynchronous failure (a kernel's error record, the NCCL
// engine's) the communicator's, for good, and returns it.
func (c *Comm) latchFailure() error {
	if c.failed == nil {
		c.failed = c.kernelError()
	}
	if c.failed == nil && c.nccl != nil {
		c.failed = c.nccl.failure()
	}
	return c.failed
}

// Err reports an asynchronous error of this rank: a kernel that timed out waiting for a peer
// (errors.Is ErrTimeout), found an unfilled registration slot (ErrUnfilledSlot) or saw a peer
// make a different call (ErrCallMismatch), all as a *KernelError; or a CUDA error that left
// the context unusable, such as a kernel fault (errors.Is driver.ErrContextLost). Every such
// error also matches ErrUnusable, and every later call returns it. Err does not wait for the
// stream; call it after synchronising to know that the work finished well. After Close it
// returns the failure that came first, else ErrClosed.
func (c *Comm) Err() error {
	if c == nil {
		return errNilComm
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed != nil {
		return c.failed
	}
	if c.closed {
		return ErrClosed
	}
	if err := c.usable(); err != nil {
		return err
	}
	if err := c.ctx.Health(); err != nil {
		return c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, err))
	}
	return nil
}

// kernelError reads the error record that the kernels write on failure (host-mapped memory:
// no synchronisation needed). The winning thread sets the code, then the other words, then
// the done word; a record seen between the two is read again once done is set.
func (c *Comm) kernelError() error {
	if c.errRec == nil {
		return nil // no custom kernels
	}
	code := c.errWord(0)
	if code == 0 {
		return nil
	}
	// The winner writes its words right after its compare-and-swap: a few milliseconds are
	// ample even while the GPU is busy.
	for deadline := time.Now().Add(100 * time.Millisecond); c.errWord(5) == 0 && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	word64 := func(i int) uint64 { return uint64(c.errWord(i)) | uint64(c.errWord(i+1))<<32 }
	return &KernelError{Code: ErrorCode(code), Rank: int(c.errWord(1)), Block: int(c.errWord(2)),
		Peer: int(c.errWord(3)), Phase: Phase(c.errWord(4)),
		Mine: ptx.DecodeCall(word64(6)), Theirs: ptx.DecodeCall(word64(8)), SharedGPU: c.sharedGPU}
}
