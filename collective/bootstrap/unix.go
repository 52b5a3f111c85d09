package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxSocketPath is the longest path a Unix socket address holds: sun_path is 108 bytes on
// Linux, including the terminating NUL.
const maxSocketPath = 107

// unixBacklog is the listen backlog of rank 0's socket (the kernel caps it at somaxconn):
// connections beyond the handshakes in progress wait there.
const unixBacklog = 1024

// NewUnix connects rank of a group of size processes on one node through the Unix socket at
// path, authenticated by the job token in $GOCCL_JOB_TOKEN (TokenEnv) when it is set. It is
// NewUnixWith(ctx, path, rank, size, os.Getenv(TokenEnv), Options{}).
func NewUnix(ctx context.Context, path string, rank, size int) (Bootstrap, error) {
	return NewUnixWith(ctx, path, rank, size, os.Getenv(TokenEnv), Options{})
}

// NewUnixWith connects rank of a group of size processes on one node through the Unix socket
// at path. Rank 0 listens there (replacing a stale socket file left by a crashed run, but
// refusing to replace anything else or a socket someone still listens on); the other ranks dial
// it, retrying until ctx ends, so the processes may start in any order. NewUnixWith returns once
// every rank has joined, or fails on every rank: a rank that never joins makes the others fail
// when ctx ends with an error wrapping context.DeadlineExceeded (rank 0 names the missing
// ranks, and the connections it refused). Rank 0 removes the socket file when joining is over,
// so it does not outlive the setup; the connections stay open until Close. On error the
// returned Bootstrap is nil.
//
// Who may join: the socket file is made 0600, and both ends check with SO_PEERCRED that the
// other runs as this process's user. With a token (every rank must be given the same one),
// rank 0 admits only processes that prove they know it and every rank checks that rank 0
// proves it too, so another job or an impostor of the same user can neither join nor pose as
// rank 0. Connections that fail these checks are dropped without failing the group. With an
// empty token, any process of the same user that reaches path can join or disrupt the job;
// choose path in a private directory (SocketDir) and prefer a token. The traffic is not
// encrypted (it does not leave the machine).
//
// All traffic goes through rank 0 (a star), which suits setup-time blobs of a few KiB.
func NewUnixWith(ctx context.Context, path string, rank, size int, token string, opts Options) (Bootstrap, error) {
	if err := checkGroup(rank, size); err != nil {
		return nil, err
	}
	if err := checkSocketPath(path); err != nil {
		return nil, fmt.Errorf("bootstrap rank %d: %w", rank, err)
	}
	a, err := newAuth(token, true, opts)
	if err != nil {
		return nil, fmt.Errorf("bootstrap rank %d: %w", rank, err)
	}
	return joinStar(ctx, unixTransport(path, a), rank, size)
}

func unixTransport(path string, a *auth) transport {
	return transport{
		where:     "at " + path,
		fdPassing: true,
		auth:      a,
		listen:    func(context.Context) (net.Listener, func(), error) { return listenUnix(path) },
		dial:      func(ctx context.Context) (net.Conn, error) { return dialRetry(ctx, path) },
	}
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

// listenUnix listens at path on a socket file of mode 0600 owned by this user. The mode is
// set between bind and listen, while nobody can connect yet, so the umask never lets another
// user in. done removes the socket file if it is still the one made here.
func listenUnix(path string) (ln net.Listener, done func(), err error) {
	if err := removeStaleSocket(path); err != nil {
		return nil, nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("make a Unix socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), path) // owns fd from here on
	defer f.Close()                    // the listener holds its own duplicate
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		if errors.Is(err, unix.EADDRINUSE) {
			return nil, nil, fmt.Errorf("bind %s: another rank 0 took the path at the same moment: %w", path, err)
		}
		return nil, nil, fmt.Errorf("bind %s (does the socket's directory exist and is it writable?): %w", path, err)
	}
	var made unix.Stat_t
	remove := func() {
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil && st.Dev == made.Dev && st.Ino == made.Ino {
			_ = os.Remove(path)
		}
	}
	defer func() {
		if err != nil {
			remove()
		}
	}()
	if err := unix.Lstat(path, &made); err != nil {
		return nil, nil, fmt.Errorf("check the socket file %s: %w", path, err)
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, path, 0o600, 0); err != nil {
		return nil, nil, fmt.Errorf("make the socket file %s private (chmod 0600): %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, nil, fmt.Errorf("check the socket file %s: %w", path, err)
	}
	if st.Dev != made.Dev || st.Ino != made.Ino || st.Mode&unix.S_IFMT != unix.S_IFSOCK ||
		st.Mode&0o777 != 0o600 || int(st.Uid) != os.Getuid() {
		return nil, nil, fmt.Errorf("the socket file %s changed under us (mode %#o, uid %d): is another process writing in its directory? choose a private one (SocketDir)",
			path, st.Mode, st.Uid)
	}
	if err := unix.Listen(fd, unixBacklog); err != nil {
		return nil, nil, fmt.Errorf("listen at %s: %w", path, err)
	}
	ln, err = net.FileListener(f) // a duplicate of fd
	if err != nil {
		return nil, nil, fmt.Errorf("listen at %s: %w", path, err)
	}
	return ln, remove, nil
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
		who := "another process"
		if cred, err := peerCred(c); err == nil {
			who = fmt.Sprintf("another process (pid %d, uid %d)", cred.Pid, cred.Uid)
		}
		c.Close()
		return fmt.Errorf("%s listens on %s: is another job using the same socket path (or MASTER_ADDR and MASTER_PORT)?", who, path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("probe existing socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

// dialRetry connects to path until it works or ctx ends; rank 0 may not listen yet, or a
// stale socket file from a crashed run may still be there.
func dialRetry(ctx context.Context, path string) (net.Conn, error) {
	start := time.Now()
	addr := &net.UnixAddr{Name: path, Net: "unix"}
	wait := 5 * time.Millisecond
	for {
		c, err := net.DialUnix("unix", nil, addr) // never blocks: a full backlog is EAGAIN
		if err == nil {
			return c, nil
		}
		if errors.Is(err, syscall.EACCES) {
			return nil, fmt.Errorf("%w: the socket belongs to another user, or its directory is closed to this one", err)
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
