package nccl

import (
	"context"
	"encoding/binary"
	"math"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests run the real code paths against a fake libnccl compiled from
// testdata/fakenccl.c, which records what it receives: they check on a machine without GPU
// what a C callee sees of the Go side's arguments.

// TestFakeLayout checks the test's copy of the fake's slot numbering against the fake's own.
func TestFakeLayout(t *testing.T) {
	p := fakeLibrary(t)
	h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	layout, err := purego.Dlsym(h, "fake_layout")
	require.NoError(t, err)
	for which, want := range []int{rInitTID, rUIDCalls, cVersion} {
		got, _, _ := purego.SyscallN(layout, uintptr(which))
		assert.Equal(t, want, int(int32(got)), "slot %d", which)
	}
}

// pattern returns an id whose bytes are all different, and none zero.
func pattern() UniqueID {
	var id UniqueID
	for i := range id {
		id[i] = byte(0xff - i)
	}
	return id
}

func checkID(t *testing.T, f *fake, id UniqueID) {
	t.Helper()
	for i := range 16 {
		assert.Equal(t, binary.LittleEndian.Uint64(id[8*i:]), f.rec(rID+i), "id word %d", i)
	}
}

// TestABIInitRankByValue checks that the 128-byte id reaches ncclCommInitRank as a by-value
// struct and that the arguments around it stay in place.
func TestABIInitRankByValue(t *testing.T) {
	f := newFake(t)
	f.install(t)
	id := pattern()
	c, err := InitRankBlocking(id, 7, 5, nil)
	require.NoError(t, err)
	checkID(t, f, id)
	assert.Equal(t, uint64(7), f.rec(rNRanks))
	assert.Equal(t, uint64(5), f.rec(rRank))
	assert.Equal(t, uint64(1), f.rec(rCfgNull), "ncclCommInitRank takes no config")
	assert.Equal(t, uint64(1), f.rec(rInitCalls))
	assert.Equal(t, uintptr(0xC0AA0005), c.Handle(), "the communicator the callee wrote")
	assert.Equal(t, pattern(), id, "the caller's id is untouched")
}

// TestABIInitRankConfig checks the id, the ranks and every ncclConfig_t field the callee reads.
func TestABIInitRankConfig(t *testing.T) {
	minInt32 := int32(math.MinInt32)
	undef := uint64(uint32(minInt32)) // NCCL_CONFIG_UNDEF_INT as the fake records it
	for _, tc := range []struct {
		name                      string
		cfg                       *Config
		blocking, cga, minC, maxC uint64
	}{
		{"nil", nil, 0, undef, undef, undef},
		{"defaults", &Config{}, 0, undef, undef, undef},
		{"blocking", &Config{Blocking: true}, 1, undef, undef, undef},
		{"ctas", &Config{MinCTAs: 2, MaxCTAs: 16, CGAClusterSize: 4}, 0, 4, 2, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			f.install(t)
			id := pattern()
			id[0], id[127] = 0x11, 0x22
			c, err := StartInitRank(id, 3, 2, tc.cfg)
			require.NoError(t, err)
			checkID(t, f, id)
			assert.Equal(t, uint64(3), f.rec(rNRanks))
			assert.Equal(t, uint64(2), f.rec(rRank))
			assert.Equal(t, uint64(0), f.rec(rCfgNull))
			assert.Equal(t, uint64(48), f.rec(rCfgSize), "sizeof(ncclConfig_t) of nccl.h 2.18")
			assert.Equal(t, uint64(0xcafebeef), f.rec(rCfgMagic))
			assert.Equal(t, uint64(21800), f.rec(rCfgVersion), "NCCL_VERSION(2, 18, 0)")
			assert.Equal(t, tc.blocking, f.rec(rCfgBlocking), "blocking")
			assert.Equal(t, tc.cga, f.rec(rCfgCGA), "cgaClusterSize")
			assert.Equal(t, tc.minC, f.rec(rCfgMinCTAs), "minCTAs")
			assert.Equal(t, tc.maxC, f.rec(rCfgMaxCTAs), "maxCTAs")
			assert.Equal(t, uint64(0), f.rec(rCfgNetName), "netName NULL: NCCL chooses")
			assert.Equal(t, undef, f.rec(rCfgSplitShare), "splitShare undefined")
			assert.Equal(t, undef, f.rec(rCfgTail), "the word where 2.19 to 2.24 read trafficClass is undefined")
			assert.Equal(t, uintptr(0xC0AA0002), c.Handle())
			assert.Equal(t, tc.blocking == 1, c.blocking)
		})
	}
}

// TestConfigOutOfRange: a bad Config is an error before NCCL is called.
func TestConfigOutOfRange(t *testing.T) {
	f := newFake(t)
	f.install(t)
	_, err := StartInitRank(UniqueID{}, 2, 0, &Config{MaxCTAs: -1})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "Config.MaxCTAs -1")
	for _, r := range [][2]int{{0, 0}, {2, 2}, {2, -1}} {
		_, err = StartInitRank(UniqueID{}, r[0], r[1], nil)
		require.ErrorIs(t, err, ErrInvalidArgument, "nranks %d rank %d", r[0], r[1])
		assert.Contains(t, err.Error(), "want 0 <= rank < nranks")
	}
	assert.Zero(t, f.rec(rInitCalls), "NCCL was not called")
}

// TestBindRunsOnInitThread: Config.Bind runs on the OS thread that then calls
// ncclCommInitRankConfig, where the CUDA device it makes current is the one NCCL takes.
func TestBindRunsOnInitThread(t *testing.T) {
	f := newFake(t)
	f.install(t)
	for range 20 { // a goroutine could move between threads between two unlocked calls
		var bindTID int
		_, err := StartInitRank(UniqueID{}, 2, 0, &Config{Bind: func() error {
			bindTID = syscall.Gettid()
			time.Sleep(time.Microsecond) // invite the scheduler to move the goroutine
			return nil
		}})
		require.NoError(t, err)
		require.Equal(t, uint64(bindTID), f.rec(rInitTID))
	}

	calls := f.rec(rInitCalls)
	_, err := StartInitRank(UniqueID{}, 2, 0, &Config{Bind: func() error { return ErrSystemError }})
	require.ErrorIs(t, err, ErrSystemError)
	assert.Contains(t, err.Error(), "make the rank's CUDA device current")
	assert.Equal(t, calls, f.rec(rInitCalls), "no init after a failed Bind")
}

func TestABIAllReduce(t *testing.T) {
	f := newFake(t)
	c := f.comm(t, nil)
	require.NoError(t, c.AllReduce(0x7f0000001000, 0x7f0000802000, 123_456_789_012, BFloat16, Avg, 0x5e))
	want := map[int]uint64{rARSend: 0x7f0000001000, rARRecv: 0x7f0000802000, rARCount: 123_456_789_012,
		rARType: 9, rAROp: 4, rARComm: 0xC0AA0001, rARStream: 0x5e, rARCalls: 1}
	for slot, w := range want {
		assert.Equal(t, w, f.rec(slot), "slot %d", slot)
	}
	for _, tc := range []struct {
		dt DataType
		op RedOp
	}{{Float32, Sum}, {Float16, Max}, {Int8, Min}, {Uint64, Prod}} {
		require.NoError(t, c.AllReduce(1, 1, 0, tc.dt, tc.op, 0))
		assert.Equal(t, uint64(tc.dt), f.rec(rARType))
		assert.Equal(t, uint64(tc.op), f.rec(rAROp))
	}
}

// TestErrorText: a failing call is an *Error naming the function, with the text of
// ncclGetErrorString and ncclGetLastError(comm).
func TestErrorText(t *testing.T) {
	f := newFake(t)
	c := f.comm(t, nil)
	f.ctl(cARResult, 4)
	err := c.AllReduce(1, 2, 3, Float32, Sum, 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.NotErrorIs(t, err, ErrInvalidUsage)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "ncclAllReduce", e.Op)
	assert.Equal(t, ErrInvalidArgument, e.Code)
	assert.Equal(t, "fake error string for code 4: fake last error: ncclAllReduce failed", e.Message)
	assert.Equal(t, uint64(4), f.rec(rErrStrCode))
	assert.Equal(t, uint64(0xC0AA0001), f.rec(rLastErrComm), "the last error of this communicator")
	assert.Equal(t, "rank 1 of 2: ncclAllReduce: ncclInvalidArgument (4): fake error string for code 4: fake last error: ncclAllReduce failed",
		err.Error())

	// A failed init: the error, and the communicator NCCL handed back is freed.
	f.ctl(cInitResult, 5)
	_, err = StartInitRank(pattern(), 4, 3, nil)
	require.ErrorIs(t, err, ErrInvalidUsage)
	assert.Contains(t, err.Error(), "init NCCL rank 3 of 4: ncclCommInitRankConfig: ncclInvalidUsage (5)")
	assert.Contains(t, err.Error(), "fake last error: ncclCommInitRankConfig failed")
	assert.Equal(t, uint64(0xC0AA0003), f.rec(rAbortComm))
}

func TestGetUniqueID(t *testing.T) {
	f := newFake(t)
	f.install(t)
	id, err := GetUniqueID()
	require.NoError(t, err)
	for i, b := range id {
		require.Equal(t, byte(i), b, "byte %d", i)
	}
	assert.Equal(t, uint64(1), f.rec(rUIDCalls))
}

// TestNonBlockingInit: InitRank polls ncclCommGetAsyncError until the init is done.
func TestNonBlockingInit(t *testing.T) {
	f := newFake(t)
	f.install(t)
	f.ctl(cInitResult, 7) // ncclInProgress
	f.ctl(cAsyncPending, 3)
	c, err := InitRank(context.Background(), pattern(), 2, 0, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), f.rec(rAsyncCalls), "three times in progress, then done")
	assert.Equal(t, uint64(0xC0AA0000), f.rec(rAsyncComm))
	assert.Zero(t, f.rec(rAbortCalls))
	require.NoError(t, c.AllReduce(1, 2, 3, Float32, Sum, 0))
}

// TestInitAsyncError: an error found in the background fails InitRank and frees the communicator.
func TestInitAsyncError(t *testing.T) {
	f := newFake(t)
	f.install(t)
	f.ctl(cInitResult, 7)
	f.ctl(cAsyncPending, 2)
	f.ctl(cAsyncFinal, 6) // ncclRemoteError
	_, err := InitRank(context.Background(), pattern(), 2, 1, nil)
	require.ErrorIs(t, err, ErrRemoteError)
	assert.Equal(t, "init NCCL: rank 1 of 2: ncclCommGetAsyncError: ncclRemoteError (6): fake error string for code 6: fake last error: the communicator's background work failed",
		err.Error())
	assert.Equal(t, uint64(1), f.rec(rAbortCalls))
	assert.Equal(t, uint64(0xC0AA0001), f.rec(rAbortComm))
}

// TestInitDeadlineAborts: a rank that never comes ends the wait with the context, and the
// communicator is aborted.
func TestInitDeadlineAborts(t *testing.T) {
	f := newFake(t)
	f.install(t)
	f.ctl(cInitResult, 7)
	f.ctl(cAsyncPending, -1) // for ever
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := InitRank(ctx, pattern(), 2, 1, nil)
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "init NCCL: rank 1 of 2: NCCL still in progress when the wait ended (a rank missing or stuck?); the communicator was aborted: timed out: context deadline exceeded")
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Equal(t, uint64(1), f.rec(rAbortCalls), "aborted once")
	assert.Equal(t, uint64(0xC0AA0001), f.rec(rAbortComm))

	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	_, err = InitRank(canceled, pattern(), 2, 0, nil)
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrTimeout, "a canceled wait is not a timeout")
	assert.Equal(t, uint64(2), f.rec(rAbortCalls))
}

// TestAllReduceInProgress: on a non-blocking communicator AllReduce waits for NCCL's
// background work, up to OpTimeout, then aborts the communicator.
func TestAllReduceInProgress(t *testing.T) {
	f := newFake(t)
	c := f.comm(t, &Config{OpTimeout: 50 * time.Millisecond})
	f.ctl(cARResult, 7)
	f.ctl(cAsyncPending, 2)
	require.NoError(t, c.AllReduce(1, 2, 3, Float32, Sum, 0))
	assert.Equal(t, uint64(3), f.rec(rAsyncCalls))

	f.ctl(cAsyncPending, -1)
	err := c.AllReduce(1, 2, 3, Float32, Sum, 0)
	require.ErrorIs(t, err, ErrTimeout)
	assert.Contains(t, err.Error(), "ncclAllReduce: rank 1 of 2: NCCL still in progress")
	assert.Equal(t, uint64(1), f.rec(rAbortCalls))
	assert.Zero(t, c.Handle(), "aborted")
	err = c.AllReduce(1, 2, 3, Float32, Sum, 0)
	require.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, "ncclAllReduce on rank 1 of 2: NCCL communicator is closed", err.Error())

	// A blocking communicator never waits: ncclInProgress is an error there.
	b := f.comm(t, &Config{Blocking: true})
	err = b.AllReduce(1, 2, 3, Float32, Sum, 0)
	require.ErrorIs(t, err, ErrInProgress)
}

func TestAsyncError(t *testing.T) {
	f := newFake(t)
	c := f.comm(t, nil)
	f.ctl(cAsyncPending, 1)
	require.ErrorIs(t, c.AsyncError(), ErrInProgress)
	require.NoError(t, c.AsyncError())
	f.ctl(cAsyncFinal, 2)
	err := c.AsyncError()
	require.ErrorIs(t, err, ErrSystemError)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "ncclCommGetAsyncError", e.Op)
	assert.Contains(t, e.Message, "background work failed")
	assert.Equal(t, uint64(0xC0AA0001), f.rec(rAsyncComm))
}

func TestDestroyAndAbort(t *testing.T) {
	f := newFake(t)
	c := f.comm(t, nil)
	require.NoError(t, c.Destroy(context.Background()))
	assert.Equal(t, uint64(0xC0AA0001), f.rec(rFinalizeComm), "finalized first")
	assert.Equal(t, uint64(0xC0AA0001), f.rec(rDestroyComm))
	assert.Equal(t, uint64(1), f.rec(rDestroyCalls))
	require.NoError(t, c.Destroy(context.Background()), "twice is a no-op")
	require.NoError(t, c.Abort(), "abort after destroy is a no-op")
	assert.Equal(t, uint64(1), f.rec(rDestroyCalls))
	assert.Zero(t, f.rec(rAbortCalls))
	require.ErrorIs(t, c.AllReduce(1, 2, 3, Float32, Sum, 0), ErrClosed)
	_, err := c.Count()
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, c.WaitReady(context.Background()), ErrClosed)

	// Abort frees at once; a second Abort and a Destroy after it do nothing.
	c = f.comm(t, nil)
	require.NoError(t, c.Abort())
	require.NoError(t, c.Abort())
	require.NoError(t, c.Destroy(context.Background()))
	assert.Equal(t, uint64(1), f.rec(rAbortCalls))
	assert.Equal(t, uint64(1), f.rec(rDestroyCalls))

	// A finalize that does not finish in time: the communicator is aborted, not leaked.
	c = f.comm(t, nil)
	f.ctl(cFinalizeResult, 7)
	f.ctl(cAsyncPending, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = c.Destroy(ctx)
	require.ErrorIs(t, err, ErrTimeout)
	assert.Contains(t, err.Error(), "destroy NCCL rank 1 of 2: finalize")
	assert.Equal(t, uint64(2), f.rec(rAbortCalls))
	assert.Equal(t, uint64(1), f.rec(rDestroyCalls), "not destroyed after the abort")

	// A failing finalize: the error, and an abort.
	c = f.comm(t, nil)
	f.ctl(cFinalizeResult, 3)
	err = c.Destroy(context.Background())
	require.ErrorIs(t, err, ErrInternalError)
	assert.Equal(t, uint64(3), f.rec(rAbortCalls))

	// A communicator that ncclCommDestroy refuses is aborted, not leaked.
	c = f.comm(t, nil)
	f.ctl(cFinalizeResult, 0)
	f.ctl(cDestroyResult, 5)
	err = c.Destroy(context.Background())
	require.ErrorIs(t, err, ErrInvalidUsage)
	assert.Contains(t, err.Error(), "destroy NCCL rank 1 of 2 (aborted instead): ncclCommDestroy: ncclInvalidUsage (5)")
	assert.Equal(t, uint64(4), f.rec(rAbortCalls))
	assert.Zero(t, c.Handle())

	// A failing abort is reported.
	c = f.comm(t, nil)
	f.ctl(cAbortResult, 6)
	require.ErrorIs(t, c.Abort(), ErrRemoteError)
	assert.Zero(t, c.Handle())
}

func TestQueries(t *testing.T) {
	f := newFake(t)
	c := f.comm(t, nil)
	f.ctl(cCount, 8)
	f.ctl(cDevice, 3)
	f.ctl(cUserRank, 5)
	n, err := c.Count()
	require.NoError(t, err)
	assert.Equal(t, 8, n)
	d, err := c.Device()
	require.NoError(t, err)
	assert.Equal(t, 3, d)
	r, err := c.Rank()
	require.NoError(t, err)
	assert.Equal(t, 5, r)
	assert.Equal(t, uint64(0xC0AA0001), f.rec(rQueryComm))
}

func TestRegister(t *testing.T) {
	f := newFake(t)
	c := f.comm(t, nil)
	require.True(t, Has(FeatureRegister))
	require.True(t, Has(FeatureWindow))
	reg, err := c.Register(0x7f0000400000, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, Registration(0x7f0000400000|1<<63), reg, "the handle the callee wrote")
	assert.Equal(t, uint64(0xC0AA0001), f.rec(rRegComm))
	assert.Equal(t, uint64(0x7f0000400000), f.rec(rRegBuff))
	assert.Equal(t, uint64(1<<20), f.rec(rRegSize))
	require.NoError(t, c.Deregister(reg))
	assert.Equal(t, uint64(reg), f.rec(rDeregHandle))

	win, err := c.RegisterWindow(0x7f0000800000, 4096, WindowCollSymmetric)
	require.NoError(t, err)
	assert.Equal(t, Window(0x7f0000800000|3<<62), win)
	assert.Equal(t, uint64(1), f.rec(rRegFlags))
	assert.Equal(t, uint64(4096), f.rec(rRegSize))
	require.NoError(t, c.DeregisterWindow(win))
	assert.Equal(t, uint64(win), f.rec(rDeregHandle))

	f.ctl(cRegResult, 4)
	_, err = c.Register(1, 2)
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "register 2 bytes at 0x1")
	assert.Contains(t, err.Error(), "fake last error: ncclCommRegister failed")
}

// TestOptionalSymbolsAbsent: a libnccl without the optional entry points loads; the features
// are off, and only their methods fail.
func TestOptionalSymbolsAbsent(t *testing.T) {
	f := newFake(t, "-DFAKE_NO_OPTIONAL", "-DFAKE_VERSION=21805")
	c := f.comm(t, nil)
	assert.False(t, Has(FeatureRegister))
	assert.False(t, Has(FeatureWindow))
	assert.False(t, Has(FeatureFinalize))
	_, err := c.Register(1, 2)
	require.ErrorIs(t, err, ErrNotSupported)
	assert.Contains(t, err.Error(), "buffer registration needs ncclCommRegister, ncclCommDeregister")
	assert.Contains(t, err.Error(), "(NCCL 2.18.5; needs NCCL 2.19 or newer)")
	_, err = c.RegisterWindow(1, 2, WindowDefault)
	require.ErrorIs(t, err, ErrNotSupported)
	assert.Contains(t, err.Error(), "needs NCCL 2.27 or newer")
	for _, s := range Symbols() {
		assert.Equal(t, !s.Optional, s.Resolved, "%s", s.Name)
	}

	// Destroy without ncclCommFinalize goes straight to ncclCommDestroy.
	require.NoError(t, c.Destroy(context.Background()))
	assert.Equal(t, uint64(1), f.rec(rDestroyCalls))
	assert.Zero(t, f.rec(rFinalizeComm))
	require.ErrorIs(t, c.AllReduce(1, 2, 3, Float32, Sum, 0), ErrClosed)
}

func TestGroup(t *testing.T) {
	f := newFake(t)
	c := f.comm(t, nil)
	var inside uint64
	require.NoError(t, Group(func() error {
		inside = f.rec(rGroupStart)
		return c.AllReduce(1, 2, 3, Float32, Sum, 0)
	}, c))
	assert.Equal(t, uint64(1), inside, "the calls ran inside the group")
	assert.Equal(t, uint64(1), f.rec(rGroupEnd))

	// ncclGroupEnd runs even when fn fails.
	err := Group(func() error { return ErrInvalidUsage })
	require.ErrorIs(t, err, ErrInvalidUsage)
	assert.Equal(t, uint64(2), f.rec(rGroupEnd))

	// Non-blocking communicators: Group waits for each.
	f.ctl(cGroupEndResult, 7)
	f.ctl(cAsyncPending, 2)
	require.NoError(t, Group(func() error { return nil }, c))
	assert.Equal(t, uint64(3), f.rec(rAsyncCalls))

	f.ctl(cGroupEndResult, 5)
	err = Group(func() error { return nil }, c)
	require.ErrorIs(t, err, ErrInvalidUsage)
	assert.Contains(t, err.Error(), "ncclGroupEnd: ncclInvalidUsage (5)")
}

// TestAllReduceZeroAllocs: the hot path makes no Go allocation.
func TestAllReduceZeroAllocs(t *testing.T) {
	skipUnderRace(t)
	f := newFake(t)
	c := f.comm(t, nil)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := c.AllReduce(0x1000, 0x2000, 4096, BFloat16, Sum, 0x5e); err != nil {
			panic(err)
		}
	})
	assert.Zero(t, allocs)
	assert.Equal(t, uint64(1001), f.rec(rARCalls))
}

// BenchmarkAllReduceFake measures this package's cost per call (locking the thread, the call
// through purego) against the fake's ncclAllReduce, which only records its arguments.
func BenchmarkAllReduceFake(b *testing.B) {
	f := newFake(b)
	c := f.comm(b, nil)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.AllReduce(0x1000, 0x2000, 4096, BFloat16, Sum, 0x5e); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAbortEndsWait: Abort from another goroutine ends a WaitReady in progress, and the
// communicator is not polled once freed.
func TestAbortEndsWait(t *testing.T) {
	f := newFake(t)
	c := f.comm(t, nil)
	f.ctl(cAsyncPending, -1)
	done := make(chan error, 1)
	go func() { done <- c.WaitReady(context.Background()) }()
	for f.rec(rAsyncCalls) < 3 {
		time.Sleep(time.Millisecond)
	}
	// Queries from other goroutines meanwhile are fine.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				_ = c.AsyncError()
				_, _ = c.Rank()
			}
		}()
	}
	require.NoError(t, c.Abort())
	wg.Wait()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("WaitReady still polling after Abort")
	}
	polls := f.rec(rAsyncCalls)
	time.Sleep(10 * time.Millisecond)
	assert.Equal(t, polls, f.rec(rAsyncCalls), "no poll of the freed communicator")
	assert.Equal(t, uint64(1), f.rec(rAbortCalls))
}
