package nccl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// DefaultOpTimeout bounds how long a call on a non-blocking communicator waits for work that
// NCCL reports in progress (Config.OpTimeout): connection setup on the first collective
// between hosts takes seconds, not minutes.
const DefaultOpTimeout = 5 * time.Minute

// Config chooses how a communicator is made. The zero value is NCCL's defaults, non-blocking.
type Config struct {
	// Blocking makes NCCL wait inside its calls (ncclConfig_t.blocking = 1): InitRank cannot
	// stop an init that waits for absent peers then. The default, non-blocking (blocking = 0),
	// lets every wait end with a context or OpTimeout, and the communicator be aborted.
	Blocking bool
	// MinCTAs and MaxCTAs bound the thread blocks NCCL's kernels use (0: NCCL's choice, or
	// NCCL_MIN_CTAS and NCCL_MAX_CTAS): fewer leave room for other kernels on the GPU.
	MinCTAs, MaxCTAs int
	// CGAClusterSize is the thread block cluster size of NCCL's kernels on sm_90 and later
	// (0: NCCL's choice, or NCCL_CGA_CLUSTER_SIZE).
	CGAClusterSize int
	// OpTimeout bounds the waits of AllReduce, Group and the registration calls for work that
	// NCCL reports in progress on a non-blocking communicator; past it the communicator is
	// aborted. 0 is DefaultOpTimeout.
	OpTimeout time.Duration
	// Bind makes the rank's CUDA device current on the calling OS thread: NCCL takes the
	// communicator's device from the CUDA runtime's current device of the thread that calls
	// ncclCommInitRank. The init functions call it on that thread, with the goroutine locked
	// to it, right before the call. nil leaves the thread as it is (with no context current,
	// NCCL uses device 0). With package driver, a method of the rank's Context called inside
	// Bind leaves that context current on the thread, e.g. func() error { _, _, err :=
	// ctx.MemInfo(); return err }.
	Bind func() error
}

// Comm is an NCCL communicator (ncclComm_t): one rank of a group that runs collectives
// together. Destroy frees it once the work queued on it is done; Abort stops it at once.
//
// Safe use: one goroutine at a time issues the collectives of a Comm (NCCL orders a
// communicator's operations by call order, and every rank must issue them in the same order).
// Abort, AsyncError, WaitReady and the queries (Count, Device, Rank) may be called from any
// goroutine at any time. Abort in particular is how another goroutine ends a call that waits
// for a peer: NCCL's abort flag stops the call, and the waits of this package stop polling a
// communicator once it is aborted. Calls that start after Destroy or Abort fail with
// ErrClosed; a collective that starts while Abort runs may reach NCCL after the communicator
// is freed, so stop issuing work before aborting, and never run Destroy alongside other calls.
type Comm struct {
	lib    *library
	handle atomic.Uintptr // ncclComm_t; 0 once destroyed or aborted
	// mu is held across the short calls that must not meet a freed communicator (the state
	// poll and the queries), and by Abort and Destroy while they retire the handle. The calls
	// that can wait for peers (collectives, finalize) never hold it, so Abort never waits
	// for them.
	mu        sync.Mutex
	nranks    int
	rank      int
	blocking  bool
	opTimeout time.Duration
}

// GetUniqueID returns a new ncclUniqueId (ncclGetUniqueId), for rank 0 to hand to every rank
// of a new communicator. It starts NCCL's bootstrap root in this process, listening on the
// interface that NCCL_SOCKET_IFNAME chooses; the process must live until every rank joined.
func GetUniqueID() (UniqueID, error) {
	var id UniqueID
	l, err := load()
	if err != nil {
		return id, err
	}
	if err := l.call("ncclGetUniqueId", l.getUniqueID, 0, uintptr(unsafe.Pointer(&id))); err != nil {
		return UniqueID{}, fmt.Errorf("create NCCL unique id: %w", err)
	}
	return id, nil
}

// InitRank makes rank rank of an nranks communicator identified by id, and waits until every
// rank has joined or ctx ends. All ranks call it (from their own process or goroutine) with the
// same id and nranks. cfg may be nil.
//
// The init is non-blocking unless cfg.Blocking: when ctx ends first, the communicator is
// aborted and the error matches ctx.Err() (and ErrTimeout for a deadline). A failed init
// returns an *Error with NCCL's reason; nothing is left to free.
func InitRank(ctx context.Context, id UniqueID, nranks, rank int, cfg *Config) (*Comm, error) {
	c, err := StartInitRank(id, nranks, rank, cfg)
	if err != nil {
		return nil, err
	}
	if err := c.WaitReady(ctx); err != nil {
		_ = c.Abort()                                // after a failed init the communicator is only good for freeing
		return nil, fmt.Errorf("init NCCL: %w", err) // err names the rank
	}
	return c, nil
}

// StartInitRank is InitRank without the wait (ncclCommInitRankConfig): with a non-blocking
// config it returns while NCCL connects the ranks in the background, and the Comm must be
// polled with WaitReady before any other use (ncclInProgress). It is how one goroutine starts
// several ranks at once.
func StartInitRank(id UniqueID, nranks, rank int, cfg *Config) (*Comm, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	l, err := checkInit(nranks, rank)
	if err != nil {
		return nil, err
	}
	c := newConfig()
	c.blocking = 0
	if cfg.Blocking {
		c.blocking = 1
	}
	for _, f := range []struct {
		name string
		v    int
		dst  *int32
	}{{"MinCTAs", cfg.MinCTAs, &c.minCTAs}, {"MaxCTAs", cfg.MaxCTAs, &c.maxCTAs},
		{"CGAClusterSize", cfg.CGAClusterSize, &c.cgaClusterSize}} {
		switch {
		case f.v < 0 || f.v > 1<<16:
			return nil, fmt.Errorf("init NCCL rank %d of %d: Config.%s %d out of range: %w",
				rank, nranks, f.name, f.v, ErrInvalidArgument)
		case f.v > 0:
			*f.dst = int32(f.v)
		}
	}
	comm, err := l.startInit("ncclCommInitRankConfig", id, nranks, rank, &c, cfg.Bind)
	if err != nil {
		return nil, err
	}
	comm.blocking = cfg.Blocking
	if cfg.OpTimeout > 0 {
		comm.opTimeout = cfg.OpTimeout
	}
	return comm, nil
}

// InitRankBlocking makes rank rank of an nranks communicator with NCCL's plain
// ncclCommInitRank: blocking, with NCCL's defaults and environment variables. Nothing can stop
// it while it waits for the other ranks, so it suits a communicator of one rank, or a caller
// with its own watchdog; InitRank is the general way. bind is Config.Bind.
func InitRankBlocking(id UniqueID, nranks, rank int, bind func() error) (*Comm, error) {
	l, err := checkInit(nranks, rank)
	if err != nil {
		return nil, err
	}
	c, err := l.startInit("ncclCommInitRank", id, nranks, rank, nil, bind)
	if err != nil {
		return nil, err
	}
	c.blocking = true
	return c, nil
}

// checkInit loads libnccl and checks what an init can check before calling NCCL.
func checkInit(nranks, rank int) (*library, error) {
	l, err := load()
	if err != nil {
		return nil, err
	}
	if !initRankSupported {
		return nil, errInitRankArch
	}
	if nranks < 1 || nranks > 1<<30 || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("init NCCL rank %d of %d: want 0 <= rank < nranks: %w", rank, nranks, ErrInvalidArgument)
	}
	return l, nil
}

// startInit calls the init function op (with cfg, or without for ncclCommInitRank) on a
// locked OS thread after bind.
func (l *library) startInit(op string, id UniqueID, nranks, rank int, cfg *config, bind func() error) (*Comm, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if bind != nil {
		if err := bind(); err != nil {
			return nil, fmt.Errorf("init NCCL rank %d of %d: make the rank's CUDA device current: %w", rank, nranks, err)
		}
	}
	var h uintptr
	r := l.initRank(&h, nranks, rank, &id, cfg)
	if r != 0 && r != ErrInProgress {
		err := l.newError(op, r, h)
		if h != 0 {
			// NCCL hands back a communicator whose init failed only for freeing.
			raw(l.commAbort, h)
		}
		return nil, fmt.Errorf("init NCCL rank %d of %d: %w", rank, nranks, err)
	}
	if h == 0 {
		return nil, fmt.Errorf("init NCCL rank %d of %d: %s returned %v and no communicator: %w",
			rank, nranks, op, r, ErrInternalError)
	}
	c := &Comm{lib: l, nranks: nranks, rank: rank, opTimeout: DefaultOpTimeout}
	c.handle.Store(h)
	return c, nil
}

// Handle returns the raw ncclComm_t, for handing to other code that calls NCCL. It stays owned
// by c, and is 0 once c is destroyed or aborted.
func (c *Comm) Handle() uintptr {
	if c == nil {
		return 0
	}
	return c.handle.Load()
}

// live returns the handle of c, or an error naming op when c is closed.
func (c *Comm) live(op string) (uintptr, error) {
	if c == nil {
		return 0, fmt.Errorf("%s: nil communicator: %w", op, ErrClosed)
	}
	if h := c.handle.Load(); h != 0 {
		return h, nil
	}
	return 0, fmt.Errorf("%s on rank %d of %d: %w", op, c.rank, c.nranks, ErrClosed)
}

// AllReduce reduces count elements of type dt with op across the ranks
// (ncclAllReduce): every rank's recvbuff receives the reduction of all ranks' sendbuff. The
// buffers are device pointers (CUdeviceptr) of this rank's device, equal for an in-place
// call; stream is a CUstream (0: the legacy default stream). The work is queued on stream:
// AllReduce returns before it runs. It makes no Go allocation.
//
// On a non-blocking communicator, NCCL may answer ncclInProgress while it connects to peers;
// AllReduce then waits for the queuing to finish, up to Config.OpTimeout, and aborts the
// communicator past it.
func (c *Comm) AllReduce(sendbuff, recvbuff uint64, count uint64, dt DataType, op RedOp, stream uintptr) error {
	var h uintptr
	if c != nil {
		h = c.handle.Load()
	}
	if h == 0 {
		_, err := c.live("ncclAllReduce")
		return err
	}
	runtime.LockOSThread()
	r := hot(c.lib.allReduce, uintptr(sendbuff), uintptr(recvbuff), uintptr(count), uintptr(dt), uintptr(op), h, stream)
	if r == 0 {
		runtime.UnlockOSThread()
		return nil
	}
	err := c.settle("ncclAllReduce", r, h)
	runtime.UnlockOSThread()
	return err
}

// settle turns the result r of op into an error, after waiting for ncclInProgress to end on
// a non-blocking communicator. The caller has locked the OS thread that made the call.
func (c *Comm) settle(op string, r Result, h uintptr) error {
	if r == 0 {
		return nil
	}
	if r != ErrInProgress || c.blocking {
		return fmt.Errorf("rank %d of %d: %w", c.rank, c.nranks, c.lib.newError(op, r, h))
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opTimeout)
	defer cancel()
	if err := c.waitReady(ctx); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// Group runs fn between ncclGroupStart and ncclGroupEnd, on one OS thread (NCCL's group state
// belongs to a thread), so that the NCCL calls fn makes are issued together: collectives on
// several communicators of one process, or the inits of several ranks from one goroutine.
// ncclGroupEnd runs even when fn fails. comms are the communicators that fn uses: when
// ncclGroupEnd answers ncclInProgress (non-blocking communicators), Group waits for each of
// them, up to its OpTimeout; without comms, that answer comes back as an error matching
// ErrInProgress, and the caller must WaitReady on each communicator before using it again.
// Group calls may nest.
func Group(fn func() error, comms ...*Comm) error {
	l, err := load()
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := raw(l.groupStart); r != 0 {
		return l.newError("ncclGroupStart", r, 0)
	}
	fnErr := fn()
	r := raw(l.groupEnd)
	switch {
	case r == ErrInProgress && len(comms) > 0:
		var errs []error
		for _, c := range comms {
			if h, err := c.live("ncclGroupEnd"); err != nil {
				errs = append(errs, err)
			} else {
				errs = append(errs, c.settle("ncclGroupEnd", r, h))
			}
		}
		return errors.Join(fnErr, errors.Join(errs...))
	case r != 0:
		return errors.Join(fnErr, l.newError("ncclGroupEnd", r, 0))
	}
	return fnErr
}

// WaitReady waits until the communicator has finished the work NCCL runs in the background
// for a non-blocking communicator (init, connection setup, finalize), by polling
// ncclCommGetAsyncError. It returns nil when NCCL reports success, the communicator's error
// when NCCL reports one (the communicator is then only good for Abort), and, when ctx ends
// first, aborts the communicator and returns an error matching ctx.Err() (and ErrTimeout for
// a deadline).
func (c *Comm) WaitReady(ctx context.Context) error {
	if _, err := c.live("ncclCommGetAsyncError"); err != nil {
		return err
	}
	return c.waitReady(ctx)
}

func (c *Comm) waitReady(ctx context.Context) error {
	const minDelay, maxDelay = 20 * time.Microsecond, 2 * time.Millisecond
	delay := minDelay
	var timer *time.Timer
	for {
		if err := c.asyncError(); err == nil || !errors.Is(err, ErrInProgress) {
			return err
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return c.abortAfterWait(ctx.Err())
		case <-timer.C:
		}
		delay = min(2*delay, maxDelay)
	}
}

// abortAfterWait aborts c after a wait ended with cause, and says so.
func (c *Comm) abortAfterWait(cause error) error {
	abortErr := c.Abort()
	what := fmt.Sprintf("rank %d of %d: NCCL still in progress when the wait ended (a rank missing or stuck?); the communicator was aborted",
		c.rank, c.nranks)
	if abortErr != nil {
		what += fmt.Sprintf(" (abort: %v)", abortErr)
	}
	if errors.Is(cause, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w: %w", what, ErrTimeout, cause)
	}
	return fmt.Errorf("%s: %w", what, cause)
}

// asyncError polls the communicator's state once (ncclCommGetAsyncError) and turns it into
// an error; see AsyncError.
func (c *Comm) asyncError() error {
	if c == nil {
		_, err := c.live("ncclCommGetAsyncError")
		return err
	}
	runtime.LockOSThread() // the state's last error is read on the calling thread
	defer runtime.UnlockOSThread()
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.live("ncclCommGetAsyncError")
	if err != nil {
		return err
	}
	var state int32
	if r := raw(c.lib.commGetAsyncError, h, uintptr(unsafe.Pointer(&state))); r != 0 {
		return fmt.Errorf("rank %d of %d: %w", c.rank, c.nranks, c.lib.newError("ncclCommGetAsyncError", r, h))
	}
	if state == 0 {
		return nil
	}
	return fmt.Errorf("rank %d of %d: %w", c.rank, c.nranks, c.lib.newError("ncclCommGetAsyncError", Result(state), h))
}

// AsyncError reports the communicator's state once (ncclCommGetAsyncError): nil when it is
// healthy and idle, an error matching ErrInProgress while NCCL works in the background, and
// otherwise the asynchronous error (a peer that failed, a network error: ErrRemoteError,
// ErrSystemError, ...) after which the communicator is only good for Abort. It is safe from
// any goroutine, and cheap enough for a watchdog to poll.
func (c *Comm) AsyncError() error { return c.asyncError() }

// Abort stops the communicator at once and frees it (ncclCommAbort): work in flight is
// dropped and the peers see an error. It is safe from any goroutine, also while another one
// waits in a call of c, and calling it again (or after Destroy) does nothing.
func (c *Comm) Abort() error {
	if c == nil {
		return nil
	}
	c.mu.Lock() // a poll or query in progress finishes before the handle is freed
	h := c.handle.Swap(0)
	c.mu.Unlock()
	if h == 0 {
		return nil
	}
	if err := c.lib.call("ncclCommAbort", c.lib.commAbort, h, h); err != nil {
		return fmt.Errorf("abort NCCL rank %d of %d: %w", c.rank, c.nranks, err)
	}
	return nil
}

// Destroy frees the communicator once the work queued on it is done: ncclCommFinalize (where
// libnccl has it), waiting for it up to ctx's end, then ncclCommDestroy. When ctx ends first,
// finalize fails or ncclCommDestroy refuses the communicator (after a failed init or an
// asynchronous error), it is aborted instead, so that nothing leaks. ctx bounds the wait of a
// non-blocking communicator only: a blocking one finalizes inside NCCL, as long as its peers
// take. Calling it again (or after Abort) does nothing. It must not run alongside other calls
// of c but Abort.
func (c *Comm) Destroy(ctx context.Context) error {
	if c == nil {
		return nil
	}
	h := c.handle.Load()
	if h == 0 {
		return nil
	}
	if c.lib.commFinalize != 0 {
		runtime.LockOSThread()
		r := raw(c.lib.commFinalize, h)
		var err error
		switch {
		case r == ErrInProgress && !c.blocking:
			err = c.waitReady(ctx)
		case r != 0:
			err = c.lib.newError("ncclCommFinalize", r, h)
		}
		runtime.UnlockOSThread()
		if errors.Is(err, ErrClosed) {
			return nil // aborted meanwhile, which freed it
		}
		if err != nil {
			return errors.Join(fmt.Errorf("destroy NCCL rank %d of %d: finalize: %w", c.rank, c.nranks, err), c.Abort())
		}
	}
	c.mu.Lock()
	retired := c.handle.CompareAndSwap(h, 0)
	c.mu.Unlock()
	if !retired {
		return nil // aborted meanwhile, which freed it
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := raw(c.lib.commDestroy, h); r != 0 {
		err := c.lib.newError("ncclCommDestroy", r, h)
		// ncclCommDestroy refuses a communicator whose init or background work failed, and
		// keeps it: ncclCommAbort is what frees it then.
		if r := raw(c.lib.commAbort, h); r != 0 {
			return fmt.Errorf("destroy NCCL rank %d of %d: %w; abort: %w", c.rank, c.nranks, err, c.lib.newError("ncclCommAbort", r, h))
		}
		return fmt.Errorf("destroy NCCL rank %d of %d (aborted instead): %w", c.rank, c.nranks, err)
	}
	return nil
}

// Count returns the number of ranks (ncclCommCount).
func (c *Comm) Count() (int, error) {
	return c.queryInt("ncclCommCount", func(l *library) uintptr { return l.commCount })
}

// Device returns the CUDA device ordinal of this rank (ncclCommCuDevice).
func (c *Comm) Device() (int, error) {
	return c.queryInt("ncclCommCuDevice", func(l *library) uintptr { return l.commCuDevice })
}

// Rank returns the rank of c (ncclCommUserRank).
func (c *Comm) Rank() (int, error) {
	return c.queryInt("ncclCommUserRank", func(l *library) uintptr { return l.commUserRank })
}

// queryInt calls one of the queries of the form fn(comm, int*), fn picked from c's library.
func (c *Comm) queryInt(op string, pick func(*library) uintptr) (int, error) {
	if c == nil {
		_, err := c.live(op)
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.live(op)
	if err != nil {
		return 0, err
	}
	var v int32
	if err := c.lib.call(op, pick(c.lib), h, h, uintptr(unsafe.Pointer(&v))); err != nil {
		return 0, fmt.Errorf("rank %d of %d: %w", c.rank, c.nranks, err)
	}
	return int(v), nil
}

// Registration is a buffer registered with a communicator (Comm.Register).
type Registration uintptr

// Register registers size bytes of device memory at buf with the communicator
// (ncclCommRegister), so that collectives on buffers inside it skip NCCL's internal copies
// where the transport allows. Deregister it before freeing the memory or destroying c. It
// needs FeatureRegister (NCCL 2.19).
func (c *Comm) Register(buf, size uint64) (Registration, error) {
	if err := c.need(FeatureRegister); err != nil {
		return 0, err
	}
	h, err := c.live("ncclCommRegister")
	if err != nil {
		return 0, err
	}
	var reg uintptr
	if err := c.callSettled("ncclCommRegister", c.lib.commRegister, h, h, uintptr(buf), uintptr(size), uintptr(unsafe.Pointer(&reg))); err != nil {
		return 0, fmt.Errorf("register %d bytes at %#x: %w", size, buf, err)
	}
	return Registration(reg), nil
}

// Deregister undoes Register (ncclCommDeregister).
func (c *Comm) Deregister(reg Registration) error {
	if err := c.need(FeatureRegister); err != nil {
		return err
	}
	h, err := c.live("ncclCommDeregister")
	if err != nil {
		return err
	}
	return c.callSettled("ncclCommDeregister", c.lib.commDeregister, h, h, uintptr(reg))
}

// Window is a buffer registered as a symmetric memory window (Comm.RegisterWindow).
type Window uintptr

// WindowFlags are the winFlags of ncclCommWindowRegister.
type WindowFlags int32

// Window flags (nccl.h).
const (
	WindowDefault       WindowFlags = 0x00 // NCCL_WIN_DEFAULT
	WindowCollSymmetric WindowFlags = 0x01 // NCCL_WIN_COLL_SYMMETRIC: every rank registers a buffer at the same offset, for symmetric kernels
)

// RegisterWindow registers size bytes of device memory at buf as a window
// (ncclCommWindowRegister). It is collective: every rank calls it, in the same order. Deregister
// it with DeregisterWindow before freeing the memory or destroying c. It needs FeatureWindow
// (NCCL 2.27).
func (c *Comm) RegisterWindow(buf, size uint64, flags WindowFlags) (Window, error) {
	if err := c.need(FeatureWindow); err != nil {
		return 0, err
	}
	h, err := c.live("ncclCommWindowRegister")
	if err != nil {
		return 0, err
	}
	var win uintptr
	if err := c.callSettled("ncclCommWindowRegister", c.lib.commWindowRegister, h, h, uintptr(buf), uintptr(size),
		uintptr(unsafe.Pointer(&win)), uintptr(flags)); err != nil {
		return 0, fmt.Errorf("register a window of %d bytes at %#x: %w", size, buf, err)
	}
	return Window(win), nil
}

// DeregisterWindow undoes RegisterWindow (ncclCommWindowDeregister); collective like it.
func (c *Comm) DeregisterWindow(win Window) error {
	if err := c.need(FeatureWindow); err != nil {
		return err
	}
	h, err := c.live("ncclCommWindowDeregister")
	if err != nil {
		return err
	}
	return c.callSettled("ncclCommWindowDeregister", c.lib.commWindowDeregister, h, h, uintptr(win))
}

// need is library.need for c's library.
func (c *Comm) need(f Feature) error {
	if c == nil || c.lib == nil {
		return fmt.Errorf("%v: nil communicator: %w", f, ErrClosed)
	}
	return c.lib.need(f)
}

// callSettled calls fn on a locked OS thread and settles its result like AllReduce.
//
//go:uintptrescapes
func (c *Comm) callSettled(op string, fn, h uintptr, args ...uintptr) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return c.settle(op, raw(fn, args...), h)
}
