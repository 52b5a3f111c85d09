package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// abortTimeout bounds the best-effort send of a failure notice to the other ranks, which may
// have died; the caller's context may already be over when it is sent.
const abortTimeout = time.Second

// maxRefusalsNamed bounds how many refused connections an error lists.
const maxRefusalsNamed = 4

// star is one rank of a group joined through rank 0 over stream sockets (NewUnix, NewTCP).
// All traffic goes through rank 0, which suits setup-time blobs of a few KiB.
type star struct {
	rank, size int
	fdPassing  bool
	// conns: on rank 0, conns[r] is rank r's connection (conns[0] is nil); on the others,
	// conns[0] is the connection to rank 0. Fixed once joined.
	conns  []net.Conn
	mu     sync.Mutex // serialises calls
	seq    uint64
	broken error // the failure that made this rank unusable
	closed atomic.Bool
}

// transport is what NewUnix and NewTCP differ in.
type transport struct {
	where     string // "at <path>" or "at <host:port>", for errors
	fdPassing bool
	auth      *auth
	// listen opens rank 0's listener; done, called once joining is over, releases what the
	// listener left behind (the socket file).
	listen func(ctx context.Context) (ln net.Listener, done func(), err error)
	dial   func(ctx context.Context) (net.Conn, error)
}

// joinStar connects rank of size through t. It returns a nil interface on error.
func joinStar(ctx context.Context, t transport, rank, size int) (Bootstrap, error) {
	if err := checkGroup(rank, size); err != nil {
		return nil, err
	}
	var b *star
	var err error
	if rank == 0 {
		b, err = listenRoot(ctx, t, size)
	} else {
		b, err = dialRoot(ctx, t, rank, size)
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// checkGroup checks a rank and group size given to a constructor.
func checkGroup(rank, size int) error {
	switch {
	case size < 1 || rank < 0 || rank >= size:
		return fmt.Errorf("bootstrap: rank %d of a %d-rank group: need 0 <= rank < size", rank, size)
	case size > MaxRanks:
		return fmt.Errorf("bootstrap: a group of %d ranks is larger than the %d a bootstrap forms", size, MaxRanks)
	}
	return nil
}

func (b *star) Rank() int { return b.rank }
func (b *star) Size() int { return b.size }

func (b *star) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	blobs, _, err := b.call(ctx, kindAllGather, mine, nil)
	return blobs, err
}

func (b *star) AllGatherFDs(ctx context.Context, fds []int) ([][]int, error) {
	if !b.fdPassing {
		// Every rank of the group gets this at once: no rank is left waiting, and the group
		// stays usable.
		return nil, fmt.Errorf("bootstrap rank %d: AllGatherFDs over TCP: %w", b.rank, ErrFDPassingUnsupported)
	}
	_, fdsets, err := b.call(ctx, kindAllGatherFDs, nil, fds)
	return fdsets, err
}

func (b *star) Barrier(ctx context.Context) error {
	_, _, err := b.call(ctx, kindBarrier, nil, nil)
	return err
}

// Close closes this rank's connections; the other ranks see them close and fail with
// ErrPeerLost naming this rank. It may be called while a call is in progress, which then fails.
func (b *star) Close() error {
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

func (b *star) call(ctx context.Context, k kind, blob []byte, fds []int) ([][]byte, [][]int, error) {
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
		err    = checkArgs(b.size, blob, fds)
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
func (b *star) tellRoot(err error) {
	var remote *remoteError
	if errors.As(err, &remote) || errors.Is(err, ErrPeerLost) || errors.Is(err, ErrClosed) {
		return
	}
	c := b.conns[0]
	_ = c.SetWriteDeadline(time.Now().Add(abortTimeout))
	_ = writeFrame(c, frame{kind: kindAbort, payload: encodeAbort(b.rank, err)})
}

// rootCall is a call on rank 0: gather every rank's request, then answer each.
func (b *star) rootCall(ctx context.Context, k kind, blob []byte, fds []int) ([][]byte, [][]int, error) {
	reqs, err := b.gather(ctx, k, len(fds), len(blob))
	if err != nil {
		return nil, nil, err
	}
	blobs := make([][]byte, b.size)
	fdsets := make([][]int, b.size)
	blobs[0], fdsets[0] = cloneBlob(blob), slices.Clone(fds)
	for r := 1; r < b.size; r++ {
		blobs[r], fdsets[r] = reqs[r].payload, reqs[r].fds
	}
	closeReceived := func() {
		for _, got := range fdsets[1:] {
			closeFDs(got)
		}
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
			closeReceived()
			return nil, nil, err
		}
	}
	return blobs, fdsets, nil
}

// gather reads call b.seq of kind k from every other rank at once, so that a rank that died is
// noticed even while another one is slow. nfds is rank 0's descriptor count and own the
// length of rank 0's blob, which counts against MaxGather with the others'. It fails with every rank's problem
// it saw: the ranks that failed, or else the ranks whose requests had not come (in full) when
// ctx ended.
func (b *star) gather(ctx context.Context, k kind, nfds, own int) ([]frame, error) {
	start := time.Now()
	readCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		rank int
		f    frame
		err  error
	}
	// The readers reserve each blob from budget when its header arrives, before they allocate
	// it, so that the blobs rank 0 holds at once stay within MaxGather whatever the ranks
	// announce.
	budget := new(atomic.Int64)
	budget.Store(MaxGather - int64(own))
	// called[r]: rank r's request header was accepted: it made this call, even if the rest of
	// its request has not come.
	called := make([]atomic.Bool, b.size)
	results := make(chan result, b.size-1)
	for r := 1; r < b.size; r++ {
		go func() {
			f, err := b.recv(readCtx, r, b.requestCheck(k, nfds, r, budget, &called[r]))
			if err == nil && f.kind == kindAbort {
				err = decodeAbort(r, f.payload)
			}
			if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				cancel() // no point waiting for the others
			}
			results <- result{rank: r, f: f, err: err}
		}()
	}
	frames := make([]frame, b.size)
	var failed, missing, partial []int
	var first error // of the lowest failed rank, so the report does not depend on timing
	for range b.size - 1 {
		res := <-results
		switch {
		case res.err == nil:
			frames[res.rank] = res.f
		case errors.Is(res.err, os.ErrDeadlineExceeded) && called[res.rank].Load():
			partial = append(partial, res.rank)
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
	case len(missing) > 0 || len(partial) > 0:
		var what []string
		if len(missing) > 0 {
			slices.Sort(missing)
			what = append(what, fmt.Sprintf("ranks %v to make this call", missing))
		}
		if len(partial) > 0 {
			slices.Sort(partial)
			what = append(what, fmt.Sprintf("ranks %v, which made it, to send the rest of their requests", partial))
		}
		err = timeoutError(ctx, time.Since(start), strings.Join(what, " and "))
	default:
		return frames, nil
	}
	for _, f := range frames {
		closeFDs(f.fds)
	}
	return nil, err
}

// requestCheck accepts rank r's request for call b.seq of kind k with nfds descriptors, or
// its failure notice. It reserves an AllGather blob from budget, what is left of MaxGather for
// this call, and sets called once it accepts a request.
func (b *star) requestCheck(k kind, nfds, r int, budget *atomic.Int64, called *atomic.Bool) frameCheck {
	return func(h header) error {
		switch {
		case h.kind == kindAbort:
			return checkAbort(h)
		case h.kind != k || h.seq != b.seq:
			return fmt.Errorf("rank %d called %s #%d where rank 0 called %s #%d: %w", r, h.kind, h.seq, k, b.seq, ErrMismatch)
		case uint64(h.nfds) != uint64(nfds):
			return fmt.Errorf("rank %d passed %d fds where rank 0 passed %d fds: %w", r, h.nfds, nfds, ErrMismatch)
		case k == kindAllGather && h.size > MaxBlob:
			return fmt.Errorf("rank %d sent an AllGather blob of %d bytes, more than MaxBlob (%d)", r, h.size, MaxBlob)
		case k != kindAllGather && h.size != 0:
			return fmt.Errorf("rank %d sent %d bytes with %s, which carries none (a corrupt stream)", r, h.size, k)
		case !reserve(budget, int64(h.size)):
			return fmt.Errorf("rank %d sent an AllGather blob of %d bytes, which takes the ranks' blobs past MaxGather (%d bytes in all): exchange less at once",
				r, h.size, MaxGather)
		}
		called.Store(true)
		return nil
	}
}

// reserve takes n from budget if that much is left.
func reserve(budget *atomic.Int64, n int64) bool {
	for {
		left := budget.Load()
		if n > left {
			return false
		}
		if budget.CompareAndSwap(left, left-n) {
			return true
		}
	}
}

// peerCall is a call on a rank other than 0: send the request to rank 0, wait for the answer.
func (b *star) peerCall(ctx context.Context, k kind, blob []byte, fds []int) ([][]byte, [][]int, error) {
	start := time.Now()
	req := frame{kind: k, seq: b.seq, fds: fds}
	if k == kindAllGather {
		req.payload = blob
	}
	if err := b.send(ctx, 0, req); err != nil {
		if errors.Is(err, ErrPeerLost) {
			// Rank 0 may have failed and closed before this call: its reason may be waiting.
			if f, rerr := b.recv(ctx, 0, onlyAbort); rerr == nil {
				return nil, nil, decodeAbort(0, f.payload)
			}
		}
		return nil, nil, err
	}
	wantFDs := uint64(b.size-1) * uint64(len(fds))
	f, err := b.recv(ctx, 0, func(h header) error {
		switch {
		case h.kind == kindAbort:
			return checkAbort(h)
		case h.kind != k || h.seq != b.seq:
			return fmt.Errorf("rank 0 answered %s #%d to %s #%d: %w", h.kind, h.seq, k, b.seq, ErrMismatch)
		case uint64(h.nfds) != wantFDs:
			return fmt.Errorf("rank 0 sent %d fds, want %d from each of %d ranks", h.nfds, len(fds), b.size-1)
		case k == kindAllGather && uint64(h.size) > gatherLimit(b.size):
			return fmt.Errorf("rank 0 sent an AllGather result of %d bytes, more than %d ranks may send (a corrupt stream)", h.size, b.size)
		case k != kindAllGather && h.size != 0:
			return fmt.Errorf("rank 0 sent %d bytes with %s, which carries none (a corrupt stream)", h.size, k)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = timeoutError(ctx, time.Since(start), "rank 0 to answer (it, or a rank it waits for, has not made this call or not sent all of it)")
		}
		return nil, nil, err
	}
	switch {
	case f.kind == kindAbort:
		return nil, nil, decodeAbort(0, f.payload)
	case k == kindAllGather:
		blobs, err := decodeBlobs(f.payload, b.size)
		return blobs, nil, err
	case k == kindAllGatherFDs:
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
func (b *star) send(ctx context.Context, r int, f frame) error {
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

// recv reads a frame from rank r within ctx, if check accepts it. A deadline error is
// returned as is (it wraps os.ErrDeadlineExceeded) for the caller to say what it was
// waiting for.
func (b *star) recv(ctx context.Context, r int, check frameCheck) (frame, error) {
	c := b.conns[r]
	stop := watchCtx(ctx, c)
	defer stop()
	f, err := readFrame(c, check)
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
func (b *star) abortAll(cause error) {
	f := frame{kind: kindAbort, payload: encodeAbort(0, cause)}
	for _, c := range b.conns {
		if c == nil {
			continue
		}
		_ = c.SetWriteDeadline(time.Now().Add(abortTimeout))
		_ = writeFrame(c, f) // the rank may be gone; its own error says so
	}
}

// listenRoot is the constructor for rank 0.
func listenRoot(ctx context.Context, t transport, size int) (*star, error) {
	fail := func(err error) (*star, error) {
		return nil, fmt.Errorf("bootstrap rank 0: join %s: %w", t.where, err)
	}
	ln, done, err := t.listen(ctx)
	if err != nil {
		return fail(err)
	}
	b := &star{rank: 0, size: size, fdPassing: t.fdPassing, conns: make([]net.Conn, size)}
	err = b.accept(ctx, ln, t.auth)
	done() // every rank has joined, or the group failed: nobody else may join
	if err != nil {
		b.abortAll(err)
		b.Close()
		return fail(err)
	}
	welcome := frame{kind: kindWelcome}
	for r := 1; r < size; r++ {
		if err := b.send(ctx, r, welcome); err != nil {
			b.abortAll(err)
			b.Close()
			return fail(fmt.Errorf("welcome rank %d: %w", r, err))
		}
	}
	return b, nil
}

// accept admits size-1 ranks through ln and closes ln. At most a.maxPending handshakes run at
// once, each within a.timeout, so that connections that stall cannot hold up the others or
// pile up. A connection refused by its handshake (another user, not our protocol, the wrong
// token) is dropped without failing the group, and named in the error if the group fails;
// a rank that proved the token but does not fit (another group size, a rank taken) fails it.
func (b *star) accept(ctx context.Context, ln net.Listener, a *auth) error {
	start := time.Now()
	arrivals := make(chan arrival)
	done := make(chan struct{})
	handshakeCtx, cancelHandshakes := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		close(done)
		cancelHandshakes() // wakes handshakes still running; they close their connection
		ln.Close()
		wg.Wait() // nothing this call opened stays open behind it
	}()
	slots := make(chan struct{}, a.maxPending)
	wg.Go(func() {
		for {
			select {
			case slots <- struct{}{}:
			case <-done:
				return
			}
			c, err := ln.Accept()
			if err != nil {
				select {
				case arrivals <- arrival{acceptErr: err}:
				case <-done:
				}
				return
			}
			wg.Go(func() {
				ar := a.serve(handshakeCtx, c)
				<-slots
				select {
				case arrivals <- ar:
				case <-done:
					if ar.c != nil {
						ar.c.Close()
					}
				}
			})
		}
	})

	var refused []string
	nrefused := 0
	for joined := 1; joined < b.size; {
		select {
		case <-ctx.Done():
			var missing []int
			for r := 1; r < b.size; r++ {
				if b.conns[r] == nil {
					missing = append(missing, r)
				}
			}
			what := fmt.Sprintf("ranks %v to join", missing)
			if nrefused > 0 {
				what += fmt.Sprintf("; refused %d connection(s): %s", nrefused, strings.Join(refused, "; "))
				if nrefused > len(refused) {
					what += "; ..."
				}
				what += a.noTokenNote()
			}
			return timeoutError(ctx, time.Since(start), what)
		case ar := <-arrivals:
			switch {
			case ar.acceptErr != nil:
				return fmt.Errorf("accept: %w", ar.acceptErr)
			case ar.probe:
				continue
			case ar.err != nil:
				nrefused++
				if len(refused) < maxRefusalsNamed {
					refused = append(refused, ar.err.Error())
				}
				continue
			}
			if err := b.admit(ar.h); err != nil {
				_ = ar.c.SetWriteDeadline(time.Now().Add(abortTimeout))
				_ = writeFrame(ar.c, frame{kind: kindAbort, payload: encodeAbort(0, err)})
				ar.c.Close()
				return err
			}
			b.conns[ar.h.rank] = ar.c
			joined++
		}
	}
	return nil
}

// admit checks the hello of a rank that passed the handshake.
func (b *star) admit(h hello) error {
	switch {
	case uint64(h.size) != uint64(b.size):
		return fmt.Errorf("rank %d was told the group has %d ranks, rank 0 was told %d: %w", h.rank, h.size, b.size, ErrHandshake)
	case h.rank == 0 || uint64(h.rank) >= uint64(b.size):
		return fmt.Errorf("a process claims rank %d, but the other ranks of a %d-rank group are 1..%d: %w",
			h.rank, b.size, b.size-1, ErrHandshake)
	case b.conns[h.rank] != nil:
		return fmt.Errorf("rank %d joined twice (two processes were given the same rank?): %w", h.rank, ErrHandshake)
	}
	return nil
}

// dialRoot is the constructor for ranks other than 0.
func dialRoot(ctx context.Context, t transport, rank, size int) (*star, error) {
	start := time.Now()
	fail := func(err error) (*star, error) {
		return nil, fmt.Errorf("bootstrap rank %d: join %s: %w", rank, t.where, err)
	}
	c, err := t.dial(ctx)
	if err != nil {
		return fail(err)
	}
	b := &star{rank: rank, size: size, fdPassing: t.fdPassing, conns: []net.Conn{c}}
	err = t.auth.join(ctx, c, t.where, rank, size)
	var f frame
	if err == nil {
		f, err = b.recv(ctx, 0, func(h header) error {
			switch {
			case h.kind == kindAbort:
				return checkAbort(h)
			case h.kind != kindWelcome || h.size != 0 || h.nfds != 0:
				return fmt.Errorf("rank 0 answered the handshake with %s of %d bytes and %d fds, not a welcome: %w", h.kind, h.size, h.nfds, ErrHandshake)
			}
			return nil
		})
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = timeoutError(ctx, time.Since(start), "rank 0 to report that every rank joined")
	case err != nil:
	case f.kind == kindAbort:
		err = decodeAbort(0, f.payload)
	}
	if err != nil {
		c.Close()
		return fail(err)
	}
	return b, nil
}
