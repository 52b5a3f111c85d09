package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/goccl/goccl/driver"
)

// workTracker remembers, per stream, an event recorded after this communicator's last launch
// on it, so that Close, Registration.Release and Graph.Close wait for this communicator's own
// work only, never for the rest of the context (a service's other kernels on the same GPU).
type workTracker struct {
	ctx    *driver.Context
	events map[uintptr]*driver.Event // stream handle -> event after our last work on it
}

// maxTrackedStreams bounds the tracker: past it, entries whose work is complete are dropped.
const maxTrackedStreams = 256

// note records an event on stream after the work just enqueued there. It is skipped while the
// stream is being captured: the capture's work runs when its graph is launched, which
// Graph.Launch notes instead.
func (w *workTracker) note(stream *driver.Stream) error {
	ev := w.events[stream.Handle()]
	if ev == nil {
		if len(w.events) >= maxTrackedStreams {
			w.forgetDone()
		}
		var err error
		if ev, err = w.ctx.NewEvent(false); err != nil {
			return fmt.Errorf("event to track this communicator's work: %w", err)
		}
		w.events[stream.Handle()] = ev
	}
	return ev.Record(stream)
}

// forgetDone drops the events whose work is complete.
func (w *workTracker) forgetDone() {
	for h, ev := range w.events {
		if done, err := ev.Query(); done || err != nil {
			ev.Close()
			delete(w.events, h)
		}
	}
}

// wait returns once every tracked event has completed, or fails when ctx ends first (the
// work is then still running: the caller must not free anything it uses).
func (w *workTracker) wait(ctx context.Context) error {
	for _, ev := range w.events {
		if err := ev.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (w *workTracker) close() error {
	var errs []error
	for h, ev := range w.events {
		errs = append(errs, ev.Close())
		delete(w.events, h)
	}
	return errors.Join(errs...)
}

// drainLimit is how long Close and the release of shared buffers wait for this
// communicator's queued work: twice the watchdog timeout plus a few seconds, since a kernel
// gives up after Options.Timeout (a minute when kernels may wait forever).
func (c *Comm) drainLimit() time.Duration {
	if c.drainOverride > 0 {
		return c.drainOverride
	}
	const slack = 5 * time.Second
	switch t := c.opts.Timeout; {
	case t < 0:
		return time.Minute
	case t > (math.MaxInt64-slack)/2:
		// A timeout meant as "forever": the sum saturates instead of wrapping negative.
		return math.MaxInt64
	default:
		return 2*t + slack
	}
}

// drain waits for this communicator's queued work (eager calls and graph launches), bounded
// by drainLimit.
func (c *Comm) drain() error {
	return c.drainBy(time.Now().Add(c.drainLimit()))
}

// drainBy is drain with the limit counted from an earlier start: the work done by deadline,
// or an error.
func (c *Comm) drainBy(deadline time.Time) error {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := c.work.wait(ctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("this communicator's kernels are still running after %v; nothing was freed (call Close again later): %w", c.drainLimit(), err)
		}
		return err
	}
	return nil
}

// Close releases everything the rank holds, once this rank's own queued work (not the rest of
// the context's) has finished; peers should close too, since their kernels can no longer reach
// this rank. The communicator takes no new work from the first Close on. If the work does not
// finish within twice Options.Timeout plus a few seconds, Close frees nothing and returns an
// error; calling Close again waits again and frees everything once the work is done. After a
// Close that returned nil, Close returns nil.
//
// While a Capture is recording (its fn runs, in another goroutine, or fn calls Close), Close
// frees nothing and returns: that Capture frees everything once fn has returned and its graph
// is destroyed, since the graph may hold NCCL calls, and NCCL destroys a communicator only
// once the graphs that use it are gone.
//
// Close first closes the bootstrap, so that a Register or Capture of this rank waiting for its
// peers fails at once (with the bootstrap's error) instead of holding Close up until its ctx
// ends; the peers' exchanges in progress fail too. The limit above counts from the call, also
// when Close waits for a Release or Graph.Close of another goroutine that waits for the same
// work.
func (c *Comm) Close() error {
	if c == nil {
		return nil
	}
	deadline := time.Now().Add(c.drainLimit())
	// Bootstrap.Close is safe from any goroutine and makes a call in progress fail. The
	// communicator needs the bootstrap for no more than Register's and Capture's exchanges,
	// which a closed communicator no longer makes.
	var bootErr error
	if c.boot != nil {
		bootErr = c.boot.Close()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return nil
	}
	c.closed = true
	if bootErr != nil {
		bootErr = fmt.Errorf("collective: close rank %d: close bootstrap: %w", c.rank, bootErr)
	}
	drainErr := c.drainBy(deadline)
	if drainErr != nil && !errors.Is(drainErr, driver.ErrContextLost) {
		return errors.Join(fmt.Errorf("collective: close rank %d: %w", c.rank, drainErr), bootErr)
	}
	// A lost context runs nothing any more: release what can be released. What failed before
	// Close stays what Err reports after it: read it while the error record and the NCCL
	// engine still exist (a kernel's record, which a lost context can follow, first).
	c.latchFailure()
	if drainErr != nil {
		c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, drainErr))
	}
	c.releasePending = true
	if c.capture != nil {
		// A Capture is recording: its fn runs, in another goroutine or calling this Close. Its
		// graph may hold NCCL calls, and NCCL destroys a communicator only once the graphs
		// that use it are gone: the Capture frees everything once fn has returned and its
		// graph is destroyed (releasePendingNow). fn's calls fail with ErrClosed from now on.
		return bootErr
	}
	return errors.Join(bootErr, c.releasePendingNow())
}

// releasePendingNow frees everything if a Close asked for it (releasePending): at the end of
// that Close, or, where a Capture was recording, when the Capture ends (with c.mu held, once
// fn has returned and its graph is destroyed).
func (c *Comm) releasePendingNow() error {
	if !c.releasePending || c.released {
		return nil
	}
	c.releasePending = false
	c.latchFailure() // also what failed while the Capture recorded
	c.released = true
	return c.release()
}

// release frees in reverse order of init; it tolerates a partly built Comm.
func (c *Comm) release() error {
	var errs []error
	// Graphs and registrations still held by the caller become inert: their slots and
	// mappings go with the table and the opened buffers below. A graph's executable is
	// destroyed here, while the context is still open: a Graph.Close after this Close could no
	// longer destroy it, and the executable would leak. It goes before the NCCL
	// communicator, whose calls it may hold: NCCL frees what a captured call keeps when the
	// graph goes, and that must find the communicator still there.
	for g := range c.graphs {
		errs = append(errs, g.exec.Close())
		g.exec = nil
		g.done = true
	}
	clear(c.graphs)
	if c.nccl != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.drainLimit())
		errs = append(errs, c.nccl.close(ctx))
		cancel()
	}
	for _, reg := range c.registered {
		reg.done = true
	}
	for _, ob := range c.opened {
		errs = append(errs, ob.m.Close())
	}
	for _, m := range c.peers {
		errs = append(errs, m.Close())
	}
	if c.table != nil {
		errs = append(errs, c.table.close())
	}
	if c.errRec != nil {
		errs = append(errs, c.errRec.Close())
	}
	if c.arena != nil {
		errs = append(errs, c.arena.Close())
	}
	if c.work.ctx != nil {
		errs = append(errs, c.work.close())
	}
	for dt, h := range c.heldNorms {
		if h.key.entry != "" {
			releaseModule(h.key)
			c.heldNorms[dt] = heldNorm{}
		}
	}
	if c.kernels != nil {
		errs = append(errs, c.kernels.release())
	}
	for _, p := range c.peerCtx {
		errs = append(errs, p.Close())
	}
	if c.boot != nil {
		errs = append(errs, c.boot.Close())
	}
	if c.ctx != nil {
		errs = append(errs, c.ctx.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("collective: close rank %d: %w", c.rank, err)
	}
	return nil
}
