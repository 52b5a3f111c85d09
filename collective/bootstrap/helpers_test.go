package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// blobFor is rank r's AllGather blob: one empty, one larger than a socket buffer, the rest
// short, so framing is tested at both ends.
func blobFor(r int) []byte {
	switch r {
	case 1:
		return nil
	case 2:
		return bytes.Repeat([]byte{0xa5, byte(r)}, 150<<10)
	}
	return fmt.Appendf(nil, "rank %d", r)
}

// fdContent is what rank r writes into its j-th memfd.
func fdContent(r, j int) string { return fmt.Sprintf("memfd %d of rank %d", j, r) }

func newMemfd(content string) (int, error) {
	fd, err := unix.MemfdCreate("goccl-bootstrap-test", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	if _, err := unix.Write(fd, []byte(content)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("write memfd: %w", err)
	}
	return fd, nil
}

// readFD reads a whole file through fd with pread: received descriptors share the sender's
// file offset, so a plain read would depend on who read first.
func readFD(fd int) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("fstat fd %d: %w", fd, err)
	}
	buf := make([]byte, st.Size)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return "", fmt.Errorf("pread fd %d: %w", fd, err)
	}
	return string(buf[:n]), nil
}

// exerciseRank is one rank's side of a complete, correct exchange: AllGather, AllGatherFDs of
// one memfd, of nfds memfds, and Barrier. It returns the first wrong result it sees.
func exerciseRank(ctx context.Context, b Bootstrap, nfds int) error {
	me, size := b.Rank(), b.Size()
	blobs, err := b.AllGather(ctx, blobFor(me))
	if err != nil {
		return err
	}
	if len(blobs) != size {
		return fmt.Errorf("rank %d: AllGather gave %d blobs for %d ranks", me, len(blobs), size)
	}
	for r, got := range blobs {
		if want := blobFor(r); got == nil || !bytes.Equal(got, want) {
			return fmt.Errorf("rank %d: AllGather: rank %d's blob is %d bytes (nil: %v), want %d bytes", me, r, len(got), got == nil, len(want))
		}
	}
	if !passesFDs(b) {
		// Fails at once on every rank, and the group goes on.
		if _, err := b.AllGatherFDs(ctx, nil); !errors.Is(err, ErrFDPassingUnsupported) {
			return fmt.Errorf("rank %d: AllGatherFDs over TCP: got %v, want ErrFDPassingUnsupported", me, err)
		}
		return b.Barrier(ctx)
	}
	for _, n := range []int{1, nfds} {
		if err := exchangeMemfds(ctx, b, n); err != nil {
			return err
		}
	}
	return b.Barrier(ctx)
}

// passesFDs says whether b can move descriptors (NewTCP's cannot).
func passesFDs(b Bootstrap) bool {
	s, ok := b.(*star)
	return !ok || s.fdPassing
}

// exchangeMemfds passes n memfds per rank and reads every other rank's through what arrived.
func exchangeMemfds(ctx context.Context, b Bootstrap, n int) error {
	me := b.Rank()
	mine := make([]int, n)
	for j := range mine {
		fd, err := newMemfd(fdContent(me, j))
		if err != nil {
			closeFDs(mine[:j])
			return err
		}
		mine[j] = fd
	}
	defer closeFDs(mine)
	sets, err := b.AllGatherFDs(ctx, mine)
	if err != nil {
		return err
	}
	var received []int
	for r, set := range sets {
		if r != me {
			received = append(received, set...)
		}
	}
	defer closeFDs(received)
	if len(sets) != b.Size() {
		return fmt.Errorf("rank %d: AllGatherFDs gave %d sets for %d ranks", me, len(sets), b.Size())
	}
	if !slices.Equal(sets[me], mine) {
		return fmt.Errorf("rank %d: own entry %v, want the fds passed in %v", me, sets[me], mine)
	}
	for r, set := range sets {
		if r == me {
			continue
		}
		if len(set) != n {
			return fmt.Errorf("rank %d: %d fds from rank %d, want %d", me, len(set), r, n)
		}
		for j, fd := range set {
			if slices.Contains(mine, fd) {
				return fmt.Errorf("rank %d: fd %d from rank %d is one of its own, not a new descriptor", me, fd, r)
			}
			got, err := readFD(fd)
			if err != nil {
				return fmt.Errorf("rank %d: fd %d of rank %d: %w", me, j, r, err)
			}
			if want := fdContent(r, j); got != want {
				return fmt.Errorf("rank %d: fd %d of rank %d reads %q, want %q", me, j, r, got, want)
			}
		}
	}
	return nil
}

// eachRank runs f for every rank at once, one goroutine each, and returns their errors.
func eachRank(size int, f func(r int) error) []error {
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

// socketPath returns a fresh, short socket path (t.TempDir can exceed the 107 bytes allowed).
func socketPath(t *testing.T) string {
	dir, err := os.MkdirTemp("", "gbs")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s.sock")
}

// groupMaker makes a connected group of size ranks, closed when the test ends.
type groupMaker func(t *testing.T, size int) []Bootstrap

func inProcessGroup(t *testing.T, size int) []Bootstrap {
	boots, err := NewInProcess(size)
	require.NoError(t, err)
	t.Cleanup(func() { closeAll(boots) })
	return boots
}

// unixGroup joins size ranks over a Unix socket, each rank a goroutine of this process.
func unixGroup(t *testing.T, size int) []Bootstrap {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path := socketPath(t)
	boots := make([]Bootstrap, size)
	errs := eachRank(size, func(r int) (err error) {
		boots[r], err = NewUnix(ctx, path, r, size)
		return err
	})
	t.Cleanup(func() { closeAll(boots) })
	for _, err := range errs {
		require.NoError(t, err)
	}
	return boots
}

// tcpGroup joins size ranks over TCP on loopback, each rank a goroutine of this process.
func tcpGroup(t *testing.T, size int) []Bootstrap {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	token := testToken()
	boots := make([]Bootstrap, size)
	errs := eachRank(size, func(r int) (err error) {
		boots[r], err = NewTCP(ctx, r, size, addr, token, Options{})
		return err
	})
	t.Cleanup(func() { closeAll(boots) })
	for _, err := range errs {
		require.NoError(t, err)
	}
	return boots
}

func closeAll(boots []Bootstrap) {
	for _, b := range boots {
		if b != nil {
			b.Close()
		}
	}
}

var groupMakers = []struct {
	name string
	make groupMaker
	fds  bool // passes file descriptors
}{
	{"InProcess", inProcessGroup, true},
	{"Unix", unixGroup, true},
	{"TCP", tcpGroup, false},
}
