package collective_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
	"github.com/goccl/goccl/nccl"
)

// requireNCCL skips without a usable GPU or libnccl.
func requireNCCL(tb testing.TB) {
	tb.Helper()
	requireGPU(tb)
	if err := nccl.Load(); err != nil {
		tb.Skipf("no usable libnccl: %v", err)
	}
}

// newNCCLOneRank returns a communicator of one rank on device 0 that NCCL alone serves, and a
// stream of its context; both are closed when the test ends. It skips without a usable GPU
// or libnccl.
func newNCCLOneRank(tb testing.TB) (*collective.Comm, *driver.Stream) {
	tb.Helper()
	requireNCCL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	boots, err := bootstrap.NewInProcess(1)
	require.NoError(tb, err)
	comm, err := collective.New(ctx, 0, boots[0], collective.Options{NCCL: collective.NCCLAlways})
	require.NoError(tb, err)
	tb.Cleanup(func() { comm.Close() })
	stream, err := comm.Context().NewStream()
	require.NoError(tb, err)
	tb.Cleanup(func() { stream.Close() })
	return comm, stream
}

// TestNCCLOneRank: a communicator of one rank has no kernels to run, and NCCL serves it.
func TestNCCLOneRank(t *testing.T) {
	comm, stream := newNCCLOneRank(t)
	require.Equal(t, collective.NCCL, comm.Selected(16, false))
	dev := comm.Context()
	const nbytes = 1 << 20
	in, err := dev.Alloc(nbytes)
	require.NoError(t, err)
	defer dev.Free(in)
	out, err := dev.Alloc(nbytes)
	require.NoError(t, err)
	defer dev.Free(out)
	want := ref.Random(mrand.New(mrand.NewPCG(1, 2)), dtype.Float32, nbytes)
	require.NoError(t, dev.CopyHtoD(in, want))
	require.NoError(t, comm.AllReduce(stream, out, in, nbytes/4, dtype.Float32))
	require.NoError(t, stream.Synchronize())
	require.NoError(t, comm.Err())
	got := make([]byte, nbytes)
	require.NoError(t, dev.CopyDtoH(got, out))
	require.Equal(t, want, got, "one rank's sum is its input")
}

// NCCL job children: their rank in GOCCL_NCCL_RANK; what to do in GOCCL_NCCL_MODE.
const (
	envNCCLRank = "GOCCL_NCCL_RANK"
	envNCCLMode = "GOCCL_NCCL_MODE"
)

// TestNCCLMultiNode runs 2 and 4 processes on GPU 0 as if on as many hosts (each its own
// NCCL_HOSTID, NCCL over its socket transport on lo), joined through FromEnv's several-node
// path (TCP bootstrap): every call goes to NCCL, every element type, sizes up to 64 MiB. Then
// a rank that dies before its all-reduce makes the others fail within twice Options.Timeout,
// and so does a rank that never replays its graph of a captured NCCL all-reduce while the
// others replay theirs.
func TestNCCLMultiNode(t *testing.T) {
	requireNCCL(t)
	for _, procs := range []int{2, 4} {
		for _, mode := range []string{"sums", "killed", "stuckgraph"} {
			t.Run(fmt.Sprintf("%d/%s", procs, mode), func(t *testing.T) {
				runNCCLJob(t, procs, mode)
			})
		}
	}
}

func runNCCLJob(t *testing.T, procs int, mode string) {
	port2 := freePort(t)
	cmds, outs := startNCCLHosts(t, "TestNCCLMultiNodeChild", procs, 4*time.Minute, func(r int) []string {
		env := []string{envNCCLRank + "=" + strconv.Itoa(r), envNCCLMode + "=" + mode}
		if mode == "sums" {
			env = append(env, "GOCCL_TEST_ADDR2=127.0.0.1:"+strconv.Itoa(port2))
		}
		return env
	})
	for r, c := range cmds {
		err := c.Wait()
		if mode == "killed" && r == procs-1 {
			continue // the rank that dies
		}
		require.NoError(t, err, "rank %d failed:\n%s", r, outs[r])
		require.Contains(t, outs[r].String(), "nccl rank ok", "rank %d:\n%s", r, outs[r])
	}
	t.Logf("rank 0 output:\n%s", outs[0])
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startNCCLHosts starts procs children of this test binary, each running test as rank r of
// one job: torchrun's variables, a TCP bootstrap on a free port of 127.0.0.1 with a fresh job
// token, and an NCCL_HOSTID of its own with NCCL's sockets on lo, so that NCCL takes every
// process for a host of its own (several processes share the one GPU). env gives rank r's
// other variables. The children are killed after limit; the caller waits for them.
func startNCCLHosts(t *testing.T, test string, procs int, limit time.Duration, env func(r int) []string) ([]*exec.Cmd, []*bytes.Buffer) {
	port := freePort(t)
	token := make([]byte, 16)
	rand.Read(token)
	return startChildren(t, test, procs, limit, func(r int) []string {
		return append(env(r),
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(procs), "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1",
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), bootstrap.AddrEnv+"=127.0.0.1:"+strconv.Itoa(port),
			bootstrap.TokenEnv+"="+hex.EncodeToString(token),
			"NCCL_HOSTID=goccl-test-host-"+strconv.Itoa(r), "NCCL_SOCKET_IFNAME=lo")
	})
}

// TestNCCLMultiNodeChild is one rank of TestNCCLMultiNode; it does nothing unless started by
// it.
func TestNCCLMultiNodeChild(t *testing.T) {
	rankStr := os.Getenv(envNCCLRank)
	if rankStr == "" {
		t.Skip("run by TestNCCLMultiNode")
	}
	rank, _ := strconv.Atoi(rankStr)
	size, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	boot, err := bootstrap.FromEnv(ctx)
	require.NoError(t, err)
	const timeout = 5 * time.Second
	start := time.Now()
	comm, err := collective.New(ctx, 0, boot, collective.Options{NCCL: collective.NCCLAlways, Timeout: timeout})
	require.NoError(t, err)
	defer comm.Close()
	withNCCL := time.Since(start)
	if addr2 := os.Getenv("GOCCL_TEST_ADDR2"); addr2 != "" {
		// The same processes as one host without NCCL (NCCL_HOSTID counts only for NCCL):
		// goccl's kernels alone, for the init time NCCL adds.
		boot2, err := bootstrap.NewTCP(ctx, rank, size, addr2, os.Getenv(bootstrap.TokenEnv), bootstrap.Options{})
		require.NoError(t, err)
		start = time.Now()
		kernels, err := collective.New(ctx, 0, boot2, collective.Options{NCCL: collective.NCCLOff, Timeout: timeout})
		require.NoError(t, err)
		fmt.Printf("rank %d: New with NCCL alone %v, with goccl's kernels alone %v\n", rank, withNCCL.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		require.NoError(t, kernels.Close())
	}
	require.Equal(t, collective.NCCL, comm.Selected(16, false), "ranks on several hosts: NCCL serves every call")
	dev := comm.Context()
	stream, err := dev.NewStream()
	require.NoError(t, err)
	defer stream.Close()
	const capacity = 64 << 20
	in, err := dev.Alloc(capacity)
	require.NoError(t, err)
	defer dev.Free(in)
	out, err := dev.Alloc(capacity)
	require.NoError(t, err)
	defer dev.Free(out)

	if os.Getenv(envNCCLMode) == "killed" {
		if rank == size-1 {
			os.Exit(3) // dies before its all-reduce
		}
		// NCCL connects to a peer on the first call that needs it: the call itself may wait
		// for the dead peer (up to Options.Timeout, then NCCL is aborted), or the watchdog
		// reports the queued call that never completes. Either way within twice the timeout.
		start := time.Now()
		err := comm.AllReduce(stream, out, in, 1<<20, dtype.BFloat16)
		var waitErr error
		if err == nil {
			wctx, wcancel := context.WithTimeout(context.Background(), 2*timeout+5*time.Second)
			defer wcancel()
			waitErr = stream.Wait(wctx)
			for err == nil && time.Since(start) < 2*timeout {
				time.Sleep(50 * time.Millisecond)
				err = comm.Err()
			}
		}
		require.Error(t, err, "a dead peer must be reported within twice the timeout (stream wait: %v)", waitErr)
		require.Less(t, time.Since(start), 2*timeout+time.Second)
		require.ErrorIs(t, err, collective.ErrUnusable)
		require.ErrorIs(t, comm.Err(), collective.ErrUnusable, "and every later call says so")
		fmt.Printf("rank %d: reported after %v: %v\n", rank, time.Since(start).Round(time.Millisecond), err)
		fmt.Println("nccl rank ok")
		return
	}

	if os.Getenv(envNCCLMode) == "stuckgraph" {
		// Every rank captures one all-reduce (NCCL's) after an eager one that connects the
		// peers; the last rank never replays its graph. The others' replays wait for it on
		// the GPU, where no call returns an error: the watchdog must see the replay stuck
		// past the timeout, abort NCCL (which ends the replay's kernel), and report it.
		require.NoError(t, comm.AllReduce(stream, out, in, 1<<20, dtype.BFloat16))
		require.NoError(t, stream.Wait(ctx))
		g, err := comm.Capture(ctx, stream, func() error {
			return comm.AllReduce(stream, out, in, 1<<20, dtype.BFloat16)
		})
		require.NoError(t, err)
		if rank == size-1 {
			time.Sleep(2*timeout + 3*time.Second) // long enough for the peers to report
			fmt.Println("nccl rank ok")
			os.Exit(0) // a rank gone without a word: no Close
		}
		start := time.Now()
		require.NoError(t, g.Launch(stream))
		err = nil
		for err == nil && time.Since(start) < 2*timeout+time.Second {
			time.Sleep(50 * time.Millisecond)
			err = comm.Err()
		}
		require.Error(t, err, "a replay waiting for a peer that never replays must be reported")
		require.Less(t, time.Since(start), 2*timeout)
		require.ErrorIs(t, err, collective.ErrTimeout)
		require.ErrorContains(t, err, "replay")
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer wcancel()
		require.NoError(t, stream.Wait(wctx), "the aborted replay's kernels end")
		require.ErrorIs(t, g.Launch(stream), collective.ErrUnusable, "no replay on an aborted communicator")
		fmt.Printf("rank %d: reported after %v: %v\n", rank, time.Since(start).Round(time.Millisecond), err)
		fmt.Println("nccl rank ok")
		return
	}

	// Integer-valued inputs: their sums are exact in any order of addition, so NCCL's results
	// can be compared bitwise with the reference.
	for _, dt := range dtype.All {
		for _, nbytes := range []int{16, 4096 + 2*dt.Size(), 1 << 20, 9 << 20, 64 << 20} {
			count := nbytes / dt.Size()
			inputs := make([][]byte, size)
			for r := range inputs {
				inputs[r] = smallIntegers(mrand.New(mrand.NewPCG(uint64(r), uint64(nbytes))), dt, count)
			}
			want, err := ref.OneShot(dt, inputs)
			require.NoError(t, err)
			require.NoError(t, dev.CopyHtoD(in, inputs[rank]))
			require.NoError(t, dev.MemsetD8(out, 0xFF, uint64(nbytes)))
			require.NoError(t, comm.AllReduce(stream, out, in, count, dt))
			wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
			require.NoError(t, stream.Wait(wctx))
			wcancel()
			require.NoError(t, comm.Err())
			got := make([]byte, nbytes)
			require.NoError(t, dev.CopyDtoH(got, out))
			if n, first := ref.Compare(dt, want, got); n != 0 {
				t.Fatalf("rank %d, %v, %d bytes: %d elements wrong; first at %d: want %s, got %s", rank, dt, nbytes, n,
					first.Index, ref.Format(dt, first.Want), ref.Format(dt, first.Got))
			}
		}
	}
	fmt.Println("nccl rank ok")
}

// smallIntegers returns count elements of dt holding integers in [-8, 8].
func smallIntegers(rng *mrand.Rand, dt dtype.DType, count int) []byte {
	out := make([]byte, count*dt.Size())
	for i := range count {
		v := float32(rng.IntN(17) - 8)
		switch dt {
		case dtype.Float32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		case dtype.Float16:
			binary.LittleEndian.PutUint16(out[2*i:], ref.F32ToF16(v))
		default:
			binary.LittleEndian.PutUint16(out[2*i:], ref.F32ToBF16(v))
		}
	}
	return out
}

// BenchmarkAllReduceHostNCCL measures the host cost of one AllReduce that goes to NCCL (a
// communicator of one rank, 16 KiB of bf16): checks, routing, ncclAllReduce, and the events
// that let the watchdog and Close follow the call. "bare" calls package nccl's AllReduce on the
// same communicator, the binding alone; scripts/bench/nccl_allreduce.c is the C baseline.
func BenchmarkAllReduceHostNCCL(b *testing.B) {
	comm, stream := newNCCLOneRank(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dev := comm.Context()
	const count = 8 << 10
	buf, err := dev.Alloc(2 * count)
	require.NoError(b, err)
	defer dev.Free(buf)
	bare, err := nccl.InitRankBlocking(mustID(b), 1, 0, func() error { _, _, err := dev.MemInfo(); return err })
	require.NoError(b, err)
	defer bare.Destroy(ctx)
	for _, v := range []struct {
		name string
		call func() error
	}{
		{"collective", func() error { return comm.AllReduce(stream, buf, buf, count, dtype.BFloat16) }},
		{"bare", func() error {
			return bare.AllReduce(uint64(buf), uint64(buf), count, nccl.BFloat16, nccl.Sum, stream.Handle())
		}},
	} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				if err := v.call(); err != nil {
					b.Fatal(err)
				}
				if i%64 == 63 {
					b.StopTimer()
					require.NoError(b, stream.Synchronize())
					b.StartTimer()
				}
			}
			b.StopTimer()
			require.NoError(b, stream.Synchronize())
			require.NoError(b, comm.Err())
		})
	}
}

func mustID(b *testing.B) nccl.UniqueID {
	id, err := nccl.GetUniqueID()
	require.NoError(b, err)
	return id
}
