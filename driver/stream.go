package driver

import (
	"context"
	"fmt"
	"time"
	"unsafe"
)

// cuStreamCreate flag: the stream does not synchronize with the legacy default stream, so
// unrelated work of other libraries on stream 0 never serializes with ours.
const streamNonBlocking = 0x1

// Stream is a CUDA stream: one made by NewStream (non-blocking, owned: Close destroys it), or
// one made elsewhere and wrapped by WrapStream (not owned: Close only forgets it). Queuing
// work on it is safe from several goroutines; Close must not race with other use.
type Stream struct {
	ctx     *Context
	handle  uintptr // CUstream; 0 once closed
	foreign bool    // made elsewhere: Close does not destroy it

	// captureLocked: BeginCapture locked the calling goroutine to its OS thread, for EndCapture
	// to unlock (see BeginCapture).
	captureLocked bool
}

// NewStream creates a non-blocking stream (CU_STREAM_NON_BLOCKING).
func (c *Context) NewStream() (*Stream, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	var h uintptr
	if err := c.call(cuStreamCreate, uintptr(unsafe.Pointer(&h)), streamNonBlocking); err != nil {
		return nil, fmt.Errorf("create stream on device %d: %w", c.dev, err)
	}
	return &Stream{ctx: c, handle: h}, nil
}

// Default stream handles, which WrapStream refuses.
const (
	cuStreamNull      = 0x0 // the NULL stream: the legacy or per-thread default stream
	cuStreamPerThread = 0x2 // CU_STREAM_PER_THREAD
)

// WrapStream wraps a CUstream created elsewhere: by cgo code, another binding, or a CUDA
// library (a torch.cuda.Stream, a stream of a C++ inference engine). It finds the stream's
// context with cuStreamGetCtx and that context's device with cuCtxGetDevice; the stream's
// Context is a foreign Context made for it (see WrapContext), which works for allocations,
// modules and events like any other. Closing that Context releases only what this package
// made in the context (the stream of Context.Health) and leaves the stream usable.
//
// The Stream is not owned: Close only forgets it and never destroys it, and the stream must
// outlive every use of the wrapper. Default streams (0, CU_STREAM_LEGACY = 1,
// CU_STREAM_PER_THREAD = 2) are refused with an error matching ErrInvalidValue: goccl needs
// an explicit stream, since a default stream is not one queue but a per-thread or
// synchronizing alias, with no context of its own to find.
func WrapStream(handle uintptr) (*Stream, error) {
	switch handle {
	case cuStreamNull, cuStreamLegacy, cuStreamPerThread:
		return nil, fmt.Errorf("wrap stream %#x: a default stream (NULL, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD) cannot be used: pass a stream made with cuStreamCreate (or cudaStreamCreate, torch.cuda.Stream): %w",
			handle, ErrInvalidValue)
	}
	if err := Init(); err != nil {
		return nil, err
	}
	return wrapStream(handle)
}

// wrapStream is WrapStream on a driver already initialized.
func wrapStream(handle uintptr) (*Stream, error) {
	var ctx uintptr
	if err := call(cuStreamGetCtx, handle, uintptr(unsafe.Pointer(&ctx))); err != nil {
		return nil, fmt.Errorf("wrap stream %#x: find its context (is it a live CUstream?): %w", handle, err)
	}
	if ctx == 0 {
		return nil, fmt.Errorf("wrap stream %#x: the driver reports no context for it: %w", handle, ErrInvalidContext)
	}
	c, err := wrapContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("wrap stream %#x: %w", handle, err)
	}
	return &Stream{ctx: c, handle: handle, foreign: true}, nil
}

// Context returns the context of s: the Context that made it, or for a wrapped stream a
// foreign Context of the stream's context.
func (s *Stream) Context() *Context { return s.ctx }

// Handle returns the raw CUstream, for handing to other CUDA libraries (e.g. NCCL). It stays
// owned by s, or by its owner for a wrapped stream: the receiver must not destroy it.
func (s *Stream) Handle() uintptr { return s.handle }

// live returns nil when s can be used.
func (s *Stream) live() error {
	if s == nil || s.handle == 0 {
		return errClosed("stream")
	}
	return nil
}

// Synchronize waits for all work queued on s (cuStreamSynchronize), with no time limit:
// prefer Wait, which takes a deadline.
func (s *Stream) Synchronize() error {
	if err := s.live(); err != nil {
		return err
	}
	return s.ctx.call(cuStreamSynchronize, s.handle)
}

// Query reports whether all work queued on s is done (cuStreamQuery). A kernel fault shows
// up here as an error.
func (s *Stream) Query() (done bool, err error) {
	if err := s.live(); err != nil {
		return false, err
	}
	return s.ctx.query(cuStreamQuery, s.handle)
}

// Wait waits until the work queued on s is done or ctx ends, by polling Query. When ctx's
// deadline passes first, the error matches both ErrTimeout and context.DeadlineExceeded.
func (s *Stream) Wait(ctx context.Context) error {
	return poll(ctx, "stream", s.Query)
}

// WaitEvent makes future work on s wait for e (cuStreamWaitEvent). It allocates nothing.
func (s *Stream) WaitEvent(e *Event) error {
	if err := s.live(); err != nil {
		return err
	}
	if e == nil || e.handle == 0 {
		return errClosed("event")
	}
	return s.ctx.hot(cuStreamWaitEvent, s.handle, e.handle, 0)
}

// Close destroys a stream made by NewStream (cuStreamDestroy_v2); queued work still
// completes. For a wrapped stream it only forgets the handle: the stream stays its owner's.
// Calling it again does nothing.
func (s *Stream) Close() error {
	if s == nil || s.handle == 0 {
		return nil
	}
	h := s.handle
	s.handle = 0
	if s.foreign {
		return nil
	}
	return s.ctx.call(cuStreamDestroy_v2, h)
}

// poll calls query until it reports done, backing off from 1µs to 1ms between calls, until ctx
// ends.
func poll(ctx context.Context, what string, query func() (bool, error)) error {
	delay := time.Microsecond
	for {
		done, err := query()
		if err != nil || done {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			if err := ctx.Err(); err == context.DeadlineExceeded {
				return fmt.Errorf("wait for %s: %w (%w)", what, ErrTimeout, err)
			}
			return fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, time.Millisecond)
	}
}
