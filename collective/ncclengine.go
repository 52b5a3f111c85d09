package collective

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/nccl"
)

// hostID tells hosts apart: ranks on different hosts cannot map each other's memory, so only
// NCCL serves them. It is the kernel's boot id, else the host name; for a communicator that
// may use NCCL (withNCCL), NCCL_HOSTID where set: the variable NCCL itself reads for this,
// which lets processes on one machine stand for several hosts.
func hostID(withNCCL bool) [16]byte {
	id := ""
	if withNCCL {
		id = os.Getenv("NCCL_HOSTID")
	}
	if id == "" {
		if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
			id = "boot:" + strings.TrimSpace(string(b))
		} else if name, err := os.Hostname(); err == nil {
			id = "host:" + name
		}
	} else {
		id = "nccl:" + id
	}
	sum := sha256.Sum256([]byte(id))
	var out [16]byte
	copy(out[:], sum[:])
	return out
}

// ncclComm is what the engine uses of its NCCL communicator: a *nccl.Comm, or a stand-in in
// tests that run without libnccl.
type ncclComm interface {
	AllReduce(sendbuff, recvbuff, count uint64, dt nccl.DataType, op nccl.RedOp, stream uintptr) error
	AsyncError() error
	Abort() error
	Destroy(ctx context.Context) error
}

// streamEvent is what the engine uses of a CUDA event: a *driver.Event, or a stand-in in tests
// that run without a GPU.
type streamEvent interface {
	Record(s *driver.Stream) error
	Query() (done bool, err error)
	Close() error
}

// ncclEngine is the NCCL communicator of a Comm and the watchdog that aborts it when a call
// does not complete within Options.Timeout.
type ncclEngine struct {
	comm     ncclComm
	newEvent func() (streamEvent, error) // an event of the rank's context
	timeout  time.Duration               // 0: calls may take forever

	// issuing is held while a call is inside NCCL, and by abort. The watchdog aborts from its
	// own goroutine, and ncclCommAbort frees the communicator: a call that reached NCCL then
	// would use freed memory (package nccl's rule for Comm.Abort: stop issuing work before
	// aborting). Once the handle is retired, a later call fails with nccl.ErrClosed instead.
	issuing sync.Mutex

	mu      sync.Mutex
	pending []pendingCall // calls not yet seen complete, oldest first
	spare   []streamEvent // events of completed calls, for reuse
	err     error         // the first failure: an asynchronous NCCL error or a timeout

	stop, done chan struct{}
}

// pendingCall is an all-reduce handed to NCCL, or the replay of a graph that holds some,
// between two events of its stream.
type pendingCall struct {
	start, end streamEvent   // recorded before and after the call
	began      time.Time     // when the watchdog first saw start complete; zero until then
	limit      time.Duration // how long it may run from began; 0: no limit
	what       string        // what it is, for the timeout's error
}

// ncclCallWhat names an eager all-reduce handed to NCCL in a timeout's error.
const ncclCallWhat = "an all-reduce handed to NCCL"

// ncclDataType maps the element types onto NCCL's.
func ncclDataType(dt DType) nccl.DataType {
	switch dt {
	case Float16:
		return nccl.Float16
	case BFloat16:
		return nccl.BFloat16
	}
	return nccl.Float32
}

// initNCCL initialises the NCCL communicator beside the kernels (Options.NCCL). Every rank
// takes the same steps, and the ranks agree on each outcome, so that either every rank has
// NCCL or none has.
func (c *Comm) initNCCL(ctx context.Context, infos []rankInfo) error {
	mode := c.opts.NCCL
	if mode == NCCLOff {
		c.ncclWhy = "Options.NCCL is NCCLOff"
		return nil
	}
	if mode == NCCLAuto && sharesGPUOnHost(infos) {
		c.ncclWhy = "ranks of one host share a GPU, and NCCL takes one rank per GPU of a host"
		return nil
	}
	// Can every rank load libnccl? Rank 0 also makes the unique id.
	failure := nccl.Load()
	var id nccl.UniqueID
	if failure == nil && c.rank == 0 {
		id, failure = nccl.GetUniqueID()
	}
	blobs, err := c.boot.AllGather(ctx, withStatus(id[:], failure))
	if err != nil {
		return fmt.Errorf("exchange the NCCL unique id: %w", err)
	}
	payloads, refused := splitStatus(blobs)
	if refused != nil {
		return c.noNCCL(mode, "libnccl is not usable by every rank: "+refused.Error())
	}
	if len(payloads[0]) != len(id) {
		return fmt.Errorf("NCCL unique id of %d bytes from rank 0, want %d (do all ranks run the same goccl version?)", len(payloads[0]), len(id))
	}
	copy(id[:], payloads[0])
	cfg := &nccl.Config{Bind: func() error { _, _, err := c.ctx.MemInfo(); return err }}
	if c.opts.Timeout > 0 {
		cfg.OpTimeout = c.opts.Timeout
	}
	// Started, then connected: the ranks agree on each. A rank whose start fails (a bind, no
	// network interface that NCCL may use) never joins NCCL's bootstrap, and the others would
	// wait for it to connect until ctx ends, then fail New instead of going on without NCCL.
	comm, initErr := nccl.StartInitRank(id, c.size, c.rank, cfg)
	for step := range 2 {
		if step == 1 && initErr == nil {
			if initErr = comm.WaitReady(ctx); initErr != nil {
				initErr = fmt.Errorf("init NCCL: %w", initErr)
			}
		}
		blobs, err = c.boot.AllGather(ctx, withStatus(nil, initErr))
		if err == nil {
			_, err = splitStatus(blobs)
		}
		if err != nil {
			if comm != nil {
				comm.Abort() // after a failed init the communicator is only good for freeing
			}
			return c.noNCCL(mode, "NCCL init failed: "+err.Error())
		}
	}
	var timeout time.Duration
	if c.opts.Timeout > 0 {
		timeout = c.opts.Timeout
	}
	c.nccl = newNCCLEngine(comm, func() (streamEvent, error) { return c.ctx.NewEvent(false) }, timeout)
	return nil
}

// newNCCLEngine starts the watchdog of comm, whose calls must complete within timeout (0: no
// limit). newEvent makes the events that follow the calls.
func newNCCLEngine(comm ncclComm, newEvent func() (streamEvent, error), timeout time.Duration) *ncclEngine {
	e := &ncclEngine{comm: comm, newEvent: newEvent, timeout: timeout, stop: make(chan struct{}), done: make(chan struct{})}
	go e.watch()
	return e
}

// noNCCL records why there is no NCCL, which is an error only with NCCLAlways.
func (c *Comm) noNCCL(mode NCCLMode, why string) error {
	c.ncclWhy = why
	if mode == NCCLAlways {
		return fmt.Errorf("Options.NCCL is NCCLAlways, but %s", why)
	}
	return nil
}

// sharesGPUOnHost reports whether two ranks of one host run on one GPU.
func sharesGPUOnHost(infos []rankInfo) bool {
	type gpu struct{ host, uuid [16]byte }
	seen := map[gpu]bool{}
	for _, ri := range infos {
		k := gpu{ri.Host, ri.UUID}
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	return false
}

// errQueued marks the error of an NCCL call, or of a replay, that failed after its work was
// queued on the stream: Close must still wait for that work (the engine's abort ends it).
var errQueued = errors.New("its work was queued, and the NCCL communicator aborted to end it")

// ncclAllReduce hands one all-reduce to NCCL and lets the watchdog and Close follow it.
func (c *Comm) ncclAllReduce(stream *driver.Stream, dst, src driver.DevicePtr, count int, dt DType) error {
	capturing, err := stream.IsCapturing()
	if err != nil {
		return c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, err))
	}
	// A captured call runs when the caller's graph does.
	if err := c.nccl.allReduce(stream, dst, src, count, dt, !capturing); err != nil {
		if errors.Is(err, errQueued) {
			_ = c.work.note(stream) // for Close to wait for; the engine has failed already
		}
		if failed := c.usable(); failed != nil {
			return failed // NCCL refused the call: the engine failed
		}
		return c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, err))
	}
	if !capturing {
		if err := c.work.note(stream); err != nil {
			return c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, err))
		}
	} else if c.capture != nil {
		c.capture.ncclCalls++ // Capture's graph: Graph.Launch lets the watchdog follow it
	}
	return nil
}

// allReduce queues one all-reduce on stream through NCCL and, when follow is set, lets the
// watchdog follow it. Every error fails the engine: one of NCCL, and one of the events, which
// leaves this rank out of step with its peers (the call not made while theirs are) or a call
// queued that neither the watchdog nor Close follows.
func (e *ncclEngine) allReduce(stream *driver.Stream, dst, src driver.DevicePtr, count int, dt DType, follow bool) error {
	var start streamEvent
	if follow {
		// The call's time counts from when the stream reaches it, not from its queuing: work
		// queued ahead of it on the stream is not the call's.
		var err error
		if start, err = e.record(stream); err != nil {
			e.fail(fmt.Errorf("the all-reduce was not made: %w", err))
			return err
		}
	}
	e.issuing.Lock()
	err := e.comm.AllReduce(uint64(src), uint64(dst), uint64(count), ncclDataType(dt), nccl.Sum, stream.Handle())
	e.issuing.Unlock()
	if err != nil {
		if start != nil {
			e.giveBack(start)
		}
		e.fail(err)
		return err
	}
	if !follow {
		return nil
	}
	return e.follow(stream, start, e.timeout, ncclCallWhat)
}

// follow records the end of a call that began at start on stream and hands the call to the
// watchdog, which gives it limit from when the stream reaches start. Without its end the call,
// queued already, would run unwatched: that fails the engine, whose abort ends it.
func (e *ncclEngine) follow(stream *driver.Stream, start streamEvent, limit time.Duration, what string) error {
	end, err := e.record(stream)
	if err != nil {
		e.giveBack(start)
		e.fail(fmt.Errorf("%s was queued but cannot be followed: %w", what, err))
		return fmt.Errorf("%w (%w)", err, errQueued)
	}
	e.mu.Lock()
	e.pending = append(e.pending, pendingCall{start: start, end: end, limit: limit, what: what})
	e.mu.Unlock()
	return nil
}

// replay launches a graph that holds calls captured calls, some of them NCCL's, on stream, and
// lets the watchdog follow the replay as one call that must complete within the timeout
// times calls of when its stream reaches it: the watchdog cannot see the graph's calls one
// by one, and each of them may take up to the timeout. what names the graph in a timeout's
// error. The launch is made as a call is, with no abort under way, and never once the engine
// has failed: an aborted communicator has freed what the graph's NCCL calls use.
func (e *ncclEngine) replay(stream *driver.Stream, launch func() error, calls int, what string) error {
	start, err := e.record(stream)
	if err != nil {
		// The peers replay theirs: this rank, out of step, cannot go on.
		e.fail(fmt.Errorf("%s was not launched: %w", what, err))
		return err
	}
	e.issuing.Lock()
	if err = e.failure(); err == nil {
		err = launch()
	}
	e.issuing.Unlock()
	if err != nil {
		e.giveBack(start)
		return err
	}
	n := time.Duration(max(calls, 1))
	limit := e.timeout * n
	if e.timeout > 0 && limit/n != e.timeout {
		limit = math.MaxInt64 // the product overflows: as good as no limit
	}
	return e.follow(stream, start, limit, what)
}

// record records an event (a spare one, else a new one) at the current end of stream.
func (e *ncclEngine) record(stream *driver.Stream) (streamEvent, error) {
	e.mu.Lock()
	if len(e.spare) == 0 && e.err == nil {
		// The watchdog retires calls only every few milliseconds: without this, calls made
		// faster than that would each create two events until its next check, and the spare
		// events would pile up to the calls of a check's period instead of those in flight.
		// A failed query is left to the watchdog, which fails the engine on it.
		_, _ = e.retireLocked()
	}
	var ev streamEvent
	if n := len(e.spare); n > 0 {
		ev, e.spare = e.spare[n-1], e.spare[:n-1]
	}
	e.mu.Unlock()
	if ev == nil {
		var err error
		if ev, err = e.newEvent(); err != nil {
			return nil, fmt.Errorf("event to follow an NCCL call: %w", err)
		}
	}
	if err := ev.Record(stream); err != nil {
		ev.Close()
		return nil, fmt.Errorf("event to follow an NCCL call: %w", err)
	}
	return ev, nil
}

// giveBack keeps ev for reuse.
func (e *ncclEngine) giveBack(ev streamEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.spare = append(e.spare, ev)
}

// watch checks the calls in flight and NCCL's asynchronous error until close, and aborts the
// communicator once the engine has failed.
func (e *ncclEngine) watch() {
	defer close(e.done)
	period := 10 * time.Millisecond
	if e.timeout > 0 {
		period = min(period, max(time.Millisecond, e.timeout/20))
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-tick.C:
			if e.check() {
				e.abort()
			}
		}
	}
}

// check retires completed calls, fails the engine when the oldest call has taken longer than
// the timeout, and picks up NCCL's asynchronous error. It reports whether it failed the engine
// (the caller then aborts the communicator).
func (e *ncclEngine) check() (failed bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return false
	}
	oldest, err := e.retireLocked()
	if err != nil {
		return e.failLocked(err)
	}
	// Only the oldest call is followed: a later one waits inside NCCL for it, and its time
	// counts once it is the oldest, from when its stream has reached it.
	if p := oldest; p != nil {
		if p.began.IsZero() {
			started, err := p.start.Query()
			if err != nil {
				return e.failLocked(err)
			}
			if started {
				p.began = time.Now()
			}
		}
		if !p.began.IsZero() && p.limit > 0 && time.Since(p.began) > p.limit {
			return e.failLocked(fmt.Errorf("%w: %s has not completed %v after it could start (a peer missing, stuck or dead?)", ErrTimeout, p.what, time.Since(p.began).Round(time.Millisecond)))
		}
	}
	if err := e.comm.AsyncError(); err != nil && !errors.Is(err, nccl.ErrInProgress) && !errors.Is(err, nccl.ErrClosed) {
		return e.failLocked(err)
	}
	return false
}

// retireLocked moves the events of the completed calls at the front of the queue to spare
// and returns the oldest call still running (nil when none is). What is left moves to the
// front of the queue's array, so that the array serves every call after the first few
// (reslicing past the completed calls would shrink it until every call allocated a new one).
// An error is an event's query failing; the calls before it are retired.
func (e *ncclEngine) retireLocked() (oldest *pendingCall, err error) {
	completed := 0
	for ; completed < len(e.pending); completed++ {
		p := &e.pending[completed]
		done, qerr := p.end.Query()
		if qerr != nil || !done {
			err = qerr
			break
		}
		e.spare = append(e.spare, p.start, p.end)
	}
	if completed > 0 {
		n := copy(e.pending, e.pending[completed:])
		clear(e.pending[n:])
		e.pending = e.pending[:n]
	}
	if len(e.pending) > 0 && err == nil {
		oldest = &e.pending[0]
	}
	return oldest, err
}

// fail records err as the engine's failure, if it is the first, and aborts the communicator.
func (e *ncclEngine) fail(err error) {
	e.mu.Lock()
	first := e.failLocked(err)
	e.mu.Unlock()
	if first {
		e.abort()
	}
}

// failLocked records err as the engine's failure unless one came first, and reports whether it
// did. Every failure is followed by abort: NCCL's kernels already queued wait for their peers
// until the communicator is aborted (an asynchronous error does not end them), so without it
// the rank's streams, and Close, which waits for this communicator's work, would wait forever.
func (e *ncclEngine) failLocked(err error) bool {
	if e.err != nil {
		return false
	}
	e.err = fmt.Errorf("%w: NCCL: %w; the NCCL communicator was aborted: close this communicator and make a new one", ErrUnusable, err)
	return true
}

// abort aborts the communicator (again: it does nothing then), once no call is inside NCCL.
// A call waits inside NCCL for at most the communicator's OpTimeout (Options.Timeout), after
// which nccl.Comm aborts the communicator itself.
func (e *ncclEngine) abort() {
	e.issuing.Lock()
	defer e.issuing.Unlock()
	_ = e.comm.Abort() // nothing else to do if even the abort fails: the engine has failed already
}

// failure returns the engine's first failure, or nil.
func (e *ncclEngine) failure() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// close stops the watchdog and frees the NCCL communicator: Destroy once its work is done,
// bounded by ctx, else Abort.
func (e *ncclEngine) close(ctx context.Context) error {
	close(e.stop)
	<-e.done
	var err error
	if e.failure() != nil {
		err = e.comm.Abort()
	} else {
		err = e.comm.Destroy(ctx)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.pending {
		p.start.Close()
		p.end.Close()
	}
	for _, ev := range e.spare {
		ev.Close()
	}
	e.pending, e.spare = nil, nil
	return err
}
