package bootstrap

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slack is how long past its context's deadline a call may take to give up, on a loaded CI
// machine under the race detector.
const slack = 1500 * time.Millisecond

// The tests below run against both implementations: they share one contract.

func TestExchange(t *testing.T) {
	for _, m := range groupMakers {
		for _, size := range []int{1, 2, 5, 16} {
			t.Run(fmt.Sprintf("%s/%d", m.name, size), func(t *testing.T) {
				boots := m.make(t, size)
				// 70 fds per rank sends a peer 280 through a Unix socket: more than one message holds.
				nfds := 70
				if size > 5 {
					nfds = 3
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				for r, err := range eachRank(size, func(r int) error { return exerciseRank(ctx, boots[r], nfds) }) {
					require.NoError(t, err, "rank %d", r)
				}
				for r, b := range boots {
					assert.Equal(t, r, b.Rank())
					assert.Equal(t, size, b.Size())
				}
			})
		}
	}
}

func TestBarrierWaitsForEveryRank(t *testing.T) {
	for _, m := range groupMakers {
		t.Run(m.name, func(t *testing.T) {
			boots := m.make(t, 3)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var lateEntered time.Time
			returned := make([]time.Time, 3)
			errs := eachRank(3, func(r int) error {
				if r == 2 {
					time.Sleep(300 * time.Millisecond)
					lateEntered = time.Now()
				}
				err := boots[r].Barrier(ctx)
				returned[r] = time.Now()
				return err
			})
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
				assert.False(t, returned[r].Before(lateEntered), "rank %d left the barrier before rank 2 entered it", r)
			}
		})
	}
}

func TestTimeoutNamesMissingRank(t *testing.T) {
	for _, m := range groupMakers {
		t.Run(m.name, func(t *testing.T) {
			boots := m.make(t, 3)
			const timeout = 500 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			errs := eachRank(2, func(r int) error { return boots[r].Barrier(ctx) }) // rank 2 never calls
			elapsed := time.Since(start)
			for r, err := range errs {
				require.ErrorIs(t, err, context.DeadlineExceeded, "rank %d", r)
			}
			assert.Contains(t, errs[0].Error(), "ranks [2]")
			assert.Less(t, elapsed, timeout+slack)

			// The group is dead: the late rank and the timed-out ones fail at once, not at their deadline.
			for _, r := range []int{2, 0} {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				err := boots[r].Barrier(ctx)
				cancel()
				require.ErrorIs(t, err, context.DeadlineExceeded, "rank %d", r)
				assert.Less(t, time.Since(start), slack, "rank %d", r)
			}
		})
	}
}

// A rank that fails on its own (here: its context was over before the call) takes the
// group down with it: the others fail at once with its reason, not at their own deadlines.
func TestFailureReachesTheOthers(t *testing.T) {
	for _, m := range groupMakers {
		t.Run(m.name, func(t *testing.T) {
			boots := m.make(t, 3)
			expired, cancel := context.WithCancel(context.Background())
			cancel()
			require.ErrorIs(t, boots[1].Barrier(expired), context.Canceled)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			errs := eachRank(3, func(r int) error {
				if r == 1 {
					return nil
				}
				return boots[r].Barrier(ctx)
			})
			assert.Less(t, time.Since(start), slack)
			for _, r := range []int{0, 2} {
				require.ErrorIs(t, errs[r], context.Canceled, "rank %d", r)
				assert.ErrorContains(t, errs[r], "rank 1", "rank %d", r)
			}
		})
	}
}

func TestBadFD(t *testing.T) {
	const fd = -1 // a closed descriptor's number could be reused by the time it is passed
	for _, m := range groupMakers {
		if !m.fds {
			continue
		}
		for _, bad := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/rank%d", m.name, bad), func(t *testing.T) {
				boots := m.make(t, 2)
				good, err := newMemfd("good")
				require.NoError(t, err)
				defer closeFDs([]int{good})
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				start := time.Now()
				errs := eachRank(2, func(r int) error {
					fds := []int{good}
					if r == bad {
						fds = []int{fd}
					}
					_, err := boots[r].AllGatherFDs(ctx, fds)
					return err
				})
				assert.Less(t, time.Since(start), slack)
				for r, err := range errs {
					require.ErrorContains(t, err, fmt.Sprintf("fd %d", fd), "rank %d", r)
					assert.ErrorContains(t, err, "bad file descriptor", "rank %d", r)
				}
			})
		}
	}
}

func TestCanceledContext(t *testing.T) {
	for _, m := range groupMakers {
		t.Run(m.name, func(t *testing.T) {
			boots := m.make(t, 2)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			_, err := boots[1].AllGather(ctx, []byte("x")) // rank 0 never calls
			require.ErrorIs(t, err, context.Canceled)
		})
	}
}

func TestMismatchedCalls(t *testing.T) {
	for _, m := range groupMakers {
		t.Run(m.name, func(t *testing.T) {
			boots := m.make(t, 3)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			errs := eachRank(3, func(r int) error {
				if r == 2 {
					return boots[r].Barrier(ctx)
				}
				_, err := boots[r].AllGather(ctx, []byte("x"))
				return err
			})
			assert.Less(t, time.Since(start), 5*time.Second, "a mismatch must fail at once, not at the deadline")
			for r, err := range errs {
				require.ErrorIs(t, err, ErrMismatch, "rank %d", r)
				assert.Contains(t, err.Error(), "called Barrier", "rank %d", r)
				assert.Contains(t, err.Error(), "called AllGather", "rank %d", r)
			}
		})
	}
}

func TestMismatchedFDCount(t *testing.T) {
	for _, m := range groupMakers {
		if !m.fds {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			boots := m.make(t, 3)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			fd, err := newMemfd("x")
			require.NoError(t, err)
			defer closeFDs([]int{fd})
			errs := eachRank(3, func(r int) error {
				fds := []int{fd}
				if r == 1 {
					fds = []int{fd, fd}
				}
				_, err := boots[r].AllGatherFDs(ctx, fds)
				return err
			})
			for r, err := range errs {
				require.ErrorIs(t, err, ErrMismatch, "rank %d", r)
				assert.Contains(t, err.Error(), "passed 2 fds", "rank %d", r)
			}
		})
	}
}

func TestCloseFailsTheOthers(t *testing.T) {
	for _, m := range groupMakers {
		for _, closer := range []int{0, 2} {
			t.Run(fmt.Sprintf("%s/rank%d", m.name, closer), func(t *testing.T) {
				boots := m.make(t, 3)
				require.NoError(t, boots[closer].Close())
				require.NoError(t, boots[closer].Close(), "second Close")
				require.ErrorIs(t, boots[closer].Barrier(context.Background()), ErrClosed)

				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				start := time.Now()
				errs := eachRank(3, func(r int) error {
					if r == closer {
						return nil
					}
					return boots[r].Barrier(ctx)
				})
				assert.Less(t, time.Since(start), 5*time.Second, "a closed rank must be noticed at once, not at the deadline")
				for r, err := range errs {
					if r == closer {
						continue
					}
					require.ErrorIs(t, err, ErrPeerLost, "rank %d", r)
					assert.Contains(t, err.Error(), fmt.Sprintf("rank %d closed", closer), "rank %d", r)
				}
			})
		}
	}
}

func TestCloseDuringCall(t *testing.T) {
	for _, m := range groupMakers {
		t.Run(m.name, func(t *testing.T) {
			boots := m.make(t, 2)
			time.AfterFunc(100*time.Millisecond, func() { boots[0].Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			err := boots[0].Barrier(ctx) // rank 1 never calls
			require.ErrorIs(t, err, ErrClosed)
			assert.Less(t, time.Since(start), 5*time.Second)
		})
	}
}

func TestResultsAreCopies(t *testing.T) {
	for _, m := range groupMakers {
		t.Run(m.name, func(t *testing.T) {
			boots := m.make(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			mine := [][]byte{[]byte("zero"), []byte("one")}
			results := make([][][]byte, 2)
			for r, err := range eachRank(2, func(r int) (err error) {
				results[r], err = boots[r].AllGather(ctx, mine[r])
				return err
			}) {
				require.NoError(t, err, "rank %d", r)
			}
			mine[0][0] = 'X'
			results[0][1][0] = 'Y'
			assert.Equal(t, "zero", string(results[0][0]), "rank 0's result aliases its input")
			assert.Equal(t, "one", string(results[1][1]), "rank 1's result aliases rank 0's")
		})
	}
}

// TestNoFDLeak checks that descriptors received in failed and successful calls are all
// closed by their owners or by the bootstrap.
func TestNoFDLeak(t *testing.T) {
	countFDs := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(ents)
	}
	run := func(t *testing.T, m groupMaker) {
		boots := m(t, 3)
		defer closeAll(boots)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for r, err := range eachRank(3, func(r int) error { return exerciseRank(ctx, boots[r], 5) }) {
			require.NoError(t, err, "rank %d", r)
		}
		// A failed call after good ones: rank 1 passes an extra fd.
		fd, err := newMemfd("x")
		require.NoError(t, err)
		defer closeFDs([]int{fd})
		for r, err := range eachRank(3, func(r int) error {
			_, err := boots[r].AllGatherFDs(ctx, []int{fd, fd}[:1+r%2])
			return err
		}) {
			require.ErrorIs(t, err, ErrMismatch, "rank %d", r)
		}
	}
	for _, m := range groupMakers {
		if !m.fds {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			run(t, m.make) // the first run opens what the runtime keeps open (netpoller)
			before := countFDs()
			run(t, m.make)
			assert.Equal(t, before, countFDs())
		})
	}
}

func TestNewInProcessSize(t *testing.T) {
	_, err := NewInProcess(0)
	require.ErrorContains(t, err, "need at least 1")
}
