package collective_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
	"github.com/goccl/goccl/ptx"
)

// TestMultiProcessFused runs the fused all-reduce + residual + RMSNorm across 4 processes on
// GPU 0 (buffers shared through real cross-process IPC handles), each a rank checking its
// own outputs bitwise against internal/ref, and so against every other rank's. The grid is
// TestAllReduceResidualRMSNorm's (every algorithm, bf16 and f16 at every hidden size and row
// count, f32 on a smaller grid, out of place and NoNorm at hidden 5120), then registered
// inputs, registered outputs and graphs replayed on fresh data as in
// TestAllReduceResidualRMSNormRegisteredAndGraph. Like TestMultiProcess it runs with or
// without MPS.
func TestMultiProcessFused(t *testing.T) {
	requireGPU(t)
	runRankProcesses(t, 4, "TestMultiProcessFusedChild", "multiprocess fused rank ok", 8*time.Minute)
}

// fusedRank is one process's communicator, stream and fused buffers in
// TestMultiProcessFusedChild.
type fusedRank struct {
	t      *testing.T
	comm   *collective.Comm
	stream *driver.Stream
	rank   int
	bufs   fusedBufs
}

// TestMultiProcessFusedChild is one rank of TestMultiProcessFused; it does nothing unless
// started by it. Every rank draws every rank's data from the same seed, so each computes the
// reference on its own; the ranks make the same calls in the same order.
func TestMultiProcessFusedChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	rank, size, boot := joinAsRank(ctx, t, "TestMultiProcessFused")
	const maxBytes = 17 << 20 // 513 rows of 16384 bf16
	comm, err := collective.New(ctx, 0, boot, collective.Options{MaxBytes: maxBytes, Timeout: 20 * time.Second})
	require.NoError(t, err)
	defer comm.Close()
	stream, err := comm.Context().NewStream()
	require.NoError(t, err)
	defer stream.Close()
	alloc := cleanupAlloc(t, comm.Context())
	fr := &fusedRank{t: t, comm: comm, stream: stream, rank: rank, bufs: fusedBufs{in: alloc(maxBytes),
		residual: alloc(maxBytes), residOut: alloc(maxBytes), normOut: alloc(maxBytes), gamma: alloc(ptx.MaxHidden * 4)}}
	rng := rand.New(rand.NewPCG(41, 42))

	// Eager, nothing registered yet: one-shot and two-shot read the peers' inputs through
	// their staging buffers, two-shot gathers through tmp.
	cases := 0
	eachFusedShape(func(dt dtype.DType, hidden, rows int) {
		fc := newFusedCase(rng, dt, size, rows, hidden)
		for _, algo := range fusedAlgos(dt, rows, hidden) {
			what := fmt.Sprintf("%v %v rows %d hidden %d", algo, dt, rows, hidden)
			if !fr.run(fc, algo, fr.args(fc, true, false), what+" in place") {
				continue
			}
			cases++
			if hidden == 5120 && rows <= 32 {
				fr.run(fc, algo, fr.args(fc, false, false), what+" out of place")
				fr.run(fc, algo, fr.args(fc, true, true), what+" NoNorm")
			}
		}
	})
	t.Logf("rank %d: %d eager cases", rank, cases)

	// Registered inputs (read in place by the peers), then registered outputs too (two-shot
	// writes its rows straight into every rank's outputs), each also captured in a graph and
	// replayed on fresh data. Registration is collective: every rank registers the same
	// buffers in the same order.
	_, err = comm.Register(ctx, fr.bufs.in, maxBytes)
	require.NoError(t, err)
	for _, outputs := range []bool{false, true} {
		if outputs {
			_, err = comm.Register(ctx, fr.bufs.residual, maxBytes)
			require.NoError(t, err)
			_, err = comm.Register(ctx, fr.bufs.normOut, maxBytes)
			require.NoError(t, err)
		}
		for _, dt := range []dtype.DType{dtype.BFloat16, dtype.Float16} {
			for _, hidden := range []int{5120, 8192} {
				for _, rows := range []int{7, 128} {
					for _, algo := range fusedAlgos(dt, rows, hidden) {
						what := fmt.Sprintf("%v %v rows %d hidden %d registered outputs %v", algo, dt, rows, hidden, outputs)
						fc := newFusedCase(rng, dt, size, rows, hidden)
						require.True(t, fr.run(fc, algo, fr.args(fc, true, false), what))
						graph, err := comm.Capture(ctx, stream, func() error {
							return comm.AllReduceResidualRMSNormWith(stream, fr.args(fc, true, false), algo)
						})
						require.NoError(t, err, what)
						for replay := range 2 {
							fc = newFusedCase(rng, dt, size, rows, hidden)
							fr.upload(fc)
							require.NoError(t, graph.Launch(stream), what)
							fr.verify(fc, algo, fr.args(fc, true, false), fmt.Sprintf("%s graph replay %d", what, replay))
						}
						require.NoError(t, graph.Close())
					}
				}
			}
		}
	}
	fmt.Println("multiprocess fused rank ok")
}

// args returns this rank's arguments of fc; inPlace makes ResidualOut the residual buffer.
func (fr *fusedRank) args(fc *fusedCase, inPlace, noNorm bool) collective.FusedArgs {
	b := fr.bufs
	a := collective.FusedArgs{NormOut: b.normOut, ResidualOut: b.residOut, In: b.in, Residual: b.residual, Gamma: b.gamma,
		Rows: fc.rows, Hidden: fc.hidden, Eps: fusedEps, DType: fc.dt, NoNorm: noNorm}
	if inPlace {
		a.ResidualOut = b.residual
	}
	return a
}

// run uploads fc, makes the fused call a on this rank's stream and checks it; a two-shot
// whose bands do not fit the tmp buffer (refused on every rank alike) reports false.
func (fr *fusedRank) run(fc *fusedCase, algo collective.Algorithm, a collective.FusedArgs, what string) bool {
	fr.t.Helper()
	fr.upload(fc)
	err := fr.comm.AllReduceResidualRMSNormWith(fr.stream, a, algo)
	if err != nil && algo == collective.TwoShot && strings.Contains(err.Error(), "tmp buffer") {
		fr.t.Logf("%s: bands do not fit the tmp buffer, refused", what)
		return false
	}
	require.NoError(fr.t, err, what)
	fr.verify(fc, algo, a, what)
	return true
}

// upload writes fc's data for this rank and poisons both outputs (0xFF.. is a NaN in every
// element type: an unwritten element cannot pass).
func (fr *fusedRank) upload(fc *fusedCase) {
	t := fr.t
	t.Helper()
	c, n := fr.comm.Context(), uint64(len(fc.residual))
	require.NoError(t, c.CopyHtoD(fr.bufs.in, fc.inputs[fr.rank]))
	require.NoError(t, c.CopyHtoD(fr.bufs.residual, fc.residual))
	require.NoError(t, c.CopyHtoD(fr.bufs.gamma, fc.gamma))
	require.NoError(t, c.MemsetD8(fr.bufs.residOut, 0xFF, n))
	require.NoError(t, c.MemsetD8(fr.bufs.normOut, 0xFF, n))
}

// verify waits for the call on this rank's stream and compares ResidualOut (and NormOut
// unless a.NoNorm) bitwise with the reference of algo.
func (fr *fusedRank) verify(fc *fusedCase, algo collective.Algorithm, a collective.FusedArgs, what string) {
	t := fr.t
	t.Helper()
	require.NoError(t, fr.stream.Synchronize(), what)
	require.NoError(t, fr.comm.Err(), what)
	wantR, wantN := fc.want(t, algo, a.NoNorm)
	fr.compare(fc, "ResidualOut", a.ResidualOut, wantR, what)
	if !a.NoNorm {
		fr.compare(fc, "NormOut", a.NormOut, wantN, what)
	}
}

// compare fails the test unless the device buffer ptr holds want.
func (fr *fusedRank) compare(fc *fusedCase, name string, ptr driver.DevicePtr, want []byte, what string) {
	t := fr.t
	t.Helper()
	got := make([]byte, len(want))
	require.NoError(t, fr.comm.Context().CopyDtoH(got, ptr))
	if bad, first := ref.Compare(fc.dt, want, got); bad != 0 {
		t.Fatalf("%s: rank %d: %s: %d of %d elements wrong; first at %d (row %d): want %s, got %s", what, fr.rank, name,
			bad, len(want)/fc.dt.Size(), first.Index, first.Index/fc.hidden, ref.Format(fc.dt, first.Want), ref.Format(fc.dt, first.Got))
	}
}
