package bootstrap

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testToken is a fresh job token.
func testToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freePort is a TCP port on loopback that was free a moment ago.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// settledFDs counts this process's open descriptors once the count has held still for 100 ms
// (at most two seconds): a warm-up's goroutines close theirs a moment after its calls return,
// and a count taken before that would make the next run look as if it closed one too many.
func settledFDs(t *testing.T) int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	got, still := openFDs(t), 0
	for still < 5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n := openFDs(t)
		if n == got {
			still++
		} else {
			got, still = n, 0
		}
	}
	return got
}

// assertNoFDLeak asserts that the process is back to want open descriptors. The goroutines of
// a finished exchange (a fake root's listener, say) close theirs a moment after the calls
// return, so the count is read until it matches, for at most two seconds.
func assertNoFDLeak(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	got := openFDs(t)
	for got != want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		got = openFDs(t)
	}
	assert.Equal(t, want, got, "descriptors leaked")
}

// allocated is how many bytes this process has allocated so far.
func allocated() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// rawJoin joins the group at path as rank of size, whatever those are, with token: the
// handshake and the welcome, without the checks of NewUnix.
func rawJoin(ctx context.Context, path, token string, rank, size int) (*star, error) {
	a, err := newAuth(token, true, Options{})
	if err != nil {
		return nil, err
	}
	return dialRoot(ctx, unixTransport(path, a), rank, size)
}

// fakeRoot listens at path as rank 0 would and admits the first connection that proves
// token; the test then speaks for rank 0 on it.
func fakeRoot(t *testing.T, ctx context.Context, path, token string) <-chan net.Conn {
	ln, done, err := listenUnix(path)
	require.NoError(t, err)
	a, err := newAuth(token, true, Options{})
	require.NoError(t, err)
	got := make(chan net.Conn, 1)
	go func() {
		defer ln.Close()
		defer done()
		for {
			c, err := ln.Accept()
			if err != nil {
				close(got)
				return
			}
			if ar := a.serve(ctx, c); ar.c != nil && ar.err == nil {
				got <- ar.c
				return
			}
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return got
}

// rawConn connects to path without a handshake.
func rawConn(t *testing.T, ctx context.Context, path string) *net.UnixConn {
	c, err := dialRetry(ctx, path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn)
}

// rawHeader is a frame header as an attacker writes it.
func rawHeader(k kind, seq uint64, size, nfds uint32) []byte {
	h := make([]byte, headerLen)
	binary.LittleEndian.PutUint32(h[0:], frameMagic)
	h[4] = byte(k)
	binary.LittleEndian.PutUint64(h[8:], seq)
	binary.LittleEndian.PutUint32(h[16:], size)
	binary.LittleEndian.PutUint32(h[20:], nfds)
	return h
}

// refusalOf reads what rank 0 says to a connection it refuses, up to its close: the text of
// its notice, or "" when it closed without one.
func refusalOf(t *testing.T, c net.Conn) string {
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	f, err := readFrame(c, func(header) error { return nil })
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return ""
	}
	require.NoError(t, err, "rank 0 neither refused nor closed the connection")
	require.Equal(t, kindAbort, f.kind)
	closeFDs(f.fds)
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) { // closed with unread bytes of ours
		require.ErrorIs(t, err, io.EOF, "rank 0 keeps a refused connection open")
	}
	return decodeAbort(0, f.payload).Error()
}

// memfds makes n memfds for the test, closed when it ends.
func memfds(t *testing.T, n int) []int {
	fds := make([]int, n)
	for i := range fds {
		fd, err := newMemfd("attached")
		require.NoError(t, err)
		fds[i] = fd
	}
	t.Cleanup(func() { closeFDs(fds) })
	return fds
}

// rawGroup forms a group of size ranks whose rank 0 is a real one (NewUnixWith) and whose
// other ranks are rawJoin's: the test speaks for them on their connection, peers[r].conns[0]
// (peers[0] is nil). Everything is closed when the test ends.
func rawGroup(t *testing.T, ctx context.Context, size int) (Bootstrap, []*star) {
	t.Helper()
	token := testToken()
	path := socketPath(t)
	var b0 Bootstrap
	peers := make([]*star, size)
	for r, err := range eachRank(size, func(r int) (err error) {
		if r == 0 {
			b0, err = NewUnixWith(ctx, path, 0, size, token, Options{})
		} else {
			peers[r], err = rawJoin(ctx, path, token, r, size)
		}
		return err
	}) {
		require.NoError(t, err, "rank %d", r)
	}
	t.Cleanup(func() {
		b0.Close()
		for _, p := range peers[1:] {
			p.Close()
		}
	})
	return b0, peers
}
