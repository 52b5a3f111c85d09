package driver

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// CaptureMode is a CUstreamCaptureMode: which CUDA calls other threads may make while a
// capture runs.
type CaptureMode int

// Capture modes (values of CUstreamCaptureMode).
const (
	// CaptureGlobal forbids unsafe calls (allocations, synchronous copies) on every thread.
	CaptureGlobal CaptureMode = 0
	// CaptureThreadLocal forbids them on the capturing thread only.
	CaptureThreadLocal CaptureMode = 1
	// CaptureRelaxed forbids nothing; the caller takes care.
	CaptureRelaxed CaptureMode = 2
)

// cuStreamIsCapturing status CU_STREAM_CAPTURE_STATUS_NONE.
const captureStatusNone = 0

// BeginCapture starts recording the work queued on s into a graph instead of running it
// (cuStreamBeginCapture_v2); EndCapture returns the graph.
//
// In CaptureGlobal and CaptureThreadLocal modes the driver requires EndCapture on the OS
// thread that began the capture, so BeginCapture locks the calling goroutine to its thread
// until EndCapture, which must then be called from the same goroutine. CaptureRelaxed has no
// such rule and locks nothing. Work may be queued on s from any goroutine meanwhile.
func (s *Stream) BeginCapture(mode CaptureMode) error {
	if err := need(FeatureGraphs); err != nil {
		return err
	}
	if err := s.live(); err != nil {
		return err
	}
	lock := mode != CaptureRelaxed
	if lock {
		runtime.LockOSThread()
	}
	if err := s.ctx.call(cuStreamBeginCapture_v2, s.handle, uintptr(mode)); err != nil {
		if lock {
			runtime.UnlockOSThread()
		}
		return err
	}
	s.captureLocked = lock
	return nil
}

// EndCapture ends the capture of s and returns the recorded graph (cuStreamEndCapture). A
// capture broken by a forbidden call returns an error matching ErrStreamCapture.
func (s *Stream) EndCapture() (*Graph, error) {
	if err := need(FeatureGraphs); err != nil {
		return nil, err
	}
	if err := s.live(); err != nil {
		return nil, err
	}
	var g uintptr
	err := s.ctx.call(cuStreamEndCapture, s.handle, uintptr(unsafe.Pointer(&g)))
	if s.captureLocked {
		s.captureLocked = false
		runtime.UnlockOSThread()
	}
	if err != nil {
		return nil, fmt.Errorf("end stream capture: %w", err)
	}
	return &Graph{ctx: s.ctx, handle: g}, nil
}

// IsCapturing reports whether s is capturing (cuStreamIsCapturing), including a capture that
// a forbidden call invalidated but that has not ended yet.
func (s *Stream) IsCapturing() (bool, error) {
	if err := need(FeatureGraphs); err != nil {
		return false, err
	}
	if err := s.live(); err != nil {
		return false, err
	}
	// The hot path allocates nothing: AllReduce asks on every call. The status lives in a
	// pooled heap word (the heap does not move), kept alive across the call.
	p := captureStatuses.Get().(*int32)
	*p = 0
	err := s.ctx.hot(cuStreamIsCapturing, s.handle, uintptr(unsafe.Pointer(p)))
	status := *p
	runtime.KeepAlive(p)
	captureStatuses.Put(p)
	if err != nil {
		return false, err
	}
	return status != captureStatusNone, nil
}

// captureStatuses holds the words IsCapturing receives the driver's answer in.
var captureStatuses = sync.Pool{New: func() any { return new(int32) }}

// CaptureID returns the id of the capture s takes part in (cuStreamGetCaptureInfo_v2): the
// same for the stream a capture began on and every stream forked from it, which record into
// the same graph; 0 when s is not capturing. It allocates nothing. A driver without the entry
// point (before CUDA 11.3) answers 0 and ErrNotSupported.
func (s *Stream) CaptureID() (uint64, error) {
	if err := need(FeatureGraphs); err != nil {
		return 0, err
	}
	if err := s.live(); err != nil {
		return 0, err
	}
	if cuStreamGetCaptureInfo_v2 == 0 {
		return 0, fmt.Errorf("capture id of a stream: cuStreamGetCaptureInfo_v2: %w", ErrNotSupported)
	}
	w := captureInfos.Get().(*captureInfo)
	*w = captureInfo{}
	// graph, dependencies and their count are optional outputs (NULL)
	err := s.ctx.hot(cuStreamGetCaptureInfo_v2, s.handle, uintptr(unsafe.Pointer(&w.status)), uintptr(unsafe.Pointer(&w.id)), 0, 0, 0)
	status, id := w.status, w.id
	runtime.KeepAlive(w)
	captureInfos.Put(w)
	if err != nil || status == captureStatusNone {
		return 0, err
	}
	return id, nil
}

// captureInfo receives cuStreamGetCaptureInfo_v2's status and id.
type captureInfo struct {
	status int32
	id     uint64
}

// captureInfos holds the words CaptureID receives the driver's answer in.
var captureInfos = sync.Pool{New: func() any { return new(captureInfo) }}

// Graph is a captured graph (CUgraph). Instantiate it to launch it; Close destroys it (an
// instantiated GraphExec stays valid).
type Graph struct {
	ctx    *Context
	handle uintptr // 0 once closed
}

// Instantiate turns g into a launchable graph (cuGraphInstantiateWithFlags).
func (g *Graph) Instantiate() (*GraphExec, error) {
	if g == nil || g.handle == 0 {
		return nil, errClosed("graph")
	}
	var x uintptr
	if err := g.ctx.call(cuGraphInstantiateWithFlags, uintptr(unsafe.Pointer(&x)), g.handle, 0); err != nil {
		return nil, fmt.Errorf("instantiate graph: %w", err)
	}
	return &GraphExec{ctx: g.ctx, handle: x}, nil
}

// Close destroys the graph (cuGraphDestroy). Calling it again does nothing.
func (g *Graph) Close() error {
	if g == nil || g.handle == 0 {
		return nil
	}
	h := g.handle
	g.handle = 0
	return g.ctx.call(cuGraphDestroy, h)
}

// GraphExec is an instantiated graph (CUgraphExec). Close destroys it.
type GraphExec struct {
	ctx    *Context
	handle uintptr // 0 once closed
}

// Launch queues the whole graph on s (cuGraphLaunch). It allocates nothing.
func (x *GraphExec) Launch(s *Stream) error {
	if x == nil || x.handle == 0 {
		return errClosed("graph exec")
	}
	if err := s.live(); err != nil {
		return err
	}
	return x.ctx.hot(cuGraphLaunch, x.handle, s.handle)
}

// Close destroys the executable graph (cuGraphExecDestroy). Calling it again does nothing.
func (x *GraphExec) Close() error {
	if x == nil || x.handle == 0 {
		return nil
	}
	h := x.handle
	x.handle = 0
	return x.ctx.call(cuGraphExecDestroy, h)
}
