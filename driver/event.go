package driver

import (
	"context"
	"fmt"
	"time"
	"unsafe"
)

// cuEventCreate flag: no timestamp, which makes record and wait cheaper.
const eventDisableTiming = 0x2

// Event is a CUDA event: a marker in a stream that other streams and the host can wait for,
// without waiting for anything queued after it (Query, Wait). Close destroys it.
type Event struct {
	ctx    *Context
	handle uintptr // CUevent; 0 once closed
}

// NewEvent creates an event (cuEventCreate). timing=false gives CU_EVENT_DISABLE_TIMING:
// cheaper, but not usable with Elapsed.
func (c *Context) NewEvent(timing bool) (*Event, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	flags := uintptr(eventDisableTiming)
	if timing {
		flags = 0
	}
	var h uintptr
	if err := c.call(cuEventCreate, uintptr(unsafe.Pointer(&h)), flags); err != nil {
		return nil, fmt.Errorf("create event on device %d: %w", c.dev, err)
	}
	return &Event{ctx: c, handle: h}, nil
}

func (e *Event) live() error {
	if e == nil || e.handle == 0 {
		return errClosed("event")
	}
	return nil
}

// Record marks the current end of s in e (cuEventRecord). s may be a wrapped stream (see
// WrapStream); the driver needs it in e's context, which this checks first, comparing the
// CUcontext handles (a wrapped stream of the primary context qualifies). It allocates nothing.
func (e *Event) Record(s *Stream) error {
	if err := e.live(); err != nil {
		return err
	}
	if err := s.live(); err != nil {
		return err
	}
	if s.ctx.handle != e.ctx.handle {
		return fmt.Errorf("record event: the stream belongs to CUDA context %#x (device %d), the event to %#x (device %d): create the event in the stream's context (Stream.Context): %w",
			s.ctx.handle, s.ctx.dev, e.ctx.handle, e.ctx.dev, ErrInvalidValue)
	}
	return e.ctx.hot(cuEventRecord, e.handle, s.handle)
}

// Synchronize waits for the work before the recorded point (cuEventSynchronize), with no time
// limit: prefer Wait.
func (e *Event) Synchronize() error {
	if err := e.live(); err != nil {
		return err
	}
	return e.ctx.call(cuEventSynchronize, e.handle)
}

// Query reports whether the work before the recorded point is done (cuEventQuery), without
// blocking; an event never recorded is done. A fault of that work, or a lost context, is an
// error (matching ErrContextLost). It allocates nothing.
func (e *Event) Query() (done bool, err error) {
	if err := e.live(); err != nil {
		return false, err
	}
	return e.ctx.query(cuEventQuery, e.handle)
}

// Wait waits until the event completes or ctx ends, by polling Query. When ctx's deadline
// passes first, the error matches both ErrTimeout and context.DeadlineExceeded.
func (e *Event) Wait(ctx context.Context) error {
	return poll(ctx, "event", e.Query)
}

// Elapsed returns the time between two completed timing events (cuEventElapsedTime, which
// resolves about half a microsecond).
func Elapsed(start, end *Event) (time.Duration, error) {
	if err := start.live(); err != nil {
		return 0, err
	}
	if err := end.live(); err != nil {
		return 0, err
	}
	var ms float32
	if err := start.ctx.call(cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), start.handle, end.handle); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Close destroys the event (cuEventDestroy_v2). Calling it again does nothing.
func (e *Event) Close() error {
	if e == nil || e.handle == 0 {
		return nil
	}
	h := e.handle
	e.handle = 0
	return e.ctx.call(cuEventDestroy_v2, h)
}
