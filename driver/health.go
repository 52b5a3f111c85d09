package driver

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Health reports whether the context can still run work: nil while it can, else the error the
// driver keeps for it, which matches ErrContextLost after a kernel fault (see ErrContextLost
// for what that means for the process). It neither waits for queued work nor blocks behind it,
// so it suits a watchdog or a check before each call; work that is still queued or running is
// not an error.
//
// It asks cuStreamQuery about an idle stream of the context that Health creates on first use
// (non-blocking, owned by c, destroyed by Close). A query is the call whose job is to report
// the state of asynchronous work, errors included, without blocking; on an idle stream it has
// no work of its own to look at, so what it returns is the context's state. The legacy default
// stream is not queried instead: it would join the work of other libraries on blocking
// streams and break their stream captures. Each call costs cuCtxSetCurrent and cuStreamQuery
// (plus two thread-local cuThreadExchangeStreamCaptureMode calls) and no allocation; the first
// also creates the stream. The thread's capture mode is relaxed for the query, so that a
// stream capture running in CaptureGlobal mode on another thread neither refuses it nor is
// broken by it.
//
// Whether a fault shows here before anything waited on the faulting stream depends on when
// the driver registers it; once a wait (Stream.Wait, Event.Wait) returned the fault, Health
// returns it too. Safe from several goroutines.
func (c *Context) Health() error {
	if err := c.live(); err != nil {
		return err
	}
	c.health.Lock()
	defer c.health.Unlock()
	if c.closed.Load() { // closed while this call waited: no new stream in a closed context
		return errContextClosed()
	}
	runtime.LockOSThread()
	r, failed := c.healthQuery()
	runtime.UnlockOSThread()
	if r == 0 || r == 600 { // idle, or work of Health's stream still running: both fine
		return nil
	}
	err := newError(failed, r)
	if contextLost(r) {
		return fmt.Errorf("CUDA context of device %d is lost: %w", c.dev, err)
	}
	return fmt.Errorf("check the CUDA context of device %d: %w", c.dev, err)
}

// healthQuery runs Health's calls on the locked thread, with c.health held, and returns the
// first failing result and the function that gave it (0 for success).
func (c *Context) healthQuery() (Result, uintptr) {
	if cuThreadExchangeStreamCaptureMode != 0 {
		c.health.mode = int32(CaptureRelaxed)
		mode := uintptr(unsafe.Pointer(&c.health.mode))
		if r := rawHot(cuThreadExchangeStreamCaptureMode, mode); r != 0 {
			return r, cuThreadExchangeStreamCaptureMode
		}
		// The exchange left the thread's previous mode in c.health.mode: put it back.
		defer rawHot(cuThreadExchangeStreamCaptureMode, mode)
	}
	if r := rawHot(cuCtxSetCurrent, c.handle); r != 0 {
		return r, cuCtxSetCurrent
	}
	if c.health.stream == 0 {
		if r := rawHot(cuStreamCreate, uintptr(unsafe.Pointer(&c.health.stream)), streamNonBlocking); r != 0 {
			c.health.stream = 0
			return r, cuStreamCreate
		}
	}
	return rawHot(cuStreamQuery, c.health.stream), cuStreamQuery
}

// closeHealth destroys the stream of Health, if any. A lost context fails every call, the
// destruction too; its stream is gone with it, so that error is not Close's.
func (c *Context) closeHealth() error {
	c.health.Lock()
	defer c.health.Unlock()
	s := c.health.stream
	if s == 0 {
		return nil
	}
	c.health.stream = 0
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := call(cuCtxSetCurrent, c.handle)
	if err == nil {
		err = call(cuStreamDestroy_v2, s)
	}
	if err != nil && !isLost(err) {
		return fmt.Errorf("destroy the health-check stream of device %d: %w", c.dev, err)
	}
	return nil
}

// isLost reports whether err is an *Error whose code leaves the context unusable.
func isLost(err error) bool {
	e, ok := err.(*Error)
	return ok && contextLost(e.Code)
}
