package bootstrap

import (
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewUnixArguments(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		path       string
		rank, size int
		want       string
	}{
		{"rank too big", "/tmp/x.sock", 2, 2, "need 0 <= rank < size"},
		{"negative rank", "/tmp/x.sock", -1, 2, "need 0 <= rank < size"},
		{"no ranks", "/tmp/x.sock", 0, 0, "need 0 <= rank < size"},
		{"empty path", "", 0, 1, "empty socket path"},
		{"path too long", "/tmp/" + strings.Repeat("d", 103), 1, 2, "108 bytes, more than the 107"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewUnix(ctx, tc.path, tc.rank, tc.size)
			require.ErrorContains(t, err, tc.want)
		})
	}
	// The longest allowed path works.
	dir, err := os.MkdirTemp("", "gbs")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	long := filepath.Join(dir, strings.Repeat("p", maxSocketPath-len(dir)-1))
	require.Len(t, long, maxSocketPath)
	b, err := NewUnix(ctx, long, 0, 1)
	require.NoError(t, err)
	require.NoError(t, b.Close())
}

func TestSocketFileRemovedAfterJoin(t *testing.T) {
	path := socketPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	boots := make([]Bootstrap, 2)
	for r, err := range eachRank(2, func(r int) (err error) {
		boots[r], err = NewUnix(ctx, path, r, 2)
		return err
	}) {
		require.NoError(t, err, "rank %d", r)
	}
	defer closeAll(boots)
	assert.NoFileExists(t, path)
	// The connections outlive the file.
	require.NoError(t, eachRank(2, func(r int) error { return boots[r].Barrier(ctx) })[0])
}

func TestStaleSocketReplaced(t *testing.T) {
	path := socketPath(t)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false) // what a crashed rank 0 leaves behind
	require.NoError(t, ln.Close())
	require.FileExists(t, path)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	boots := make([]Bootstrap, 2)
	for r, err := range eachRank(2, func(r int) (err error) {
		boots[r], err = NewUnix(ctx, path, r, 2)
		return err
	}) {
		require.NoError(t, err, "rank %d", r)
	}
	closeAll(boots)
	assert.NoFileExists(t, path)
}

func TestSocketPathNotReplaced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	t.Run("regular file", func(t *testing.T) {
		path := socketPath(t)
		require.NoError(t, os.WriteFile(path, []byte("keep me"), 0o600))
		_, err := NewUnix(ctx, path, 0, 2)
		require.ErrorContains(t, err, "is not a socket")
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, "keep me", string(got))
	})

	t.Run("live listener", func(t *testing.T) {
		path := socketPath(t)
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		require.NoError(t, err)
		defer ln.Close()
		_, err = NewUnix(ctx, path, 0, 2)
		require.ErrorContains(t, err, "listens on "+path)
		fi, err := os.Lstat(path)
		require.NoError(t, err)
		assert.Equal(t, fs.ModeSocket, fi.Mode().Type())
	})
}

func TestRankStartsBeforeRoot(t *testing.T) {
	path := socketPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	boots := make([]Bootstrap, 2)
	errs := eachRank(2, func(r int) (err error) {
		if r == 0 {
			time.Sleep(300 * time.Millisecond)
		}
		boots[r], err = NewUnix(ctx, path, r, 2)
		return err
	})
	defer closeAll(boots)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

func TestJoinTimeout(t *testing.T) {
	path := socketPath(t)
	const timeout = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	errs := eachRank(3, func(r int) error {
		if r == 2 {
			return nil // never joins
		}
		b, err := NewUnix(ctx, path, r, 3)
		if err == nil {
			b.Close()
		}
		return err
	})
	assert.Less(t, time.Since(start), timeout+slack)
	for r, err := range errs[:2] {
		require.ErrorIs(t, err, context.DeadlineExceeded, "rank %d", r)
	}
	assert.Contains(t, errs[0].Error(), "ranks [2] to join")
	assert.NoFileExists(t, path)
}

// TestHandshakeRefused starts rank 0 of a 2-rank group and lets processes join that prove
// the token (here: none, on both sides) but do not fit: the group fails at once, on both sides.
func TestHandshakeRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name       string
		rank, size int // what the misconfigured process claims
		want       string
		joinE      string // what the misconfigured process gets
	}{
		{"wrong size", 1, 3, "rank 1 was told the group has 3 ranks, rank 0 was told 2", "was told the group has 3 ranks"},
		{"unknown rank", 7, 2, "claims rank 7", "claims rank 7"},
		{"rank 0 twice", 0, 2, "claims rank 0", "claims rank 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := socketPath(t)
			start := time.Now()
			errs := eachRank(2, func(r int) error {
				if r == 0 {
					_, err := NewUnixWith(ctx, path, 0, 2, "", Options{})
					return err
				}
				_, err := rawJoin(ctx, path, "", tc.rank, tc.size)
				return err
			})
			assert.Less(t, time.Since(start), 5*time.Second, "a refused handshake must fail at once")
			require.ErrorIs(t, errs[0], ErrHandshake)
			assert.ErrorContains(t, errs[0], tc.want)
			require.ErrorIs(t, errs[1], ErrHandshake)
			assert.ErrorContains(t, errs[1], tc.joinE)
		})
	}
}

func TestDuplicateRank(t *testing.T) {
	path := socketPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	errs := eachRank(3, func(r int) error {
		// Ranks 1 and 2 both claim rank 1 of a 3-rank group.
		_, err := NewUnix(ctx, path, min(r, 1), 3)
		return err
	})
	assert.Less(t, time.Since(start), 5*time.Second)
	for r, err := range errs {
		require.ErrorIs(t, err, ErrHandshake, "process %d", r)
		assert.ErrorContains(t, err, "rank 1 joined twice", "process %d", r)
	}
}

func TestProbeConnectionIgnored(t *testing.T) {
	path := socketPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	boots := make([]Bootstrap, 2)
	errs := eachRank(3, func(r int) (err error) {
		if r == 2 {
			// Connects and leaves without a word, as another rank 0's stale-socket probe does.
			c, err := dialRetry(ctx, path)
			if err != nil {
				return err
			}
			return c.Close()
		}
		if r == 1 {
			time.Sleep(200 * time.Millisecond)
		}
		boots[r], err = NewUnix(ctx, path, r, 2)
		return err
	})
	defer closeAll(boots)
	for r, err := range errs {
		require.NoError(t, err, "process %d", r)
	}
}
