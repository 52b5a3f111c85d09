package bootstrap

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A constructor that fails returns a nil interface: a typed nil would pass `b != nil` and
// then panic in Close.
func TestFailedConstructorsReturnNil(t *testing.T) {
	notASocket := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(notASocket, nil, 0o600))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	token := testToken()
	for name, make := range map[string]func() (Bootstrap, error){
		"NewUnix bad rank":           func() (Bootstrap, error) { return NewUnix(short(), socketPath(t), 2, 2) },
		"NewUnix MaxInt":             func() (Bootstrap, error) { return NewUnix(short(), socketPath(t), 0, math.MaxInt) },
		"NewUnix listen fails":       func() (Bootstrap, error) { return NewUnix(short(), notASocket, 0, 2) },
		"NewUnix rank 0 never there": func() (Bootstrap, error) { return NewUnix(short(), socketPath(t), 1, 2) },
		"NewUnix nobody joins":       func() (Bootstrap, error) { return NewUnix(short(), socketPath(t), 0, 2) },
		"NewUnixWith bad options": func() (Bootstrap, error) {
			return NewUnixWith(short(), socketPath(t), 0, 2, "", Options{MaxPending: -1})
		},
		"NewTCP no token":    func() (Bootstrap, error) { return NewTCP(short(), 0, 2, "127.0.0.1:1", "", Options{}) },
		"NewTCP MaxInt":      func() (Bootstrap, error) { return NewTCP(short(), 0, math.MaxInt, "127.0.0.1:1", token, Options{}) },
		"NewTCP bad address": func() (Bootstrap, error) { return NewTCP(short(), 0, 2, "127.0.0.1", token, Options{}) },
		"NewTCP listen fails": func() (Bootstrap, error) {
			return NewTCP(short(), 0, 2, busy.Addr().String(), token, Options{})
		},
		"NewTCP rank 0 never there": func() (Bootstrap, error) {
			return NewTCP(short(), 1, 2, fmt.Sprintf("127.0.0.1:%d", freePort(t)), token, Options{})
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := make()
			require.Error(t, err)
			assert.True(t, b == nil, "got a non-nil %T holding nil", b)
		})
	}
	boots, err := NewInProcess(math.MaxInt)
	require.ErrorContains(t, err, "larger than the 1024")
	assert.Nil(t, boots)
}

// Sizes that would make a slice of MaxInt elements are refused with an error, never a panic.
func TestHugeSizesRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, size := range []int{MaxRanks + 1, math.MaxInt32, math.MaxInt} {
		_, err := NewUnix(ctx, socketPath(t), 0, size)
		require.ErrorContains(t, err, fmt.Sprintf("a group of %d ranks is larger than the 1024", size))
		_, err = NewTCP(ctx, 0, size, "127.0.0.1:1", testToken(), Options{})
		require.ErrorContains(t, err, "larger than the 1024")
		_, err = NewInProcess(size)
		require.ErrorContains(t, err, "larger than the 1024")
	}

	// A hello that claims a group of 2^32-1 ranks (it proved the token: the group fails).
	path := socketPath(t)
	errs := eachRank(2, func(r int) error {
		if r == 0 {
			_, err := NewUnixWith(ctx, path, 0, 2, "", Options{})
			return err
		}
		_, err := rawJoin(ctx, path, "", 1, math.MaxUint32)
		return err
	})
	require.ErrorIs(t, errs[0], ErrHandshake)
	assert.ErrorContains(t, errs[0], "rank 1 was told the group has 4294967295 ranks")

	// Results that announce more blobs or bytes than they hold.
	for _, p := range [][]byte{
		{0xff, 0xff, 0xff, 0xff},
		{2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff},
		{2, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f},
	} {
		_, err := decodeBlobs(p, 2)
		require.ErrorContains(t, err, "malformed AllGather result")
	}

	// A blob over MaxBlob fails the call on every rank, before anything is sent.
	for _, m := range groupMakers {
		t.Run(m.name, func(t *testing.T) {
			boots := m.make(t, 2)
			big := make([]byte, MaxBlob+1)
			errs := eachRank(2, func(r int) error {
				blob := []byte("small")
				if r == 1 {
					blob = big
				}
				_, err := boots[r].AllGather(ctx, blob)
				return err
			})
			for r, err := range errs {
				require.ErrorContains(t, err, "larger than MaxBlob", "rank %d", r)
			}
		})
	}
}

func TestSocketDir(t *testing.T) {
	uid := os.Getuid()
	mode := func(t *testing.T, dir string) os.FileMode {
		fi, err := os.Lstat(dir)
		require.NoError(t, err)
		return fi.Mode()
	}

	t.Run("created private under the temporary directory", func(t *testing.T) {
		tmp := t.TempDir()
		old := syscall.Umask(0o277) // would make a mkdir 0700 come out 0500
		defer syscall.Umask(old)
		dir, err := socketDir("", tmp, uid)
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(tmp, fmt.Sprintf("goccl-%d", uid)), dir)
		assert.Equal(t, os.ModeDir|0o700, mode(t, dir))
		again, err := socketDir("", tmp, uid)
		require.NoError(t, err, "an existing private directory is reused")
		assert.Equal(t, dir, again)
	})

	t.Run("XDG_RUNTIME_DIR when it is private", func(t *testing.T) {
		run := t.TempDir()
		require.NoError(t, os.Chmod(run, 0o700))
		dir, err := socketDir(run, t.TempDir(), uid)
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(run, "goccl"), dir)
		assert.Equal(t, os.ModeDir|0o700, mode(t, dir))
	})

	t.Run("XDG_RUNTIME_DIR not usable", func(t *testing.T) {
		open := t.TempDir()
		require.NoError(t, os.Chmod(open, 0o755))
		for _, run := range []string{open, "relative/run", filepath.Join(open, "missing")} {
			tmp := t.TempDir()
			dir, err := socketDir(run, tmp, uid)
			require.NoError(t, err)
			assert.Equal(t, filepath.Join(tmp, fmt.Sprintf("goccl-%d", uid)), dir, "XDG_RUNTIME_DIR=%s", run)
		}
	})

	t.Run("refused", func(t *testing.T) {
		for name, tc := range map[string]struct {
			plant func(t *testing.T, dir string)
			want  string
		}{
			"open to others": {
				plant: func(t *testing.T, dir string) {
					require.NoError(t, os.Mkdir(dir, 0o700))
					require.NoError(t, os.Chmod(dir, 0o755))
				},
				want: "has mode 0755, want 0700",
			},
			"symbolic link": {
				plant: func(t *testing.T, dir string) {
					target := t.TempDir()
					require.NoError(t, os.Chmod(target, 0o700))
					require.NoError(t, os.Symlink(target, dir))
				},
				want: "is a symbolic link",
			},
			"not a directory": {
				plant: func(t *testing.T, dir string) { require.NoError(t, os.WriteFile(dir, nil, 0o600)) },
				want:  "is not a directory",
			},
			"another user's": {
				plant: func(t *testing.T, dir string) {
					if os.Getuid() != 0 {
						t.Skip("needs root to give a directory to another user")
					}
					require.NoError(t, os.Mkdir(dir, 0o700))
					require.NoError(t, os.Lchown(dir, 65534, 65534))
				},
				want: "belongs to uid 65534",
			},
		} {
			t.Run(name, func(t *testing.T) {
				tmp := t.TempDir()
				tc.plant(t, filepath.Join(tmp, fmt.Sprintf("goccl-%d", uid)))
				_, err := socketDir("", tmp, uid)
				require.ErrorContains(t, err, tc.want)
			})
		}
	})
}

// The socket file is 0600 whatever the umask, from the moment anyone can connect.
func TestSocketFileMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := socketPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	boots := make([]Bootstrap, 2)
	errs := eachRank(2, func(r int) (err error) {
		if r == 1 {
			// Connectable means listening: check the file then.
			c, err := dialRetry(ctx, path)
			if err != nil {
				return err
			}
			c.Close()
			var st unix.Stat_t
			if err := unix.Lstat(path, &st); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Mode&0o7777 != 0o600 || int(st.Uid) != os.Getuid() {
				return fmt.Errorf("socket file has mode %#o uid %d, want a socket of mode 0600 owned by uid %d", st.Mode, st.Uid, os.Getuid())
			}
		}
		boots[r], err = NewUnix(ctx, path, r, 2)
		return err
	})
	defer closeAll(boots)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// Both ends check with SO_PEERCRED that the other runs as the job's user. Every process of a
// test runs as one user, so the test tells one side that the job runs as another.
func TestPeerUIDChecked(t *testing.T) {
	other := os.Getuid() + 4242
	otherAuth := func() *auth {
		a, err := newAuth("", true, Options{})
		require.NoError(t, err)
		a.uid = other
		return a
	}

	t.Run("rank 0 refuses a process of another user", func(t *testing.T) {
		path := socketPath(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		errs := eachRank(2, func(r int) error {
			if r == 0 {
				_, err := joinStar(ctx, unixTransport(path, otherAuth()), 0, 2)
				return err
			}
			_, err := NewUnixWith(ctx, path, 1, 2, "", Options{})
			return err
		})
		require.ErrorIs(t, errs[0], context.DeadlineExceeded, "the group waits on for its rank 1")
		assert.ErrorContains(t, errs[0], fmt.Sprintf("refused 1 connection(s): pid %d (uid %d): it runs as uid %d, this job as uid %d",
			os.Getpid(), os.Getuid(), os.Getuid(), other))
		require.ErrorIs(t, errs[1], ErrHandshake)
		assert.ErrorContains(t, errs[1], "refused this rank")
	})

	t.Run("a rank refuses a rank 0 of another user", func(t *testing.T) {
		path := socketPath(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		errs := eachRank(2, func(r int) error {
			if r == 0 {
				_, err := NewUnixWith(ctx, path, 0, 2, "", Options{})
				return err
			}
			_, err := joinStar(ctx, unixTransport(path, otherAuth()), 1, 2)
			return err
		})
		require.ErrorIs(t, errs[1], ErrHandshake)
		assert.ErrorContains(t, errs[1], fmt.Sprintf("the process listening at %s (pid %d) runs as uid %d, this rank as uid %d: it is not this job's rank 0",
			path, os.Getpid(), os.Getuid(), other))
		require.Error(t, errs[0])
	})
}

// An impostor with the wrong token, or none, cannot take rank 1's place; the real rank 1
// joins after it and the group forms.
func TestImpostorRefused(t *testing.T) {
	token := testToken()
	path := socketPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		b   Bootstrap
		err error
	}
	root := make(chan result, 1)
	go func() {
		b, err := NewUnixWith(ctx, path, 0, 2, token, Options{})
		root <- result{b, err}
	}()

	// Rank 0's challenge proves a token the impostor does not have: it gives up there.
	_, err := NewUnixWith(ctx, path, 1, 2, "not the job's token", Options{})
	require.ErrorIs(t, err, ErrHandshake)
	assert.ErrorContains(t, err, "did not prove that it knows this rank's job token")

	_, err = NewUnixWith(ctx, path, 1, 2, "", Options{})
	require.ErrorIs(t, err, ErrHandshake)
	assert.ErrorContains(t, err, "it has no job token, and this job has one")

	b1, err := NewUnixWith(ctx, path, 1, 2, token, Options{})
	require.NoError(t, err, "the real rank 1 joins after the impostors")
	defer b1.Close()
	r0 := <-root
	require.NoError(t, r0.err)
	defer r0.b.Close()
	boots := []Bootstrap{r0.b, b1}
	got := make([][][]byte, 2)
	for r, err := range eachRank(2, func(r int) (err error) {
		got[r], err = boots[r].AllGather(ctx, fmt.Appendf(nil, "real rank %d", r))
		return err
	}) {
		require.NoError(t, err, "rank %d", r)
	}
	assert.Equal(t, "real rank 1", string(got[0][1]), "rank 0 gathered the real rank 1's bytes")
}

// A process that listens at the path first cannot pass as rank 0: the real ranks name it.
func TestFakeRootDetected(t *testing.T) {
	token := testToken()
	me := fmt.Sprintf("(pid %d)", os.Getpid())

	t.Run("another token", func(t *testing.T) {
		path := socketPath(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fake := fakeRoot(t, ctx, path, "the impostor's guess")
		_, err := NewUnixWith(ctx, path, 1, 2, token, Options{})
		require.ErrorIs(t, err, ErrHandshake)
		assert.ErrorContains(t, err, "the process listening at "+path+" "+me+" did not prove that it knows this rank's job token: it is not this job's rank 0")
		_, err = NewUnixWith(ctx, path, 0, 2, token, Options{})
		require.ErrorContains(t, err, fmt.Sprintf("another process (pid %d, uid %d) listens on %s", os.Getpid(), os.Getuid(), path))
		select {
		case c, ok := <-fake:
			require.False(t, ok, "the fake rank 0 admitted %v", c)
		default:
		}
	})

	t.Run("no token", func(t *testing.T) {
		path := socketPath(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fakeRoot(t, ctx, path, "")
		_, err := NewUnixWith(ctx, path, 1, 2, token, Options{})
		require.ErrorIs(t, err, ErrHandshake)
		assert.ErrorContains(t, err, "rank 1 has a job token and the process listening at "+path+" "+me+" has none")
	})

	t.Run("silent", func(t *testing.T) {
		path := socketPath(t)
		ln, err := net.Listen("unix", path)
		require.NoError(t, err)
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close() // holds it, says nothing
			}
		}()
		const timeout = 500 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		_, err = NewUnixWith(ctx, path, 1, 2, token, Options{})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "the process listening at "+path+" "+me+" to answer the hello (is it this job's rank 0?)")
		assert.Less(t, time.Since(start), timeout+slack)
	})

	t.Run("rank without a token", func(t *testing.T) {
		path := socketPath(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fakeRoot(t, ctx, path, token)
		_, err := NewUnixWith(ctx, path, 1, 2, "", Options{})
		require.ErrorIs(t, err, ErrHandshake)
		assert.ErrorContains(t, err, `refused this rank: "rank 0: refused this connection: it has no job token, and this job has one: set the same GOCCL_JOB_TOKEN for every rank"`)
	})
}

// garbage is a connection that is not a rank of the job.
type garbage struct {
	name string
	send func(t *testing.T, c *net.UnixConn) // nil: say nothing
	want string                              // in rank 0's notice; "" for none
}

func garbageConns(t *testing.T, token string) []garbage {
	hdr := func(k kind, size, nfds uint32) func(t *testing.T, c *net.UnixConn) {
		return func(t *testing.T, c *net.UnixConn) {
			_, err := c.Write(rawHeader(k, 0, size, nfds))
			require.NoError(t, err)
		}
	}
	hello := func(version uint32, tok string) func(t *testing.T, c *net.UnixConn) {
		return func(t *testing.T, c *net.UnixConn) {
			h := hello{version: version, rank: 1, size: 2}
			if tok != "" {
				h.flags = flagToken
			}
			require.NoError(t, writeFrame(c, frame{kind: kindHello, payload: h.encode()}))
			if version != protoVersion || tok == "" {
				return // refused on its hello
			}
			// Answer the challenge with a proof made with the wrong token.
			f, err := readFrame(c, func(header) error { return nil })
			require.NoError(t, err)
			ch, err := decodeChallenge(f.payload)
			require.NoError(t, err)
			p := prove([]byte(tok), roleRank, h.encode(), ch.nonce)
			require.NoError(t, writeFrame(c, frame{kind: kindProof, payload: p[:]}))
		}
	}
	g := []garbage{
		{"http", func(t *testing.T, c *net.UnixConn) {
			_, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"))
			require.NoError(t, err)
		}, "not a goccl bootstrap peer"},
		{"oversize hello", hdr(kindHello, 1<<30, 0), "hello announces 1073741824 bytes"},
		{"huge fd count", hdr(kindHello, 48, math.MaxUint32), "hello announces 48 bytes and 4294967295 fds"},
		{"not a hello", hdr(kindAllGather, 0, 0), "first message is AllGather, not hello"},
		{"fds attached", func(t *testing.T, c *net.UnixConn) {
			require.NoError(t, writeWithFDs(c, rawHeader(kindHello, 0, 48, 0), memfds(t, 3)))
		}, "hello frame announces 0 fds but carried 3"},
		{"other version", hello(99, ""), "it speaks bootstrap protocol version 99, rank 0 speaks 2"},
	}
	if token != "" {
		g = append(g, garbage{"wrong token", hello(protoVersion, "wrong"), "wrong job token"},
			garbage{"no token", hello(protoVersion, ""), "it has no job token"})
	}
	return g
}

// Connections that are not ranks of the job are dropped, with a notice, and the real ranks
// still join; nothing they sent is allocated beyond the handshake's limit and no descriptor
// they attached stays open.
func TestGarbageDoesNotFailTheJob(t *testing.T) {
	for _, token := range []string{testToken(), ""} {
		name := "token"
		if token == "" {
			name = "no token"
		}
		t.Run(name, func(t *testing.T) {
			exercise := func(t *testing.T) {
				path := socketPath(t)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				type result struct {
					b   Bootstrap
					err error
				}
				root := make(chan result, 1)
				go func() {
					b, err := NewUnixWith(ctx, path, 0, 2, token, Options{HandshakeTimeout: 300 * time.Millisecond})
					root <- result{b, err}
				}()
				// A connection that says nothing holds a handshake slot until its deadline.
				stalled := rawConn(t, ctx, path)
				for _, g := range garbageConns(t, token) {
					c := rawConn(t, ctx, path)
					g.send(t, c)
					assert.Contains(t, refusalOf(t, c), g.want, g.name)
				}
				probe := rawConn(t, ctx, path)
				probe.Close()
				assert.Contains(t, refusalOf(t, stalled), "no hello within 300ms")

				b1, err := NewUnixWith(ctx, path, 1, 2, token, Options{})
				require.NoError(t, err)
				defer b1.Close()
				r0 := <-root
				require.NoError(t, r0.err)
				defer r0.b.Close()
				boots := []Bootstrap{r0.b, b1}
				for r, err := range eachRank(2, func(r int) error { return exerciseRank(ctx, boots[r], 3) }) {
					require.NoError(t, err, "rank %d", r)
				}
			}
			t.Run("warm-up", exercise) // opens what the runtime keeps open
			fds, bytes := settledFDs(t), allocated()
			t.Run("counted", exercise)
			assertNoFDLeak(t, fds)
			assert.Less(t, allocated()-bytes, uint64(64<<20), "a frame's announced size was allocated")
		})
	}
}

// When the group fails, rank 0's error names the connections it refused.
func TestRefusalsNamedOnTimeout(t *testing.T) {
	for _, token := range []string{testToken(), ""} {
		path := socketPath(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		errs := eachRank(2, func(r int) error {
			if r == 0 {
				_, err := NewUnixWith(ctx, path, 0, 2, token, Options{})
				return err
			}
			c := rawConn(t, ctx, path)
			_, err := c.Write([]byte("garbage, not a frame, and longer than a header"))
			return err
		})
		require.NoError(t, errs[1])
		require.ErrorIs(t, errs[0], context.DeadlineExceeded)
		assert.ErrorContains(t, errs[0], "ranks [1] to join; refused 1 connection(s): pid")
		assert.ErrorContains(t, errs[0], "bad frame magic")
		if token == "" {
			assert.ErrorContains(t, errs[0], "no job token is set: any process of this user can join or disrupt this job")
		} else {
			assert.NotContains(t, errs[0].Error(), "no job token")
		}
	}
}

// At most MaxPending handshakes run at once, each within HandshakeTimeout: connections that
// say nothing are closed in turn, and the real rank behind them still joins.
func TestPendingHandshakesBounded(t *testing.T) {
	const timeout = 300 * time.Millisecond
	path := socketPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	token := testToken()
	start := time.Now()
	root := make(chan error, 1)
	go func() {
		b, err := NewUnixWith(ctx, path, 0, 2, token, Options{HandshakeTimeout: timeout, MaxPending: 2})
		if err == nil {
			b.Close()
		}
		root <- err
	}()
	stalled := make([]*net.UnixConn, 4)
	for i := range stalled {
		stalled[i] = rawConn(t, ctx, path)
	}
	closedAt := make([]time.Duration, len(stalled))
	eachRank(len(stalled), func(i int) error {
		refusalOf(t, stalled[i])
		closedAt[i] = time.Since(start)
		return nil
	})
	b1, err := NewUnixWith(ctx, path, 1, 2, token, Options{})
	require.NoError(t, err)
	b1.Close()
	require.NoError(t, <-root)
	t.Logf("stalled connections closed after %v", closedAt)
	late := 0
	for _, d := range closedAt {
		assert.GreaterOrEqual(t, d, timeout-50*time.Millisecond)
		if d >= 2*timeout-50*time.Millisecond {
			late++
		}
	}
	assert.GreaterOrEqual(t, late, 2, "with 2 slots, 2 of the 4 stalled connections wait for a slot before their handshake starts")
}

// Descriptors attached where none are expected, or more than expected, are closed at once and
// the message refused.
func TestUnexpectedFDsClosed(t *testing.T) {
	token := testToken()
	type scenario struct {
		name string
		// root speaks for rank 0 on an admitted connection; call is rank 1's side.
		root func(t *testing.T, c *net.UnixConn)
		call func(t *testing.T, ctx context.Context, b Bootstrap) error
		want string
	}
	welcome := func(t *testing.T, c *net.UnixConn) {
		require.NoError(t, writeFrame(c, frame{kind: kindWelcome}))
	}
	readReq := func(t *testing.T, c *net.UnixConn) frame {
		f, err := readFrame(c, func(header) error { return nil })
		require.NoError(t, err)
		closeFDs(f.fds)
		return f
	}
	allGather := func(_ *testing.T, ctx context.Context, b Bootstrap) error {
		_, err := b.AllGather(ctx, []byte("x"))
		return err
	}
	scenarios := []scenario{
		{
			name: "welcome with unannounced fds",
			root: func(t *testing.T, c *net.UnixConn) {
				require.NoError(t, writeWithFDs(c, rawHeader(kindWelcome, 0, 0, 0), memfds(t, 3)))
			},
			want: "welcome frame announces 0 fds but carried 3",
		},
		{
			name: "welcome with announced fds",
			root: func(t *testing.T, c *net.UnixConn) {
				require.NoError(t, writeFrame(c, frame{kind: kindWelcome, fds: memfds(t, 3)}))
			},
			want: "rank 0 answered the handshake with welcome of 0 bytes and 3 fds, not a welcome",
		},
		{
			name: "welcome with more fds than a message holds",
			root: func(t *testing.T, c *net.UnixConn) {
				require.NoError(t, writeWithFDs(c, rawHeader(kindWelcome, 0, 0, 0), memfds(t, 253)))
			},
			want: "MSG_CTRUNC",
		},
		{
			name: "AllGather result with unannounced fds",
			root: func(t *testing.T, c *net.UnixConn) {
				welcome(t, c)
				req := readReq(t, c)
				p := encodeBlobs([][]byte{[]byte("0"), []byte("x")})
				require.NoError(t, writeWithFDs(c, rawHeader(kindAllGather, req.seq, uint32(len(p)), 0), memfds(t, 5)))
				_, _ = c.Write(p) // refused at its header: rank 1 may have hung up
			},
			call: allGather,
			want: "AllGather frame announces 0 fds but carried 5",
		},
		{
			name: "AllGather result with announced fds",
			root: func(t *testing.T, c *net.UnixConn) {
				welcome(t, c)
				req := readReq(t, c)
				p := encodeBlobs([][]byte{[]byte("0"), []byte("x")})
				_ = writeFrame(c, frame{kind: kindAllGather, seq: req.seq, payload: p, fds: memfds(t, 300)}) // refused at its header
			},
			call: allGather,
			want: "rank 0 sent 300 fds, want 0 from each of 1 ranks",
		},
		{
			name: "Barrier answer with fds",
			root: func(t *testing.T, c *net.UnixConn) {
				welcome(t, c)
				req := readReq(t, c)
				require.NoError(t, writeFrame(c, frame{kind: kindBarrier, seq: req.seq, fds: memfds(t, 2)}))
			},
			call: func(_ *testing.T, ctx context.Context, b Bootstrap) error { return b.Barrier(ctx) },
			want: "rank 0 sent 2 fds, want 0",
		},
		{
			name: "AllGatherFDs answer with more fds than the ranks passed",
			root: func(t *testing.T, c *net.UnixConn) {
				welcome(t, c)
				req := readReq(t, c)
				require.NoError(t, writeFrame(c, frame{kind: kindAllGatherFDs, seq: req.seq, fds: memfds(t, 4)}))
			},
			call: func(t *testing.T, ctx context.Context, b Bootstrap) error {
				fds := memfds(t, 1)
				got, err := b.AllGatherFDs(ctx, fds)
				if err == nil {
					closeFDs(got[0])
				}
				return err
			},
			want: "rank 0 sent 4 fds, want 1 from each of 1 ranks",
		},
		{
			name: "abort with fds",
			root: func(t *testing.T, c *net.UnixConn) {
				_ = writeFrame(c, frame{kind: kindAbort, payload: encodeAbort(0, ErrPeerLost), fds: memfds(t, 2)}) // refused at its header
			},
			want: "abort frame of",
		},
	}
	run := func(t *testing.T, sc scenario) {
		path := socketPath(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conns := fakeRoot(t, ctx, path, token)
		rootDone := make(chan struct{})
		go func() {
			defer close(rootDone)
			c, ok := <-conns
			if !ok {
				return
			}
			defer c.Close()
			sc.root(t, c.(*net.UnixConn))
			_, _ = c.Read(make([]byte, 1)) // until rank 1 hangs up
		}()
		b, err := NewUnixWith(ctx, path, 1, 2, token, Options{})
		if sc.call != nil {
			require.NoError(t, err)
			err = sc.call(t, ctx, b)
			b.Close()
		}
		require.ErrorContains(t, err, sc.want)
		<-rootDone
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Run("warm-up", func(t *testing.T) { run(t, sc) }) // the runtime's own descriptors
			before := settledFDs(t)
			t.Run("counted", func(t *testing.T) { run(t, sc) })
			assertNoFDLeak(t, before)
		})
	}
}

// A peer that announces a huge frame is refused from its header: nothing near its size is
// allocated.
func TestOversizeFramesRefusedWithoutAllocation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	token := testToken()

	t.Run("request to rank 0", func(t *testing.T) {
		path := socketPath(t)
		var b0 Bootstrap
		var b1 *star
		for r, err := range eachRank(2, func(r int) (err error) {
			if r == 0 {
				b0, err = NewUnixWith(ctx, path, 0, 2, token, Options{})
			} else {
				b1, err = rawJoin(ctx, path, token, 1, 2)
			}
			return err
		}) {
			require.NoError(t, err, "rank %d", r)
		}
		defer b0.Close()
		defer b1.Close()
		before := allocated()
		_, err := b1.conns[0].Write(rawHeader(kindAllGather, 1, math.MaxUint32, 0))
		require.NoError(t, err)
		_, err = b0.AllGather(ctx, []byte("x"))
		require.ErrorContains(t, err, "rank 1 sent an AllGather blob of 4294967295 bytes, more than MaxBlob")
		assert.Less(t, allocated()-before, uint64(16<<20))
	})

	t.Run("answer from rank 0", func(t *testing.T) {
		path := socketPath(t)
		conns := fakeRoot(t, ctx, path, token)
		go func() {
			c, ok := <-conns
			if !ok {
				return
			}
			defer c.Close()
			_ = writeFrame(c, frame{kind: kindWelcome})
			f, err := readFrame(c, func(header) error { return nil })
			if err != nil {
				return
			}
			_, _ = c.Write(rawHeader(kindAllGather, f.seq, math.MaxUint32, 0))
			_, _ = c.Read(make([]byte, 1))
		}()
		b, err := NewUnixWith(ctx, path, 1, 2, token, Options{})
		require.NoError(t, err)
		defer b.Close()
		before := allocated()
		_, err = b.AllGather(ctx, []byte("x"))
		require.ErrorContains(t, err, "rank 0 sent an AllGather result of 4294967295 bytes, more than 2 ranks may send")
		assert.Less(t, allocated()-before, uint64(16<<20))
	})

	t.Run("decoder", func(t *testing.T) {
		before := allocated()
		for range 100 {
			_, err := readFrame(strings.NewReader(string(rawHeader(kindHello, 0, 1<<30, 0))), func(h header) error {
				if h.size > maxHandshake {
					return fmt.Errorf("too big")
				}
				return nil
			})
			require.ErrorContains(t, err, "too big")
		}
		assert.Less(t, allocated()-before, uint64(1<<20), "100 refused 1 GiB frames")
	})
}

// TestGatherBudgetBoundsAllocation: MaxGather bounds what rank 0 allocates for one AllGather,
// not only what it sends back. Each request is reserved from the call's budget when its header
// arrives, before its blob is allocated; checking the total once every blob was read let 20
// ranks that each announce MaxBlob (legal one by one) make rank 0 allocate 320 MiB before it
// refused the call. Here the blobs never even come. The refusal names the rank and the limit,
// and reaches every rank, as other refusals do.
func TestGatherBudgetBoundsAllocation(t *testing.T) {
	const size = 21 // 20 × MaxBlob = 320 MiB > MaxGather (256 MiB)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b0, peers := rawGroup(t, ctx, size)
	before := allocated()
	for _, p := range peers[1:] {
		_, err := p.conns[0].Write(rawHeader(kindAllGather, 1, MaxBlob, 0))
		require.NoError(t, err)
	}
	callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
	defer callCancel()
	_, err := b0.AllGather(callCtx, []byte("x"))
	require.Error(t, err)
	assert.Regexp(t, `rank \d+ sent an AllGather blob of 16777216 bytes, which takes the ranks' blobs past MaxGather \(268435456 bytes in all\)`, err.Error())
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "refused at once, not left to time out")
	got := allocated() - before
	assert.Less(t, got, uint64(MaxGather), "rank 0 allocated %d MiB for blobs it refused", got>>20)

	for r, p := range peers[1:] {
		c := p.conns[0]
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		f, err := readFrame(c, onlyAbort)
		require.NoError(t, err, "rank %d got no failure notice", r+1)
		assert.ErrorContains(t, decodeAbort(0, f.payload), "past MaxGather", "rank %d", r+1)
	}
}

// TestGatherTimeoutNamesRanksThatCalled: when a gather times out, rank 0 names the ranks it
// waits for, and tells a rank that never called from one whose request began but did not come
// in full (a slow or stuck sender). Saying that the latter had not made the call sent users
// looking for a missing call that had been made.
func TestGatherTimeoutNamesRanksThatCalled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b0, peers := rawGroup(t, ctx, 4)
	// Rank 1 announces 10 bytes and sends 5, rank 3 announces 10 and sends none; rank 2 does
	// not call.
	_, err := peers[1].conns[0].Write(append(rawHeader(kindAllGather, 1, 10, 0), "01234"...))
	require.NoError(t, err)
	_, err = peers[3].conns[0].Write(rawHeader(kindAllGather, 1, 10, 0))
	require.NoError(t, err)
	callCtx, callCancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer callCancel()
	_, err = b0.AllGather(callCtx, []byte("x"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "waiting for ranks [2] to make this call and ranks [1 3], which made it, to send the rest of their requests")
}
