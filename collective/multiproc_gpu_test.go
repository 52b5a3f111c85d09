package collective_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
	"github.com/goccl/goccl/memory"
)

// envMPRank carries a TestMultiProcess child's rank; its presence marks the child.
const envMPRank = "GOCCL_MP_RANK"

// TestMultiProcess runs 4 processes on GPU 0, joined by the Unix-socket bootstrap, with each
// kind of IPC memory: real cross-process handles. With MPS running (the GPU bundle starts it
// where it exists) their kernels run concurrently; without it they time-slice, slower but
// still correct.
func TestMultiProcess(t *testing.T) {
	requireGPU(t)
	for _, kind := range []memory.Kind{memory.LegacyIPC, memory.VMM} {
		t.Run(kind.String(), func(t *testing.T) {
			runRankProcesses(t, 4, "TestMultiProcessChild", "multiprocess rank ok", 4*time.Minute,
				"GOCCL_MP_KIND="+strconv.Itoa(int(kind)))
		})
	}
}

// runRankProcesses starts procs children running the test child as ranks of a group joined
// through a Unix socket (its rank, the world size, the socket and a job token in each one's
// environment, with extraEnv), and fails t unless every one exits cleanly, within limit,
// having printed okLine. Rank 0's output is logged.
func runRankProcesses(t *testing.T, procs int, child, okLine string, limit time.Duration, extraEnv ...string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "boot.sock")
	token := make([]byte, 16)
	crand.Read(token)
	cmds, outs := startChildren(t, child, procs, limit, func(r int) []string {
		return append([]string{envMPRank + "=" + strconv.Itoa(r), "GOCCL_MP_SIZE=" + strconv.Itoa(procs),
			"GOCCL_MP_SOCK=" + sock, bootstrap.TokenEnv + "=" + hex.EncodeToString(token)}, extraEnv...)
	})
	for r, c := range cmds {
		err := c.Wait()
		require.NoError(t, err, "rank %d failed:\n%s", r, outs[r])
		require.Contains(t, outs[r].String(), okLine, "rank %d:\n%s", r, outs[r])
	}
	t.Logf("rank 0 output:\n%s", outs[0])
}

// startChildren starts procs copies of this test binary, each running only the test child,
// child r with env(r) added to childEnv, its output gathered in outs[r]. The children are
// killed after limit, and when the test ends those not yet waited for (a rank that failed
// leaves its peers waiting for it); the caller waits for them.
func startChildren(t *testing.T, child string, procs int, limit time.Duration, env func(r int) []string) (cmds []*exec.Cmd, outs []*bytes.Buffer) {
	t.Helper()
	cmds = make([]*exec.Cmd, procs)
	outs = make([]*bytes.Buffer, procs)
	for r := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^"+child+"$", "-test.v")
		cmd.Env = append(childEnv(), env(r)...)
		outs[r] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[r], outs[r]
		require.NoError(t, cmd.Start())
		cmds[r] = cmd
	}
	timer := time.AfterFunc(limit, func() {
		for _, c := range cmds {
			c.Process.Kill()
		}
	})
	t.Cleanup(func() {
		timer.Stop()
		for _, c := range cmds {
			if c.ProcessState == nil {
				c.Process.Kill()
				c.Wait()
			}
		}
	})
	return cmds, outs
}

// joinAsRank is the start of a child of runRankProcesses: its rank and the world size, and
// the bootstrap joined with the other processes within ctx. It skips t in a process that is
// not such a child.
func joinAsRank(ctx context.Context, t *testing.T, parent string) (rank, size int, boot bootstrap.Bootstrap) {
	t.Helper()
	rankStr := os.Getenv(envMPRank)
	if rankStr == "" {
		t.Skip("child of " + parent + " only")
	}
	rank, _ = strconv.Atoi(rankStr)
	size, _ = strconv.Atoi(os.Getenv("GOCCL_MP_SIZE"))
	boot, err := bootstrap.NewUnix(ctx, os.Getenv("GOCCL_MP_SOCK"), rank, size)
	require.NoError(t, err)
	return rank, size, boot
}

// TestMultiProcessChild is one rank of TestMultiProcess; it does nothing unless started by it.
func TestMultiProcessChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rank, size, boot := joinAsRank(ctx, t, "TestMultiProcess")
	kindN, _ := strconv.Atoi(os.Getenv("GOCCL_MP_KIND"))
	start := time.Now()
	comm, err := collective.New(ctx, 0, boot, collective.Options{IPC: memory.Kind(kindN), Timeout: 20 * time.Second})
	require.NoError(t, err)
	defer comm.Close()
	t.Logf("rank %d: New took %v", rank, time.Since(start))

	c := comm.Context()
	stream, err := c.NewStream()
	require.NoError(t, err)
	defer stream.Close()
	const capacity = 2 << 20
	in, err := c.Alloc(capacity)
	require.NoError(t, err)
	defer c.Free(in)
	out, err := c.Alloc(capacity)
	require.NoError(t, err)
	defer c.Free(out)

	// Every rank derives every rank's input from the same seeds, so each can compute the
	// reference on its own.
	inputsFor := func(round int, dt dtype.DType, nbytes int) [][]byte {
		inputs := make([][]byte, size)
		for r := range inputs {
			inputs[r] = ref.Random(rand.New(rand.NewPCG(uint64(round), uint64(r))), dt, nbytes)
		}
		return inputs
	}
	run := func(round int, algo collective.Algorithm, dt dtype.DType, nbytes int, launch func() error) {
		inputs := inputsFor(round, dt, nbytes)
		require.NoError(t, c.CopyHtoD(in, inputs[rank]))
		require.NoError(t, c.MemsetD8(out, 0xFF, uint64(nbytes)))
		require.NoError(t, launch())
		require.NoError(t, stream.Synchronize())
		require.NoError(t, comm.Err())
		want, err := reference(algo, dt, inputs)
		require.NoError(t, err)
		got := make([]byte, nbytes)
		require.NoError(t, c.CopyDtoH(got, out))
		n, first := ref.Compare(dt, want, got)
		require.Zero(t, n, "round %d %v %v %d bytes: %d wrong, first %+v", round, algo, dt, nbytes, n, first)
	}

	round := 0
	for _, algo := range collective.Algorithms {
		for _, dt := range dtype.All {
			for _, nbytes := range []int{16, 1040 * dt.Size(), 256 << 10} {
				round++
				run(round, algo, dt, nbytes, func() error {
					return comm.AllReduceWith(stream, out, in, nbytes/dt.Size(), dt, algo)
				})
			}
		}
	}

	// Registered input (zero copy through an IPC-opened user buffer), then graph capture
	// with deferred registration, replayed on fresh data.
	_, err = comm.Register(ctx, in, capacity)
	require.NoError(t, err)
	nbytes := 1 << 20
	for _, algo := range []collective.Algorithm{collective.OneShot, collective.TwoShot} {
		round++
		run(round, algo, dtype.BFloat16, nbytes, func() error {
			return comm.AllReduceWith(stream, out, in, nbytes/2, dtype.BFloat16, algo)
		})
		graph, err := comm.Capture(ctx, stream, func() error {
			return comm.AllReduceWith(stream, out, in, nbytes/2, dtype.BFloat16, algo)
		})
		require.NoError(t, err)
		for range 3 {
			round++
			run(round, algo, dtype.BFloat16, nbytes, func() error { return graph.Launch(stream) })
		}
		require.NoError(t, graph.Close())
	}
	fmt.Println("multiprocess rank ok")
}
