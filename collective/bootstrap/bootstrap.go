package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Bootstrap connects the ranks of one communicator during setup: it exchanges small byte blobs
// (IPC handles, device facts) and file descriptors (VMM POSIX-FD handles) between them.
//
// Every rank must make the same calls in the same order; ranks that do not (one calls
// AllGather while another calls Barrier) get an error wrapping ErrMismatch.
// Calls on one rank are serialised, so several goroutines cannot corrupt it, but the order of
// their calls across ranks would then be arbitrary: use one goroutine per rank. Close may be
// called from any goroutine; it makes a call in progress on that rank fail.
//
// Every call ends when its context does: it then fails with an error wrapping ctx.Err()
// (context.DeadlineExceeded or context.Canceled) that names the ranks it was waiting for where
// they are known. After any error the Bootstrap is unusable: Close it. The other ranks fail too,
// with the first failure's reason (and its sentinel): in the call they are waiting in or, where
// that call could still complete without the failed rank, in their next one.
type Bootstrap interface {
	// Rank returns this rank, in [0, Size()).
	Rank() int
	// Size returns the number of ranks.
	Size() int
	// AllGather sends mine to every rank and returns every rank's blob: result[r] is rank r's
	// (own included). The result is freshly allocated and never contains nil.
	AllGather(ctx context.Context, mine []byte) ([][]byte, error)
	// AllGatherFDs exchanges open file descriptors; every rank must pass the same number.
	// result[r] holds rank r's descriptors as usable in this process: this rank's own entry is
	// the fds passed in; every other entry holds new descriptors (close-on-exec) that the caller
	// owns and must close. The caller keeps owning the fds it passed in. An implementation that
	// cannot move descriptors returns an error wrapping ErrFDPassingUnsupported.
	AllGatherFDs(ctx context.Context, fds []int) ([][]int, error)
	// Barrier returns once every rank has called it.
	Barrier(ctx context.Context) error
	// Close releases this rank's resources; the other ranks' next calls fail with ErrPeerLost.
	// Calls after Close fail with ErrClosed. Closing twice is a no-op.
	Close() error
}

// Limits of every Bootstrap of this package. They bound what a peer can make a rank allocate
// and keep a corrupt or hostile stream from exhausting memory or descriptors.
const (
	// MaxRanks is the largest group a bootstrap forms. (A communicator runs at most 16 ranks
	// over its own kernels; the bootstrap also serves larger groups, as for NCCL.)
	MaxRanks = 1024
	// MaxBlob is the largest blob one rank may pass to AllGather.
	MaxBlob = 16 << 20
	// MaxGather is the largest sum of all ranks' blobs in one AllGather over sockets: rank 0
	// holds all of them at once and sends them to every rank.
	MaxGather = 256 << 20
	// MaxFDs is the most descriptors one AllGatherFDs may hand a rank: its own count times
	// the number of other ranks.
	MaxFDs = 4096
)

// Options tunes how rank 0 of NewUnixWith and NewTCP admits connections. The zero value
// gives the defaults.
type Options struct {
	// HandshakeTimeout bounds each connection's handshake on rank 0, from its accept to its
	// proof of the token (default DefaultHandshakeTimeout, and never past the context's
	// deadline). A connection that takes longer is dropped; the group goes on waiting for
	// its ranks.
	HandshakeTimeout time.Duration
	// MaxPending bounds the connections whose handshake runs at once (default
	// DefaultMaxPending); further connections wait in the listener's backlog.
	MaxPending int
}

// checkArgs checks one call's own arguments against the limits, before anything is sent.
func checkArgs(size int, blob []byte, fds []int) error {
	switch {
	case len(blob) > MaxBlob:
		return fmt.Errorf("AllGather blob of %d bytes is larger than MaxBlob (%d): exchange less at once", len(blob), MaxBlob)
	case uint64(len(fds))*uint64(size-1) > MaxFDs:
		return fmt.Errorf("AllGatherFDs of %d fds per rank hands each of %d ranks %d, more than MaxFDs (%d)",
			len(fds), size, uint64(len(fds))*uint64(size-1), MaxFDs)
	}
	return checkFDs(fds)
}

var (
	// ErrFDPassingUnsupported is wrapped by AllGatherFDs of a Bootstrap that cannot move file
	// descriptors between its ranks (for example one built on a network key-value store).
	// NewInProcess and NewUnix support it, NewTCP does not. A communicator whose ranks share
	// memory as VMM file descriptors (collective.Options.IPC memory.VMM) needs it: over a
	// bootstrap without it New fails with this error wrapped, and legacy CUDA IPC handles (the
	// default) are what such a bootstrap can carry.
	ErrFDPassingUnsupported = errors.New("file descriptor passing not supported by this bootstrap")
	// ErrMismatch means the ranks made different calls: another kind of call, another number of
	// file descriptors, or another number of calls.
	ErrMismatch = errors.New("ranks made different bootstrap calls")
	// ErrPeerLost means another rank went away: its process exited, it closed its Bootstrap,
	// or it failed.
	ErrPeerLost = errors.New("a rank left the bootstrap")
	// ErrHandshake means joining failed: rank 0 refused a rank that proved the job token but
	// does not fit (a duplicate rank, another group size), or a rank refused the process it
	// reached as rank 0 (another user, a wrong or missing job token, another protocol
	// version, or not a goccl bootstrap at all).
	ErrHandshake = errors.New("bootstrap handshake refused")
	// ErrClosed means the Bootstrap was used after (or during) Close.
	ErrClosed = errors.New("bootstrap closed")
)

// kind names a message, and a call: the kind check catches ranks that make different calls.
type kind uint8

const (
	kindAllGather kind = iota + 1
	kindAllGatherFDs
	kindBarrier
	kindHello
	kindWelcome
	kindAbort
	kindChallenge
	kindProof
)

func (k kind) String() string {
	switch k {
	case kindAllGather:
		return "AllGather"
	case kindAllGatherFDs:
		return "AllGatherFDs"
	case kindBarrier:
		return "Barrier"
	case kindHello:
		return "hello"
	case kindWelcome:
		return "welcome"
	case kindAbort:
		return "abort"
	case kindChallenge:
		return "challenge"
	case kindProof:
		return "proof"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// callError prefixes cause with the rank and the call, numbered from 1 in the order made.
func callError(rank int, k kind, seq uint64, cause error) error {
	return fmt.Errorf("bootstrap rank %d: %s #%d: %w", rank, k, seq, cause)
}

// timeoutError says how long a rank waited and for whom, wrapping ctxErr(ctx).
func timeoutError(ctx context.Context, waited time.Duration, what string) error {
	return fmt.Errorf("gave up after %v waiting for %s: %w", waited.Round(time.Millisecond), what, ctxErr(ctx))
}

// ctxErr is ctx.Err(), or context.DeadlineExceeded when a socket deadline set from ctx's
// deadline fired a moment before ctx itself noticed.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// cloneBlob copies b and never returns nil, so results compare alike whatever the transport.
func cloneBlob(b []byte) []byte {
	return append(make([]byte, 0, len(b)), b...)
}
