package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxSocketPath is the longest path a Unix socket address holds: sun_path is 108 bytes on
// Linux, including the terminating NUL.
const maxSocketPath = 107

// abortTimeout bounds the best-effort send of a failure notice to the other ranks, which may
// have died; the caller's context may already be over when it is sent.
const abortTimeout = time.Second

// NewUnix connects rank of a group of size processes on one node through the Unix socket at
// path. Rank 0 listens there (replacing a stale socket file left by a crashed run, but
// refusing to replace anything else or a socket someone still listens on); the other ranks dial
// it, retrying until ctx ends, so the processes may start in any order. NewUnix returns once
// every rank has joined, or fails on every rank: a rank that never joins makes the others fail
// when ctx ends with an error wrapping context.DeadlineExceeded (rank 0 names the missing
// ranks). Rank 0 removes the socket file when NewUnix returns, so it does not outlive the
// setup; the connections stay open until Close.
//
// The socket file gets the process umask's permissions, so other users cannot join by
// default. All traffic goes through rank 0 (a star), which suits setup-time blobs of a few KiB.
func NewUnix(ctx context.Context, path string, rank, size int) (Bootstrap, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("bootstrap: rank %d of a %d-rank group: need 0 <= rank < size", rank, size)
	}
	if err := checkSocketPath(path); err != nil {
		return nil, fmt.Errorf("bootstrap rank %d: %w", rank, err)
	}
	if rank == 0 {
		return listenRoot(ctx, path, size)
	}
	return dialRoot(ctx, path, rank, size)
}

func checkSocketPath(path string) error {
	switch {
	case path == "":
		return errors.New("empty socket path")
	case len(path) > maxSocketPath:
		return fmt.Errorf("socket path %q is %d bytes, more than the %d a Unix socket address holds: use a shorter path",
			path, len(path), maxSocketPath)
	}
	return nil
}

// unixBootstrap is one rank of a NewUnix group.
type unixBootstrap struct {
	rank, size int
	// conns: on rank 0, conns[r] is rank r's connection (conns[0] is nil); on the others,
	// conns[0] is the connection to rank 0. Fixed after NewUnix.
	conns  []*net.UnixConn
	mu     sync.Mutex // serialises calls
	seq    uint64
	broken error // the failure that made this rank unusable
	closed atomic.Bool
}

func (b *unixBootstrap) Rank() int { return b.rank }
func (b *unixBootstrap) Size() int { return b.size }

func (b *unixBootstrap) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	blobs, _, err := b.call(ctx, kindAllGather, mine, nil)
	return blobs, err
}

func (b *unixBootstrap) AllGatherFDs(ctx context.Context, fds []int) ([][]int, error) {
	_, fdsets, err := b.call(ctx, kindAllGatherFDs, nil, fds)
	return fdsets, err
}

func (b *unixBootstrap) Barrier(ctx context.Context) error {
	_, _, err := b.call(ctx, kindBarrier, nil, nil)
	return err
}

// Close closes this rank's connections; the other ranks see them close and fail with
// ErrPeerLost naming this rank. It may be called while a call is in progress, which then fails.
func (b *unixBootstrap) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, c := range b.conns {
		if c != nil {
			if err := c.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bootstrap rank %d: close: %w", b.rank, err)
	}
	return nil
}

func (b *unixBootstrap) call(ctx context.Context, k kind, blob []byte, fds []int) ([][]byte, [][]int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	switch {
	case b.closed.Load():
		return nil, nil, callError(b.rank, k, b.seq, ErrClosed)
	case b.broken != nil:
		return nil, nil, callError(b.rank, k, b.seq, fmt.Errorf("unusable after an earlier failure: %w", b.broken))
	}
	var (
		blobs  [][]byte
		fdsets [][]int
		err    = checkFDs(fds)
	)
	switch {
	case err != nil:
	case ctx.Err() != nil:
		// Sending nothing: a request sent now would let rank 0 complete the call without us.
		err = fmt.Errorf("context ended before the call: %w", ctx.Err())
	case b.rank == 0:
		blobs, fdsets, err = b.rootCall(ctx, k, blob, fds)
	default:
		blobs, fdsets, err = b.peerCall(ctx, k, blob, fds)
	}
	if err != nil {
		b.broken = err
		if b.rank == 0 {
			b.abortAll(err)
		} else {
			b.tellRoot(err)
		}
		return nil, nil, callError(b.rank, k, b.seq, err)
	}
	return blobs, fdsets, nil
}

// tellRoot sends rank 0, best effort, why this rank failed, so that rank 0 and through it the
// other ranks fail at once with the reason rather than wait for their contexts to end.
// Failures that came from rank 0 or its connection are not sent back.
func (b *unixBootstrap) tellRoot(err error) {
	var remote *remoteError
	if errors.As(err, &remote) || errors.Is(err, ErrPeerLost) || errors.Is(err, ErrClosed) {
		return
	}
	c := b.conns[0]
	_ = c.SetWriteDeadline(time.Now().Add(abortTimeout))
	_ = writeFrame(c, frame{kind: kindAbort, payload: encodeAbort(b.rank, err)})
}

// rootCall is a call on rank 0: gather every rank's request, then answer each.
func (b *unixBootstrap) rootCall(ctx context.Context, k kind, blob []byte, fds []int) ([][]byte, [][]int, error) {
	reqs, err := b.gather(ctx, k, len(fds))
	if err != nil {
		return nil, nil, err
	}
	blobs := make([][]byte, b.size)
	fdsets := make([][]int, b.size)
	blobs[0], fdsets[0] = cloneBlob(blob), slices.Clone(fds)
	for r := 1; r < b.size; r++ {
		blobs[r], fdsets[r] = reqs[r].payload, reqs[r].fds
	}
	reply := frame{kind: k, seq: b.seq}
	if k == kindAllGather {
		reply.payload = encodeBlobs(blobs)
	}
	for r := 1; r < b.size; r++ {
		if k == kindAllGatherFDs {
			reply.fds = slices.Concat(slices.Delete(slices.Clone(fdsets), r, r+1)...)
		}
		if err := b.send(ctx, r, reply); err != nil {
			for _, got := range fdsets[1:] {
				closeFDs(got)
			}
			return nil, nil, err
		}
	}
	return blobs, fdsets, nil
}

// gather reads call b.seq of kind k from every other rank at once, so that a rank that died is
// noticed even while another one is slow. It fails with every rank's problem it saw: the
// ranks that failed, or else the ranks that had not called when ctx ended.
func (b *unixBootstrap) gather(ctx context.Context, k kind, nfds int) ([]frame, error) {
	start := time.Now()
	readCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		rank int
		f    frame
		err  error
	}
	results := make(chan result, b.size-1)
	for r := 1; r < b.size; r++ {
		go func() {
			f, err := b.recv(readCtx, r)
			if err == nil {
				err = b.checkRequest(f, k, nfds, r)
			}
			if err != nil {
				closeFDs(f.fds)
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					cancel() // no point waiting for the others
				}
			}
			results <- result{rank: r, f: f, err: err}
		}()
	}
	frames := make([]frame, b.size)
	var failed, missing []int
	var first error // of the lowest failed rank, so the report does not depend on timing
	for range b.size - 1 {
		res := <-results
		switch {
		case res.err == nil:
			frames[res.rank] = res.f
		case errors.Is(res.err, os.ErrDeadlineExceeded):
			missing = append(missing, res.rank)
		default:
			if len(failed) == 0 || res.rank < slices.Min(failed) {
				first = res.err
			}
			failed = append(failed, res.rank)
		}
	}
	var err error
	switch {
	case len(failed) > 0:
		slices.Sort(failed)
		err = first
		if len(failed) > 1 {
			err = fmt.Errorf("%w (ranks %v all failed)", first, failed)
		}
	case len(missing) > 0:
		slices.Sort(missing)
		err = timeoutError(ctx, time.Since(start), fmt.Sprintf("ranks %v to make this call", missing))
	default:
		return frames, nil
	}
	for _, f := range frames {
		closeFDs(f.fds)
	}
	return nil, err
}

func (b *unixBootstrap) checkRequest(f frame, k kind, nfds, r int) error {
	switch {
	case f.kind == kindAbort:
		return decodeAbort(r, f.payload)
	case f.kind != k || f.seq != b.seq:
		return fmt.Errorf("rank %d called %s #%d where rank 0 called %s #%d: %w", r, f.kind, f.seq, k, b.seq, ErrMismatch)
	case len(f.fds) != nfds:
		return fmt.Errorf("rank %d passed %d fds where rank 0 passed %d fds: %w", r, len(f.fds), nfds, ErrMismatch)
	}
	return nil
}

// peerCall is a call on a rank other than 0: send the request to rank 0, wait for the answer.
func (b *unixBootstrap) peerCall(ctx context.Context, k kind, blob []byte, fds []int) ([][]byte, [][]int, error) {
	start := time.Now()
	req := frame{kind: k, seq: b.seq, fds: fds}
	if k == kindAllGather {
		req.payload = blob
	}
	if err := b.send(ctx, 0, req); err != nil {
		if errors.Is(err, ErrPeerLost) {
			// Rank 0 may have failed and closed before this call: its reason may be waiting.
			if f, rerr := b.recv(ctx, 0); rerr == nil && f.kind == kindAbort {
				closeFDs(f.fds)
				return nil, nil, decodeAbort(0, f.payload)
			}
		}
		return nil, nil, err
	}
	f, err := b.recv(ctx, 0)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = timeoutError(ctx, time.Since(start), "rank 0 to answer (it, or a rank it waits for, has not made this call)")
		}
		return nil, nil, err
	}
	fail := func(err error) ([][]byte, [][]int, error) {
		closeFDs(f.fds)
		return nil, nil, err
	}
	switch {
	case f.kind == kindAbort:
		return fail(decodeAbort(0, f.payload))
	case f.kind != k || f.seq != b.seq:
		return fail(fmt.Errorf("rank 0 answered %s #%d to %s #%d: %w", f.kind, f.seq, k, b.seq, ErrMismatch))
	}
	switch k {
	case kindAllGather:
		blobs, err := decodeBlobs(f.payload, b.size)
		return blobs, nil, err
	case kindAllGatherFDs:
		if len(f.fds) != (b.size-1)*len(fds) {
			return fail(fmt.Errorf("rank 0 sent %d fds, want %d from each of %d ranks", len(f.fds), len(fds), b.size-1))
		}
		fdsets := make([][]int, b.size)
		rest := f.fds
		for r := range fdsets {
			if r == b.rank {
				fdsets[r] = slices.Clone(fds)
				continue
			}
			fdsets[r], rest = rest[:len(fds):len(fds)], rest[len(fds):]
		}
		return nil, fdsets, nil
	}
	return nil, nil, nil
}

// send writes f to rank r within ctx.
func (b *unixBootstrap) send(ctx context.Context, r int, f frame) error {
	c := b.conns[r]
	stop := watchCtx(ctx, c)
	defer stop()
	err := connError(writeFrame(c, f), r)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Messages are small and every rank reads its answer at once, so a send only blocks
		// when the receiver is stuck.
		return fmt.Errorf("rank %d did not take its message in time: %w", r, ctxErr(ctx))
	}
	return err
}

// recv reads a frame from rank r within ctx. A deadline error is returned as is (it wraps
// os.ErrDeadlineExceeded) for the caller to say what it was waiting for.
func (b *unixBootstrap) recv(ctx context.Context, r int) (frame, error) {
	c := b.conns[r]
	stop := watchCtx(ctx, c)
	defer stop()
	f, err := readFrame(c)
	return f, connError(err, r)
}

// connError says what an I/O error on rank r's connection means for the group.
func connError(err error, r int) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return err
	case errors.Is(err, net.ErrClosed): // only Close closes a connection in use
		return fmt.Errorf("%w during the call", ErrClosed)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return fmt.Errorf("rank %d closed its connection (did its process exit?) (%v): %w", r, err, ErrPeerLost)
	}
	return fmt.Errorf("connection to rank %d: %w", r, err)
}

// abortAll tells every connected rank, best effort, why rank 0 failed, so that they fail now
// with the reason rather than when their contexts end.
func (b *unixBootstrap) abortAll(cause error) {
	f := frame{kind: kindAbort, payload: encodeAbort(0, cause)}
	for _, c := range b.conns {
		if c == nil {
			continue
		}
		_ = c.SetWriteDeadline(time.Now().Add(abortTimeout))
		_ = writeFrame(c, f) // the rank may be gone; its own error says so
	}
}

// listenRoot is NewUnix for rank 0.
func listenRoot(ctx context.Context, path string, size int) (*unixBootstrap, error) {
	if err := removeStaleSocket(path); err != nil {
		return nil, fmt.Errorf("bootstrap rank 0: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("bootstrap rank 0: listen (does the socket's directory exist and is it writable?): %w", err)
	}
	defer ln.Close() // also removes the socket file: every rank has joined, or the group failed
	b := &unixBootstrap{rank: 0, size: size, conns: make([]*net.UnixConn, size)}
	if err := b.accept(ctx, ln, path); err != nil {
		b.abortAll(err)
		b.Close()
		return nil, fmt.Errorf("bootstrap rank 0: join at %s: %w", path, err)
	}
	welcome := frame{kind: kindWelcome}
	for r := 1; r < size; r++ {
		if err := b.send(ctx, r, welcome); err != nil {
			b.abortAll(err)
			b.Close()
			return nil, fmt.Errorf("bootstrap rank 0: welcome rank %d: %w", r, err)
		}
	}
	return b, nil
}

// removeStaleSocket removes a socket file at path that nobody listens on.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check socket path: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket: refusing to replace it; choose another path", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("another process listens on %s: is another job using the same socket path (or MASTER_ADDR and MASTER_PORT)?", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("probe existing socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

// accept admits size-1 ranks. Hellos are read concurrently so that a connection that stalls
// cannot hold up the others.
func (b *unixBootstrap) accept(ctx context.Context, ln *net.UnixListener, path string) error {
	start := time.Now()
	type arrival struct {
		c   *net.UnixConn
		h   hello
		err error
	}
	arrivals := make(chan arrival)
	done := make(chan struct{})
	defer close(done)
	helloCtx, cancelHellos := context.WithCancel(ctx)
	defer cancelHellos() // wakes hello readers still blocked; they then close their connection
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				select {
				case arrivals <- arrival{err: err}:
				case <-done:
				}
				return
			}
			go func() {
				stop := watchCtx(helloCtx, c)
				h, err := readHello(c)
				stop()
				select {
				case arrivals <- arrival{c: c, h: h, err: err}:
				case <-done:
					c.Close()
				}
			}()
		}
	}()

	for joined := 1; joined < b.size; {
		select {
		case <-ctx.Done():
			var missing []int
			for r := 1; r < b.size; r++ {
				if b.conns[r] == nil {
					missing = append(missing, r)
				}
			}
			return timeoutError(ctx, time.Since(start), fmt.Sprintf("ranks %v to join", missing))
		case a := <-arrivals:
			if a.c == nil {
				return fmt.Errorf("accept: %w", a.err)
			}
			if errors.Is(a.err, io.EOF) {
				a.c.Close() // connected and left without a word: a probe for a stale socket
				continue
			}
			if err := b.admit(a.c, a.h, a.err); err != nil {
				_ = a.c.SetWriteDeadline(time.Now().Add(abortTimeout))
				_ = writeFrame(a.c, frame{kind: kindAbort, payload: encodeAbort(0, err)})
				a.c.Close()
				return err
			}
			joined++
		}
	}
	return nil
}

func readHello(c *net.UnixConn) (hello, error) {
	f, err := readFrame(c)
	if err != nil {
		return hello{}, err
	}
	closeFDs(f.fds)
	if f.kind != kindHello {
		return hello{}, fmt.Errorf("first message is %s, not hello", f.kind)
	}
	return decodeHello(f.payload)
}

// admit checks a hello and records its connection.
func (b *unixBootstrap) admit(c *net.UnixConn, h hello, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("a process connected but sent no valid hello (%v): %w", err, ErrHandshake)
	case h.version != protoVersion:
		return fmt.Errorf("rank %d speaks bootstrap protocol version %d, rank 0 speaks %d (different goccl versions?): %w",
			h.rank, h.version, protoVersion, ErrHandshake)
	case int(h.size) != b.size:
		return fmt.Errorf("rank %d was told the group has %d ranks, rank 0 was told %d: %w", h.rank, h.size, b.size, ErrHandshake)
	case h.rank == 0 || int(h.rank) >= b.size:
		return fmt.Errorf("a process claims rank %d, but the other ranks of a %d-rank group are 1..%d: %w",
			h.rank, b.size, b.size-1, ErrHandshake)
	case b.conns[h.rank] != nil:
		return fmt.Errorf("rank %d joined twice (two processes were given the same rank?): %w", h.rank, ErrHandshake)
	}
	b.conns[h.rank] = c
	return nil
}

// dialRoot is NewUnix for ranks other than 0.
func dialRoot(ctx context.Context, path string, rank, size int) (*unixBootstrap, error) {
	start := time.Now()
	fail := func(err error) (*unixBootstrap, error) {
		return nil, fmt.Errorf("bootstrap rank %d: join at %s: %w", rank, path, err)
	}
	c, err := dialRetry(ctx, path)
	if err != nil {
		return fail(err)
	}
	b := &unixBootstrap{rank: rank, size: size, conns: []*net.UnixConn{c}}
	err = b.send(ctx, 0, frame{kind: kindHello, payload: hello{protoVersion, uint32(rank), uint32(size)}.encode()})
	var f frame
	if err == nil {
		f, err = b.recv(ctx, 0)
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = timeoutError(ctx, time.Since(start), "rank 0 to report that every rank joined")
	case err != nil:
	case f.kind == kindAbort:
		err = decodeAbort(0, f.payload)
	case f.kind != kindWelcome:
		err = fmt.Errorf("rank 0 answered hello with %s: %w", f.kind, ErrHandshake)
	}
	if err != nil {
		closeFDs(f.fds)
		c.Close()
		return fail(err)
	}
	return b, nil
}

// dialRetry connects to path until it works or ctx ends; rank 0 may not listen yet, or a
// stale socket file from a crashed run may still be there.
func dialRetry(ctx context.Context, path string) (*net.UnixConn, error) {
	start := time.Now()
	addr := &net.UnixAddr{Name: path, Net: "unix"}
	wait := 5 * time.Millisecond
	for {
		c, err := net.DialUnix("unix", nil, addr) // never blocks: a full backlog is EAGAIN
		if err == nil {
			return c, nil
		}
		if ctx.Err() == nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) &&
			!errors.Is(err, syscall.EAGAIN) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, timeoutError(ctx, time.Since(start),
				fmt.Sprintf("rank 0 to listen (last attempt: %v)", err))
		case <-time.After(wait):
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}
