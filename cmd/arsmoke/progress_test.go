package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openPTY returns both ends of a new pseudo-terminal, or skips when the
// machine has none to give.
func openPTY(t *testing.T) (master, terminal *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to test with: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	var n int
	raw, err := master.SyscallConn()
	require.NoError(t, err)
	require.NoError(t, raw.Control(func(fd uintptr) {
		if err = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); err == nil {
			n, err = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
		}
	}))
	require.NoError(t, err)
	terminal, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { terminal.Close() })
	return master, terminal
}

func TestIsTerminal(t *testing.T) {
	_, terminal := openPTY(t)
	assert.True(t, isTerminal(terminal))

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	assert.False(t, isTerminal(w), "a pipe")
	assert.False(t, isTerminal(&bytes.Buffer{}), "not a file")
}

// TestProgressOnTerminal runs a sweep with stderr on a terminal: the
// progress line counts the cases and is erased at the end; with --json it
// stays silent.
func TestProgressOnTerminal(t *testing.T) {
	master, terminal := openPTY(t)
	var seen bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, _ = io.Copy(&seen, master)
	}()

	require.Equal(t, 0, runWithStderr(t, terminal, "-b", "1K", "-e", "2K"))
	require.Equal(t, 0, runWithStderr(t, terminal, "-b", "1K", "-e", "2K", "--json"))

	// Reading the master ends with EIO once no terminal end is open.
	require.NoError(t, terminal.Close())
	select {
	case <-read:
	case <-time.After(5 * time.Second):
		t.Fatal("the terminal's output did not end")
	}
	out := seen.String()
	assert.Contains(t, out, "arsmoke: [1/4] auto, 1024 B out-of-place")
	assert.Contains(t, out, "arsmoke: [4/4] auto, 2048 B in-place")
	assert.True(t, strings.HasSuffix(out, "\r\x1b[K"), "the line is erased at the end: %q", out)
	assert.Equal(t, 1, strings.Count(out, "[1/4]"), "--json prints no progress: %q", out)
}

// runWithStderr runs arsmoke on a fake engine with stderr going to a file.
func runWithStderr(t *testing.T, stderr *os.File, args ...string) int {
	t.Helper()
	useFake(t, 2, func(engineConfig) (engine, error) { return &fakeEngine{}, nil })
	return run(args, io.Discard, stderr)
}

func TestProgressQuietOffTerminal(t *testing.T) {
	var errOut bytes.Buffer
	p := newProgress(&errOut, config{})
	p.start(2)
	p.step("x")
	p.clear()
	assert.Empty(t, errOut.String())
}
