package bootstrap

import (
	"context"
	"fmt"
	"net"
	"time"
)

// NewTCP connects rank of a group of size processes, on one machine or several, over TCP:
// rank 0 listens at addr ("host:port", an address of its own machine) and the other ranks dial
// it, retrying until ctx ends, so the processes may start in any order. It returns once every
// rank has joined, or fails on every rank: a rank that never joins makes the others fail when
// ctx ends with an error wrapping context.DeadlineExceeded (rank 0 names the missing ranks,
// and the connections it refused). On error the returned Bootstrap is nil.
//
// The token is mandatory (at least MinTCPToken bytes, the same on every rank): rank 0 admits
// only connections that prove they know it, and every rank checks that rank 0 proves it too
// (HMAC-SHA256 over fresh nonces; the token itself never travels). Connections that fail are
// dropped without failing the group. What is not protected: the traffic after the handshake is
// neither encrypted nor integrity-checked, so use a network where nobody can tamper with
// connections; and anyone who can reach addr can hold handshake slots (Options) and delay the
// join until ctx ends.
//
// TCP cannot carry file descriptors: AllGatherFDs fails at once on every rank with
// ErrFDPassingUnsupported, leaving the group usable. Frames are bounded as for NewUnix.
func NewTCP(ctx context.Context, rank, size int, addr, token string, opts Options) (Bootstrap, error) {
	if err := checkGroup(rank, size); err != nil {
		return nil, err
	}
	if len(token) < MinTCPToken {
		return nil, fmt.Errorf("bootstrap rank %d: a TCP bootstrap needs a job token of at least %d bytes, the same on every rank (got %d): "+
			"over a network it is what keeps other processes out; set %s, for example to the output of `openssl rand -hex 32`",
			rank, MinTCPToken, len(token), TokenEnv)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("bootstrap rank %d: address %q: %w (want host:port)", rank, addr, err)
	}
	a, err := newAuth(token, false, opts)
	if err != nil {
		return nil, fmt.Errorf("bootstrap rank %d: %w", rank, err)
	}
	return joinStar(ctx, transport{
		where: "at " + addr,
		auth:  a,
		listen: func(ctx context.Context) (net.Listener, func(), error) {
			var lc net.ListenConfig
			ln, err := lc.Listen(ctx, "tcp", addr)
			if err != nil {
				return nil, nil, fmt.Errorf("listen (is the host an address of this machine, and is the port free?): %w", err)
			}
			return ln, func() {}, nil
		},
		dial: func(ctx context.Context) (net.Conn, error) { return dialTCP(ctx, addr) },
	}, rank, size)
}

// dialTCP connects to addr until it works or ctx ends: rank 0 may not listen yet, or its
// host name may not resolve yet.
func dialTCP(ctx context.Context, addr string) (net.Conn, error) {
	start := time.Now()
	wait := 10 * time.Millisecond
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, timeoutError(ctx, time.Since(start), fmt.Sprintf("rank 0 to listen (last attempt: %v)", err))
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}
