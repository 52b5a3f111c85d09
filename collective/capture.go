package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goccl/goccl/driver"
)

// captureState records the buffers of the pull all-reduces issued while a graph is being
// captured. Their peers' pointers are not known during capture (a rank cannot talk to its
// peers from inside a stream capture), so each shared buffer (an input read in place, or an
// output the direct TwoShot writes into) gets an empty registration slot that Capture fills
// once every rank has finished capturing. A buffer used by several calls of one capture (a
// serving engine reuses one buffer in every layer) has one slot.
type captureState struct {
	stream *driver.Stream           // the stream being captured; nil in tests of the bookkeeping alone
	id     uint64                   // the capture's id (driver.Stream.CaptureID); 0 if unknown
	index  map[driver.DevicePtr]int // buffer -> its position in bufs
	bufs   []driver.DevicePtr
	sizes  []uint64 // the largest use of each buffer
	slots  []int
	uses   []uint32 // per shared use, in call order: its buffer's position

	// The calls recorded: kernel launches and all-reduces handed to NCCL. A replay of a graph
	// holding NCCL calls is followed by the NCCL watchdog as one call of that many.
	launches, ncclCalls int
}

func newCaptureState() *captureState {
	return &captureState{index: map[driver.DevicePtr]int{}}
}

// records reports whether a call on stream is one this capture records: a call on the stream
// being captured (two wrappers of one CUstream are one stream), or on a stream forked from it,
// which the driver records into the same graph (the same capture id). Capture runs fn
// without holding the communicator's lock, so a call on another stream can come meanwhile,
// from another goroutine or from fn: that call is eager, and must neither take this capture's
// slots nor add to its pattern, and Close must wait for its work.
func (cs *captureState) records(stream *driver.Stream) bool {
	if stream == nil || cs.stream == nil {
		return stream == cs.stream
	}
	if stream == cs.stream || stream.Handle() != 0 && stream.Handle() == cs.stream.Handle() {
		return true
	}
	if cs.id == 0 {
		return false
	}
	id, err := stream.CaptureID()
	return err == nil && id == cs.id
}

// callOn makes c.capture, for the length of one call on stream, the capture that the call
// records into: the one in progress if the call is on the stream being captured, else none.
// It returns the capture it hid, which endCall puts back when the call is done:
//
//	defer c.endCall(c.callOn(stream))
//
// The call holds c.mu from before callOn to after endCall, so no other goroutine sees the
// capture hidden, and everything the call consults (sharedOutput, inputSlot, pullOutput,
// route, shape, launch) needs only ask whether c.capture is set. It costs no allocation.
func (c *Comm) callOn(stream *driver.Stream) (hidden *captureState) {
	if cs := c.capture; cs != nil && !cs.records(stream) {
		c.capture = nil
		return cs
	}
	return nil
}

// endCall puts back the capture that callOn hid, if any.
func (c *Comm) endCall(hidden *captureState) {
	if hidden != nil {
		c.capture = hidden
	}
}

// record returns the input slot of one captured all-reduce, and whether it is the staging
// slot (see Comm.inputSlot).
func (cs *captureState) record(c *Comm, algo Algorithm, dst, src driver.DevicePtr, nbytes uint64) (slot driver.DevicePtr, staged bool, err error) {
	if !readsInPlace(algo, dst, src, nbytes) {
		// In place: peers must not read a buffer this rank overwrites, so the input goes
		// through the staging buffer, as an eager call's does: OneShot's kernel node copies it
		// there itself (ptx.FlagStageInput), the fused kernels' get a copy node before them.
		return c.table.addr(0), true, nil
	}
	slot, err = cs.share(c, src, nbytes)
	return slot, false, err
}

// share returns the slot through which the peers' counterparts of ptr are found, reserving it
// at the buffer's first use in this capture.
func (cs *captureState) share(c *Comm, ptr driver.DevicePtr, nbytes uint64) (driver.DevicePtr, error) {
	i, ok := cs.index[ptr]
	if !ok {
		slot, err := c.table.reserve()
		if err != nil {
			return 0, err
		}
		i = len(cs.bufs)
		cs.index[ptr] = i
		cs.bufs = append(cs.bufs, ptr)
		cs.sizes = append(cs.sizes, nbytes)
		cs.slots = append(cs.slots, slot)
	}
	cs.sizes[i] = max(cs.sizes[i], nbytes)
	cs.uses = append(cs.uses, uint32(i))
	return c.table.addr(cs.slots[i]), nil
}

// pattern encodes which captured calls share a buffer: it must be the same on every rank.
func (cs *captureState) pattern() []byte {
	b := make([]byte, 4*len(cs.uses))
	for i, u := range cs.uses {
		binary.LittleEndian.PutUint32(b[4*i:], u)
	}
	return b
}

// Graph is a CUDA graph of all-reduces recorded by Capture. It holds registration slots and
// the mappings of the peers' captured buffers until Close. Launch it with Launch (which lets
// Close wait for its runs); Exec gives the executable for embedding into a larger graph.
type Graph struct {
	c     *Comm
	exec  *driver.GraphExec // nil once destroyed
	slots []int
	keys  []ipcKey
	done  bool // closed, or its communicator closed

	// calls is how many calls the graph holds, ncclCalls how many of them NCCL's; what names
	// the graph in the NCCL watchdog's timeout.
	calls, ncclCalls int
	what             string
}

// Exec returns the instantiated CUDA graph, or nil once the graph or its communicator is
// closed. A caller that launches it other than through Launch (as a child graph, say) must
// make sure those runs are complete before Close, and no watchdog follows those runs: the
// NCCL calls the graph may hold (see Launch) then wait for their peers as long as NCCL does.
func (g *Graph) Exec() *driver.GraphExec {
	if g == nil || g.c == nil {
		return nil
	}
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	return g.exec
}

// Launch replays the graph on stream. Every rank replays its own graph of the same capture,
// in the same order as its other calls of the communicator.
//
// A graph that holds all-reduces handed to NCCL is followed by the NCCL watchdog as eager NCCL
// calls are, as a whole: a replay that has not completed within Options.Timeout times the
// number of calls it holds (goccl's kernels and NCCL's), counted from when stream reaches
// it, aborts the NCCL communicator (Err then reports ErrTimeout), so that a peer that never
// replays its graph cannot hold this rank's stream forever. Work of the caller's own that fn
// queued into the graph counts against that limit too.
func (g *Graph) Launch(stream *driver.Stream) error {
	if g == nil || g.c == nil {
		return errNilHandle("*Graph")
	}
	c := g.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.done {
		return fmt.Errorf("%w: launch of a closed graph", ErrClosed)
	}
	if err := c.usable(); err != nil {
		return err
	}
	// Refused before anything is recorded on it: a replay the NCCL engine could not follow
	// would fail the engine.
	if err := c.checkStream(stream); err != nil {
		return err
	}
	var err error
	if g.ncclCalls > 0 && c.nccl != nil {
		err = c.nccl.replay(stream, func() error { return g.exec.Launch(stream) }, g.calls, g.what)
	} else {
		err = g.exec.Launch(stream)
	}
	if err != nil {
		if errors.Is(err, errQueued) {
			_ = c.work.note(stream) // for Close to wait for; the engine has failed already
		}
		if failed := c.usable(); failed != nil {
			return failed // the NCCL engine failed: the graph was not launched, or was aborted
		}
		return c.fail(fmt.Errorf("collective: rank %d: launch graph: %w", c.rank, err))
	}
	if err := c.work.note(stream); err != nil {
		return c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, err))
	}
	return nil
}

// Close waits for this communicator's queued work (bounded like Comm.Close), gives back the
// graph's registration slots and peer mappings, and destroys the executable. The
// communicator's Close does all of that for the graphs still open, so a Close after it does
// nothing and returns nil. Closing twice does nothing.
func (g *Graph) Close() error {
	if g == nil || g.c == nil {
		return nil
	}
	c := g.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.done {
		return nil
	}
	if err := c.drain(); err != nil {
		return fmt.Errorf("collective: rank %d: close graph: %w", c.rank, err)
	}
	g.done = true
	delete(c.graphs, g)
	err := errors.Join(c.table.release(g.slots...), c.unopen(g.keys), g.exec.Close())
	g.exec = nil
	if err != nil {
		return fmt.Errorf("collective: rank %d: close graph: %w", c.rank, err)
	}
	return nil
}

// Capture records the all-reduces that fn issues on stream into a CUDA graph and returns it
// instantiated, ready to Launch on any stream of this device. It is a collective call: every
// rank captures the same sequence of all-reduces (ranks of one process call Capture from
// separate goroutines), and afterwards the ranks exchange their input buffers (and the TwoShot
// outputs, which it writes into directly), so those buffers must stay allocated while the
// graph is in use. Ranks that recorded different numbers of all-reduces, or that share
// buffers between calls in different ways, get an error, never a graph that reads wrong
// memory; a rank whose capture failed makes every rank fail at once (*RefusedError names it).
// ctx bounds the exchange. The caller owns the returned graph: Close it to give its
// registration slots back.
//
// Only calls on stream, and on streams forked from it (which the driver records into the same
// graph: the same capture id), are Capture's: calls of this communicator on other streams
// while fn runs, from other goroutines or from fn, are eager calls, as outside Capture. (A
// driver older than CUDA 11.3 cannot tell a forked stream: a call there is then an eager call
// captured into the graph, its input through the staging buffer unless registered.)
//
// A Capture that this rank refuses before it records (a failed communicator, a nil or
// unusable stream, a nil fn) is refused on every rank: the refusal goes to the peers through
// the exchange, as a refused Register's does. Two exceptions return at once on this rank
// alone: a closed communicator (its bootstrap is closed, so the peers' exchange fails at
// once anyway), and a Capture while this rank is already capturing (Capture inside fn, or
// from another goroutine): its exchange would pair with the peers' exchange of the capture in
// progress.
//
// If fn panics, Capture ends the stream capture, gives back the slots the capture reserved
// and takes the rank out of capture (eager calls go on as before), and the panic goes on.
// This rank then takes no part in the exchange: the peers' Capture fails when their ctx ends,
// and the bootstrap, failed by that, refuses later Register and Capture calls on every rank.
func (c *Comm) Capture(ctx context.Context, stream *driver.Stream, fn func() error) (*Graph, error) {
	if c == nil {
		return nil, errNilComm
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if c.capture != nil {
		c.mu.Unlock()
		return nil, invalid("rank %d is already capturing", c.rank)
	}
	refusal := c.usable()
	if refusal == nil {
		if fn == nil {
			refusal = invalid("capture of a nil fn: pass the function that makes the calls to record")
		} else {
			refusal = c.checkStream(stream)
		}
	}
	if refusal != nil {
		defer c.mu.Unlock()
		if _, _, err := c.exchange(ctx, nil, nil, nil, refusal); err != refusal {
			// The peers may not have heard of it: the exchange itself failed.
			refusal = errors.Join(refusal, err)
		}
		return nil, fmt.Errorf("collective: rank %d: capture: %w", c.rank, refusal)
	}
	cs := newCaptureState()
	cs.stream = stream
	c.capture = cs
	c.mu.Unlock()

	// Relaxed mode: Go moves goroutines between OS threads, so a thread-local or global mode
	// would make unrelated CUDA calls of the program fail while we capture.
	captureErr := stream.BeginCapture(driver.CaptureRelaxed)
	var graph *driver.Graph
	if captureErr == nil {
		// The capture's id, which every stream forked from stream shares (records). A driver
		// that cannot tell leaves 0: then calls on stream alone are the capture's.
		if id, err := stream.CaptureID(); err == nil {
			c.mu.Lock()
			cs.id = id
			c.mu.Unlock()
		}
		graph, captureErr = c.record(stream, cs, fn)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	c.capture = nil
	if c.closed {
		// Close failed the bootstrap, so there is no exchange to make, and once Close has
		// released the table there are no slots to give back either (they were never
		// written: the exchange fills them).
		graph.Close()
		if !c.released {
			c.table.unreserve(cs.slots...)
		}
		return nil, fmt.Errorf("collective: rank %d: capture: %w", c.rank, errors.Join(ErrClosed, captureErr, c.releasePendingNow()))
	}
	// A failed capture still takes part in the exchange, with its failure: the peers then
	// fail at once instead of waiting for this rank until ctx ends.
	ptrs, keys, err := c.exchange(ctx, cs.bufs, cs.sizes, cs.pattern(), captureErr)
	if err == nil {
		for i, slot := range cs.slots {
			if err = c.table.write(slot, ptrs[i]); err != nil {
				break
			}
		}
	}
	var exec *driver.GraphExec
	if err == nil {
		if exec, err = graph.Instantiate(); err != nil {
			err = fmt.Errorf("instantiate captured graph: %w", err)
		}
	}
	if graph != nil {
		graph.Close()
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("collective: rank %d: capture: %w", c.rank, err),
			c.table.release(cs.slots...), c.unopen(keys))
	}
	g := &Graph{c: c, exec: exec, slots: cs.slots, keys: keys, calls: cs.launches + cs.ncclCalls, ncclCalls: cs.ncclCalls}
	if g.ncclCalls > 0 {
		g.what = fmt.Sprintf("a replay of a captured graph of %d call(s), %d of them handed to NCCL", g.calls, g.ncclCalls)
	}
	c.graphs[g] = struct{}{}
	return g, nil
}

// record runs fn inside the capture begun on stream and ends the capture. If fn does not
// return (it panics, or ends its goroutine), record ends the capture and destroys what it
// recorded, takes the communicator out of capture and gives back the slots that fn's calls
// reserved, and lets the panic go on: left as it was, the stream would stay in capture and
// every later Capture of this rank would be refused as "already capturing".
func (c *Comm) record(stream *driver.Stream, cs *captureState, fn func() error) (graph *driver.Graph, err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if g, endErr := stream.EndCapture(); endErr == nil {
			g.Close()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.capture == cs {
			c.capture = nil
		}
		if !c.released {
			// Never written: the slots are filled only after the exchange.
			c.table.unreserve(cs.slots...)
		}
		_ = c.releasePendingNow() // a Close that came meanwhile; the panic goes on
	}()
	err = fn()
	returned = true
	graph, endErr := stream.EndCapture()
	return graph, errors.Join(err, endErr)
}
