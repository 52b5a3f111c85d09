package collective

import (
	"fmt"
	"runtime"
	"time"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/ptx"
)

// AllReduce sums count elements of type dt over all ranks: when it completes on stream, dst
// on every rank holds the same sum, bitwise. dst == src is an in-place all-reduce. Every rank
// must call it with the same count and dt, in the same order as its other collective calls.
//
// It only enqueues work on stream (a copy and a kernel) and returns; the stream must belong
// to this rank's device. Invalid arguments are reported before anything is launched. A peer
// that does not arrive makes the kernel give up after Options.Timeout; that error is reported
// by Err and by every later call.
//
// Inputs: Push reads src directly. OneShot and TwoShot need src to be visible to the peers:
// a src registered with Register is read in place (OneShot: if dst does not overlap it;
// TwoShot: also if dst == src); otherwise it is first copied into this rank's staging buffer.
// Under Capture the pointers are exchanged after capture instead.
//
// Outputs: when dst is visible to the peers too (registered, or any dst under Capture),
// TwoShot writes every rank's share of the sum straight into every rank's dst: one barrier
// and one pass over the data fewer. Registered buffers are matched across ranks by their
// order of registration, so when one rank passes a registered src or dst, every rank must
// pass its own counterpart, registered in the same order.
func (c *Comm) AllReduce(stream *driver.Stream, dst, src driver.DevicePtr, count int, dt DType) error {
	return c.AllReduceWith(stream, dst, src, count, dt, c.opts.Algorithm)
}

// AllReduceWith is AllReduce with the algorithm chosen by the caller for this call (Auto:
// the selection table). Every rank must pass the same algorithm. Benchmarks and tests use it
// to run each algorithm on one communicator.
func (c *Comm) AllReduceWith(stream *driver.Stream, dst, src driver.DevicePtr, count int, dt DType, algo Algorithm) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return err
	}
	nbytes, err := c.validate(stream, dst, src, count, dt)
	if err != nil {
		return err
	}
	outReg, direct := c.sharedOutput(dst, uint64(nbytes))
	if algo == Auto {
		algo = c.selected(nbytes, direct)
	}
	switch algo {
	case OneShot, TwoShot:
	case Push:
		// The kernel writes nbytes into every peer's receive slot.
		if nbytes > c.opts.PushMaxBytes {
			return invalid("%d bytes is more than PushMaxBytes (%d) for the Push algorithm", nbytes, c.opts.PushMaxBytes)
		}
	default:
		return invalid("unknown algorithm %v", algo)
	}
	nvec := int(nbytes / ptx.VectorBytes)

	var inputs, outputs driver.DevicePtr
	var buf *[8 * ptx.MaxRanks]byte
	var slot uint64
	switch algo {
	case Push:
		inputs, buf, slot = src, &c.recv, c.layout.recvSlot
	default:
		if inputs, err = c.pullInput(stream, algo, dst, src, uint64(nbytes)); err != nil {
			return err
		}
		if algo == TwoShot && direct {
			if outputs, err = c.pullOutput(dst, uint64(nbytes), outReg); err != nil {
				return err
			}
		}
		buf = &c.tmp
	}

	blocks, threads := launchShape(algo, nvec, c.size, c.blocks, c.pushBlocks, c.opts.ThreadsPerBlock)
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
	var flags uint32
	if blocks <= c.earlyRoom {
		flags |= ptx.FlagEarlyTrigger
	}
	a.U32(flags)
	c.cfg = driver.LaunchConfig{Grid: [3]uint32{uint32(blocks), 1, 1}, Block: [3]uint32{uint32(threads), 1, 1}}
	fn := c.kernels.fn[c.scope][algo][dt]
	if c.pdl {
		err = driver.LaunchEx(stream, fn, &c.cfg, a, true)
	} else {
		err = driver.Launch(stream, fn, &c.cfg, a)
	}
	if err != nil {
		return fmt.Errorf("collective: rank %d: launch %s: %w", c.rank, fn.Name(), err)
	}
	return nil
}

// Selected returns the algorithm that AllReduce picks for a message of nbytes: the forced
// one (Options.Algorithm or GOCCL_ALGO) or the selection table's. sharedOutput says whether
// the call's dst is visible to the peers (registered with Register, or the call is captured
// by Capture): TwoShot then writes straight into it, which moves its crossover with OneShot.
func (c *Comm) Selected(nbytes int64, sharedOutput bool) Algorithm {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.selected(nbytes, sharedOutput)
}

func (c *Comm) selected(nbytes int64, sharedOutput bool) Algorithm {
	if c.opts.Algorithm != Auto {
		return c.opts.Algorithm
	}
	return selectAlgorithm(c.major, c.size, nbytes, c.opts.PushMaxBytes, sharedOutput, c.scope == ptx.ScopeGPU)
}

// sharedOutput reports whether a pull kernel could write into the peers' dst of this call:
// dst is registered (with room for nbytes; reg is its registration), or the call is being
// captured (Capture exchanges the outputs afterwards).
func (c *Comm) sharedOutput(dst driver.DevicePtr, nbytes uint64) (reg registration, ok bool) {
	if c.capture != nil {
		return registration{}, true
	}
	reg, ok = c.registered[dst]
	return reg, ok && nbytes <= reg.bytes
}

// pullOutput returns the registration slot through which the direct TwoShot finds every
// rank's dst; reg is what sharedOutput returned.
func (c *Comm) pullOutput(dst driver.DevicePtr, nbytes uint64, reg registration) (driver.DevicePtr, error) {
	if c.capture != nil {
		return c.capture.share(c, dst, nbytes)
	}
	return c.table.addr(reg.slot), nil
}

// pullInput returns the registration slot a pull kernel reads its inputs through.
func (c *Comm) pullInput(stream *driver.Stream, algo Algorithm, dst, src driver.DevicePtr, nbytes uint64) (driver.DevicePtr, error) {
	if c.capture != nil {
		return c.capture.record(c, stream, algo, dst, src, nbytes)
	}
	if reg, ok := c.registered[src]; ok && nbytes <= reg.bytes && readsInPlace(algo, dst, src, nbytes) {
		return c.table.addr(reg.slot), nil
	}
	staging := c.peers[c.rank].Ptr() + driver.DevicePtr(c.layout.staging)
	if err := stream.CopyDtoDAsync(staging, src, nbytes); err != nil {
		return 0, fmt.Errorf("collective: rank %d: copy input to staging: %w", c.rank, err)
	}
	return c.table.addr(0), nil
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

func overlap(a, b driver.DevicePtr, n uint64) bool {
	return a < b+driver.DevicePtr(n) && b < a+driver.DevicePtr(n)
}

// validate checks a call's arguments and returns its size in bytes.
func (c *Comm) validate(stream *driver.Stream, dst, src driver.DevicePtr, count int, dt DType) (int64, error) {
	if !dt.Valid() {
		return 0, invalid("unsupported element type %v: use Float32, Float16 or BFloat16", dt)
	}
	if count <= 0 {
		return 0, invalid("count %d: must be positive", count)
	}
	nbytes := int64(count) * int64(dt.Size())
	switch {
	case nbytes%ptx.VectorBytes != 0:
		return 0, invalid("%d elements of %v are %d bytes: the size must be a multiple of 16 bytes", count, dt, nbytes)
	case nbytes > c.opts.MaxBytes:
		return 0, invalid("%d bytes is more than MaxBytes (%d): raise Options.MaxBytes or hand this size to NCCL", nbytes, c.opts.MaxBytes)
	case src == 0 || dst == 0:
		return 0, invalid("nil buffer (src %#x, dst %#x)", uint64(src), uint64(dst))
	case src%ptx.VectorBytes != 0 || dst%ptx.VectorBytes != 0:
		return 0, invalid("buffers must be 16-byte aligned (src %#x, dst %#x)", uint64(src), uint64(dst))
	case stream == nil:
		return 0, invalid("nil stream")
	case stream.Context().Device() != c.dev:
		return 0, invalid("stream belongs to device %d, this rank runs on device %d", stream.Context().Device(), c.dev)
	}
	return nbytes, nil
}

// usable returns the error that stops this communicator from taking more work, if any.
func (c *Comm) usable() error {
	if c.closed {
		return ErrClosed
	}
	if c.failed == nil {
		c.failed = c.kernelError()
	}
	return c.failed
}

// Err reports an asynchronous error of this rank: a kernel that timed out waiting for a peer
// (errors.Is ErrTimeout) or found an unfilled registration slot (ErrUnfilledSlot). It does
// not wait for the stream; call it after synchronising to know that the work finished well.
// Once it returns an error, the communicator is unusable.
func (c *Comm) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return c.usable()
}

// kernelError reads the error record that the kernels write on failure (host-mapped memory:
// no synchronisation needed). The winning thread sets the code, then the other words, then
// the done word; a record seen between the two is read again once done is set.
func (c *Comm) kernelError() error {
	code := c.errWord(0)
	if code == 0 {
		return nil
	}
	// The winner writes five words right after its compare-and-swap: a millisecond is ample.
	for deadline := time.Now().Add(time.Millisecond); c.errWord(5) == 0 && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	return &KernelError{Code: code, Rank: int(c.errWord(1)), Block: int(c.errWord(2)),
		Peer: int(c.errWord(3)), Phase: c.errWord(4), SharedGPU: c.sharedGPU}
}
