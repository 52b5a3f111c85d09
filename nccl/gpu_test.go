package nccl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/internal/gputest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The GPU tests run through the real libnccl.so.2 on device 0. They skip without a driver, a
// GPU or a libnccl (GOCCL_REQUIRE_GPU=1 makes a missing GPU a failure, GOCCL_REQUIRE_NCCL=1 a
// missing libnccl). Every wait is bounded by gpuTimeout.

const gpuTimeout = 60 * time.Second

// requireNCCLGPU returns the primary context of device 0, closed at the end of the test.
func requireNCCLGPU(t testing.TB) *driver.Context {
	t.Helper()
	gputest.Require(t)
	if err := Load(); err != nil {
		if os.Getenv("GOCCL_REQUIRE_NCCL") == "1" {
			t.Fatalf("GOCCL_REQUIRE_NCCL=1 but: %v", err)
		}
		t.Skipf("no usable libnccl: %v", err)
	}
	c, err := primaryContext()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Close()) })
	return c
}

func primaryContext() (*driver.Context, error) {
	d, err := driver.GetDevice(0)
	if err != nil {
		return nil, err
	}
	return driver.PrimaryContext(d)
}

// bindTo is a Config.Bind that makes c current on the calling thread: every method of package
// driver leaves its context current on the thread it ran on, and MemInfo is a cheap one.
func bindTo(c *driver.Context) func() error {
	return func() error {
		_, _, err := c.MemInfo()
		return err
	}
}

// f32Bytes encodes v as little-endian float32s.
func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// rankValue is element i of rank r's input: small integers, so every sum is exact in float32.
func rankValue(r, i int) float32 { return float32((r+1)*(i%251) - 97*r) }

// allReduceCheck runs a float32 all-reduce of n elements with op on comm (rank of nranks) and
// checks the result against the sum over all ranks' rankValue; inPlace uses one buffer.
func allReduceCheck(c *driver.Context, comm *Comm, rank, nranks, n int, op RedOp, inPlace bool) error {
	in := make([]float32, n)
	for i := range in {
		in[i] = rankValue(rank, i)
	}
	size := uint64(4 * n)
	send, err := c.Alloc(size)
	if err != nil {
		return err
	}
	defer c.Free(send)
	recv := send
	if !inPlace {
		if recv, err = c.Alloc(size); err != nil {
			return err
		}
		defer c.Free(recv)
		if err := c.MemsetD8(recv, 0xff, size); err != nil {
			return err
		}
	}
	if err := c.CopyHtoD(send, f32Bytes(in)); err != nil {
		return err
	}
	s, err := c.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	if err := comm.AllReduce(uint64(send), uint64(recv), uint64(n), Float32, op, s.Handle()); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
	defer cancel()
	if err := s.Wait(ctx); err != nil {
		return fmt.Errorf("wait for the all-reduce: %w (NCCL: %v)", err, comm.AsyncError())
	}
	got := make([]byte, size)
	if err := c.CopyDtoH(got, recv); err != nil {
		return err
	}
	want := make([]float32, n)
	for i := range want {
		var acc float32
		for r := range nranks {
			switch v := rankValue(r, i); {
			case r == 0:
				acc = v
			case op == Sum || op == Avg:
				acc += v
			case op == Max:
				acc = max(acc, v)
			case op == Min:
				acc = min(acc, v)
			}
		}
		if op == Avg {
			acc /= float32(nranks)
		}
		want[i] = acc
	}
	if wantB := f32Bytes(want); !bytes.Equal(wantB, got) {
		for i := range n {
			if !bytes.Equal(wantB[4*i:4*i+4], got[4*i:4*i+4]) {
				return fmt.Errorf("rank %d of %d, %v, in place %v: element %d is %v, want %v", rank, nranks, op, inPlace, i,
					math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])), want[i])
			}
		}
	}
	return nil
}

// TestGPUAllReduceWorldOne runs all-reduces on a communicator of one rank, made both ways.
func TestGPUAllReduceWorldOne(t *testing.T) {
	c := requireNCCLGPU(t)
	v, err := LibraryVersion()
	require.NoError(t, err)
	t.Logf("libnccl %s, NCCL %v; finalize %v, register %v, window %v", LibraryPath(), v,
		Has(FeatureFinalize), Has(FeatureRegister), Has(FeatureWindow))

	id, err := GetUniqueID()
	require.NoError(t, err)
	assert.NotEqual(t, UniqueID{}, id)
	ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
	defer cancel()
	nb, err := InitRank(ctx, id, 1, 0, &Config{Bind: bindTo(c)})
	require.NoError(t, err, "%v", err)
	defer func() { assert.NoError(t, nb.Destroy(ctx)) }()

	id2, err := GetUniqueID()
	require.NoError(t, err)
	bl, err := InitRankBlocking(id2, 1, 0, bindTo(c))
	require.NoError(t, err, "%v", err)
	defer func() { assert.NoError(t, bl.Destroy(ctx)) }()

	for _, comm := range []*Comm{nb, bl} {
		n, err := comm.Count()
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		r, err := comm.Rank()
		require.NoError(t, err)
		assert.Equal(t, 0, r)
		d, err := comm.Device()
		require.NoError(t, err)
		assert.Equal(t, int(c.Device()), d)
		require.NoError(t, comm.AsyncError())
		// ncclAvg is left out: over one rank, NCCL 2.28.3 leaves the last elements of an
		// out-of-place average of 2^20+3 floats unwritten (NaN in the poisoned output on an
		// H200), and goccl only ever asks NCCL for sums.
		for _, op := range []RedOp{Sum, Max} {
			for _, inPlace := range []bool{false, true} {
				require.NoError(t, allReduceCheck(c, comm, 0, 1, 1<<20+3, op, inPlace))
			}
		}
	}

	// A registered buffer (NCCL 2.19) works like any other.
	if Has(FeatureRegister) {
		const n = 1 << 16
		p, err := c.Alloc(4 * n)
		require.NoError(t, err)
		defer c.Free(p)
		reg, err := nb.Register(uint64(p), 4*n)
		require.NoError(t, err)
		require.NoError(t, c.CopyHtoD(p, f32Bytes(make([]float32, n))))
		require.NoError(t, nb.AllReduce(uint64(p), uint64(p), n, Float32, Sum, 0))
		require.NoError(t, c.Synchronize())
		require.NoError(t, nb.Deregister(reg))
	}

	// A bad argument comes back with NCCL's own explanation. NCCL then keeps the error on the
	// communicator (its finalize reports it again), so this one is aborted, not destroyed.
	id3, err := GetUniqueID()
	require.NoError(t, err)
	bad, err := InitRankBlocking(id3, 1, 0, bindTo(c))
	require.NoError(t, err)
	err = bad.AllReduce(0, 0, 16, DataType(77), Sum, 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
	t.Logf("bad data type: %v", err)
	require.NoError(t, bad.Abort())
}

// TestGPUAllReduceHotPathAllocs: the real ncclAllReduce path allocates nothing in Go.
func TestGPUAllReduceHotPathAllocs(t *testing.T) {
	skipUnderRace(t)
	c := requireNCCLGPU(t)
	id, err := GetUniqueID()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
	defer cancel()
	comm, err := InitRank(ctx, id, 1, 0, &Config{Bind: bindTo(c)})
	require.NoError(t, err)
	defer func() { assert.NoError(t, comm.Destroy(ctx)) }()
	p, err := c.Alloc(1 << 12)
	require.NoError(t, err)
	defer c.Free(p)
	s, err := c.NewStream()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, comm.AllReduce(uint64(p), uint64(p), 1024, Float32, Sum, s.Handle())) // connects
	allocs := testing.AllocsPerRun(200, func() {
		if err := comm.AllReduce(uint64(p), uint64(p), 1024, Float32, Sum, s.Handle()); err != nil {
			panic(err)
		}
	})
	require.NoError(t, s.Wait(ctx))
	assert.Zero(t, allocs)
}

// TestGPUAbortWaitingInit: a rank that waits for a peer that never comes is stopped by its
// context, and the communicator is aborted, in bounded time.
func TestGPUAbortWaitingInit(t *testing.T) {
	c := requireNCCLGPU(t)
	id, err := GetUniqueID()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := InitRank(ctx, id, 2, 0, &Config{Bind: bindTo(c)})
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(gpuTimeout):
		t.Fatalf("InitRank did not return %v after its context ended: ncclCommAbort hangs", gpuTimeout)
	}
	require.ErrorIs(t, err, ErrTimeout)
	t.Logf("init without the peer: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
}

// ncclRanksEnv sets the number of processes of TestGPUMultiProcess (default 2).
const ncclRanksEnv = "GOCCL_NCCL_TEST_RANKS"

// TestGPUMultiProcess runs one rank per process, every process on device 0. NCCL refuses two
// ranks of one host on one GPU, so each process gets its own NCCL_HOSTID: NCCL then sees
// separate hosts and connects them through sockets on the loopback interface
// (NCCL_SOCKET_IFNAME=lo). Rank 0 creates the unique id and passes it through a file.
func TestGPUMultiProcess(t *testing.T) {
	requireNCCLGPU(t)
	nranks := 2
	if v := os.Getenv(ncclRanksEnv); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, ncclRanksEnv)
		require.GreaterOrEqual(t, n, 2, ncclRanksEnv)
		nranks = n
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	idFile := filepath.Join(t.TempDir(), "nccl-unique-id")
	ctx, cancel := context.WithTimeout(context.Background(), 3*gpuTimeout)
	defer cancel()

	var wg sync.WaitGroup
	outs := make([]string, nranks)
	errs := make([]error, nranks)
	for r := range nranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=allreduce",
				"GOCCL_NCCL_TEST_RANK="+strconv.Itoa(r), "GOCCL_NCCL_TEST_NRANKS="+strconv.Itoa(nranks),
				"GOCCL_NCCL_TEST_ID_FILE="+idFile,
				"NCCL_HOSTID=goccl-nccl-test-"+strconv.Itoa(r), "NCCL_SOCKET_IFNAME=lo", "NCCL_IB_DISABLE=1")
			out, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(out), err
		}()
	}
	wg.Wait()
	for r := range nranks {
		require.NoError(t, errs[r], "rank %d:\n%s", r, outs[r])
		assert.Contains(t, outs[r], fmt.Sprintf("ok rank %d of %d", r, nranks))
		t.Logf("rank %d: %s", r, strings.TrimSpace(outs[r]))
	}
}

// runChild is one process of TestGPUMultiProcess.
func runChild(role string) error {
	if role != "allreduce" {
		return fmt.Errorf("unknown role %q", role)
	}
	rank, err1 := strconv.Atoi(os.Getenv("GOCCL_NCCL_TEST_RANK"))
	nranks, err2 := strconv.Atoi(os.Getenv("GOCCL_NCCL_TEST_NRANKS"))
	idFile := os.Getenv("GOCCL_NCCL_TEST_ID_FILE")
	if err := errors.Join(err1, err2); err != nil || idFile == "" {
		return fmt.Errorf("GOCCL_NCCL_TEST_RANK, _NRANKS and _ID_FILE must be set: %v", err)
	}
	c, err := primaryContext()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
	defer cancel()

	var id UniqueID
	if rank == 0 {
		if id, err = GetUniqueID(); err != nil {
			return err
		}
		tmp := idFile + ".tmp"
		if err := os.WriteFile(tmp, id[:], 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, idFile); err != nil { // the others never see a partial file
			return err
		}
	} else if id, err = readID(ctx, idFile); err != nil {
		return err
	}
	comm, err := InitRank(ctx, id, nranks, rank, &Config{Bind: bindTo(c)})
	if err != nil {
		return err
	}
	ops := []RedOp{Sum, Max, Min}
	if nranks&(nranks-1) == 0 {
		// NCCL averages floats by multiplying each input by 1/nranks before the sum: exact
		// for the test's small integers only when 1/nranks is.
		ops = append(ops, Avg)
	}
	for _, op := range ops {
		for _, n := range []int{1, 1000, 1<<20 + 3} {
			if err := allReduceCheck(c, comm, rank, nranks, n, op, n%2 == 1); err != nil {
				return errors.Join(err, comm.Abort())
			}
		}
	}
	if err := comm.Destroy(ctx); err != nil {
		return err
	}
	fmt.Printf("ok rank %d of %d\n", rank, nranks)
	return nil
}

// readID waits for rank 0's id file.
func readID(ctx context.Context, path string) (UniqueID, error) {
	var id UniqueID
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(b) == len(id) {
			copy(id[:], b)
			return id, nil
		}
		select {
		case <-ctx.Done():
			return id, fmt.Errorf("wait for rank 0's unique id in %s: %w", path, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
