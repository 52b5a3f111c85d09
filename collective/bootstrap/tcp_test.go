package bootstrap

import (
	"context"
	"fmt"
	"math"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTCPTokenRequired(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, token := range []string{"", "short"} {
		b, err := NewTCP(ctx, 0, 2, "127.0.0.1:1", token, Options{})
		require.ErrorContains(t, err, fmt.Sprintf("a TCP bootstrap needs a job token of at least 16 bytes, the same on every rank (got %d)", len(token)))
		assert.ErrorContains(t, err, "set GOCCL_JOB_TOKEN")
		assert.True(t, b == nil)
	}
}

// Over TCP too, connections that are not ranks of the job are dropped with a notice and the
// group forms; a hello announcing a huge frame is refused from its header.
func TestTCPGarbageDropped(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	token := testToken()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		b   Bootstrap
		err error
	}
	root := make(chan result, 1)
	go func() {
		b, err := NewTCP(ctx, 0, 2, addr, token, Options{})
		root <- result{b, err}
	}()
	before := allocated()
	for _, g := range []struct {
		name string
		send []byte
		want string
	}{
		{"http", []byte("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"), "not a goccl bootstrap peer"},
		{"oversize hello", rawHeader(kindHello, 0, math.MaxUint32, 0), "hello announces 4294967295 bytes"},
		{"no token", append(rawHeader(kindHello, 0, helloLen, 0), hello{version: protoVersion, rank: 1, size: 2}.encode()...), "it has no job token"},
	} {
		c, err := dialTCP(ctx, addr)
		require.NoError(t, err)
		_, err = c.Write(g.send)
		require.NoError(t, err)
		assert.Contains(t, refusalOf(t, c), g.want, g.name)
		c.Close()
	}
	// A rank with another token gives up on rank 0's proof; rank 0 drops it.
	_, err := NewTCP(ctx, 1, 2, addr, testToken(), Options{})
	require.ErrorIs(t, err, ErrHandshake)

	b1, err := NewTCP(ctx, 1, 2, addr, token, Options{})
	require.NoError(t, err)
	defer b1.Close()
	r0 := <-root
	require.NoError(t, r0.err)
	defer r0.b.Close()
	assert.Less(t, allocated()-before, uint64(64<<20), "a frame's announced size was allocated")
	boots := []Bootstrap{r0.b, b1}
	for r, err := range eachRank(2, func(r int) error { return exerciseRank(ctx, boots[r], 1) }) {
		require.NoError(t, err, "rank %d", r)
	}
}

// A TCP peer that sends descriptors is impossible; one that announces them is refused.
func TestTCPFramesCarryNoFDs(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	err := writeFrame(a, frame{kind: kindBarrier, fds: []int{0}})
	require.ErrorIs(t, err, ErrFDPassingUnsupported)

	go func() { _, _ = a.Write(rawHeader(kindBarrier, 1, 0, 2)) }()
	_, err = readFrame(b, func(header) error { return nil })
	require.ErrorContains(t, err, "Barrier frame announces 2 fds but carried 0")
}
