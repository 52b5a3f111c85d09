package collective

import (
	"context"
	"errors"
	"fmt"

	"github.com/goccl/goccl/driver"
)

// captureState records the buffers of the pull all-reduces issued while a graph is being
// captured. Their peers' pointers are not known during capture (a rank cannot talk to its
// peers from inside a stream capture), so each shared buffer (an input read in place, or an
// output the direct TwoShot writes into) gets an empty registration slot that Capture fills
// once every rank has finished capturing.
type captureState struct {
	slots []int
	ptrs  []driver.DevicePtr
	sizes []uint64
}

// record returns the input slot of one captured all-reduce.
func (cs *captureState) record(c *Comm, stream *driver.Stream, algo Algorithm, dst, src driver.DevicePtr, nbytes uint64) (driver.DevicePtr, error) {
	if !readsInPlace(algo, dst, src, nbytes) {
		// In place: peers must not read a buffer this rank overwrites, so the graph copies
		// the input into the staging buffer, as an eager call does.
		staging := c.peers[c.rank].Ptr() + driver.DevicePtr(c.layout.staging)
		if err := stream.CopyDtoDAsync(staging, src, nbytes); err != nil {
			return 0, fmt.Errorf("collective: rank %d: copy input to staging: %w", c.rank, err)
		}
		return c.table.addr(0), nil
	}
	return cs.share(c, src, nbytes)
}

// share reserves a slot for a buffer of one captured all-reduce, to be filled with every
// rank's counterpart after capture, and returns the slot's address.
func (cs *captureState) share(c *Comm, ptr driver.DevicePtr, nbytes uint64) (driver.DevicePtr, error) {
	slot, err := c.table.reserve()
	if err != nil {
		return 0, err
	}
	cs.slots = append(cs.slots, slot)
	cs.ptrs = append(cs.ptrs, ptr)
	cs.sizes = append(cs.sizes, nbytes)
	return c.table.addr(slot), nil
}

// Capture records the all-reduces that fn issues on stream (and on streams forked from it)
// into a CUDA graph and returns it instantiated, ready to Launch on any stream of this device.
// It is a collective call: every rank captures the same sequence of all-reduces (ranks of one
// process call Capture from separate goroutines), and afterwards the ranks exchange their
// input buffers (and the TwoShot outputs, which it writes into directly), so those buffers
// must stay allocated while the graph is in use. Ranks that
// recorded different numbers of all-reduces get an error, never a graph that reads wrong
// memory. ctx bounds the exchange. The caller owns the returned graph (Close it).
func (c *Comm) Capture(ctx context.Context, stream *driver.Stream, fn func() error) (*driver.GraphExec, error) {
	c.mu.Lock()
	if err := c.usable(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	if c.capture != nil {
		c.mu.Unlock()
		return nil, invalid("rank %d is already capturing", c.rank)
	}
	cs := &captureState{}
	c.capture = cs
	c.mu.Unlock()

	// Relaxed mode: Go moves goroutines between OS threads, so a thread-local or global mode
	// would make unrelated CUDA calls of the program fail while we capture.
	captureErr := stream.BeginCapture(driver.CaptureRelaxed)
	var graph *driver.Graph
	if captureErr == nil {
		captureErr = fn()
		var endErr error
		graph, endErr = stream.EndCapture()
		captureErr = errors.Join(captureErr, endErr)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	c.capture = nil
	if captureErr != nil {
		// Still take part in the exchange, with nothing: the peers then fail with a count
		// mismatch at once instead of waiting for this rank until ctx ends.
		cs = &captureState{}
	}
	ptrs, err := c.exchange(ctx, cs.ptrs, cs.sizes)
	if err == nil {
		for i, slot := range cs.slots {
			if err = c.table.write(slot, ptrs[i]); err != nil {
				break
			}
		}
	}
	if err := errors.Join(captureErr, err); err != nil {
		if graph != nil {
			graph.Close()
		}
		return nil, fmt.Errorf("collective: rank %d: capture: %w", c.rank, err)
	}
	exec, err := graph.Instantiate()
	graph.Close()
	if err != nil {
		return nil, fmt.Errorf("collective: rank %d: instantiate captured graph: %w", c.rank, err)
	}
	return exec, nil
}
