package collective

import (
	"context"
	"testing"
	"time"

	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNewFailureClosesBootstrap: a New that fails before it has a communicator (here a bad
// option, refused before any driver call) still closes its bootstrap, so that the peer
// learns at once that this rank is gone instead of waiting for its deadline.
func TestNewFailureClosesBootstrap(t *testing.T) {
	boots, err := bootstrap.NewInProcess(2)
	require.NoError(t, err)
	defer boots[1].Close()
	_, err = New(context.Background(), 0, boots[0], Options{MaxBytes: 17})
	require.ErrorIs(t, err, ErrInvalidArgument)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err = boots[1].Barrier(ctx)
	assert.ErrorIs(t, err, bootstrap.ErrPeerLost)
	assert.Less(t, time.Since(start), 5*time.Second, "the peer waited for its deadline")
}

// brokenBootstrap is a Bootstrap of a caller's own whose Rank is outside [0, Size).
type brokenBootstrap struct {
	bootstrap.Bootstrap
	rank int
}

func (b brokenBootstrap) Rank() int { return b.rank }

// TestNewRefusesRankOutsideWorld: New checks the Bootstrap's contract before it indexes every
// rank's facts by rank: a rank outside [0, Size) is an error, not a panic.
func TestNewRefusesRankOutsideWorld(t *testing.T) {
	for _, rank := range []int{-1, 2, 7} {
		boots, err := bootstrap.NewInProcess(2)
		require.NoError(t, err)
		_, err = New(context.Background(), 0, brokenBootstrap{Bootstrap: boots[0], rank: rank}, Options{})
		require.ErrorIs(t, err, ErrInvalidArgument, "rank %d", rank)
		assert.ErrorContains(t, err, "a Bootstrap's Rank is in [0, Size)")
		boots[1].Close()
	}
}
