package collective_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
	"github.com/goccl/goccl/ptx"
)

// checkOutput compares len(want) bytes at ptr of ctx's device bitwise with want.
func checkOutput(t *testing.T, ctx *driver.Context, dt dtype.DType, hidden int, ptr driver.DevicePtr, want []byte, what string) {
	t.Helper()
	got := make([]byte, len(want))
	require.NoError(t, ctx.CopyDtoH(got, ptr))
	if n, first := ref.Compare(dt, want, got); n != 0 {
		t.Fatalf("%s: %d of %d elements wrong; first at %d (row %d): want %s, got %s", what, n, len(want)/dt.Size(),
			first.Index, first.Index/hidden, ref.Format(dt, first.Want), ref.Format(dt, first.Got))
	}
}

// TestResidualRMSNorm checks the single-rank residual add + RMSNorm call bitwise against the
// reference with one input, on both ranks of a pair of virtual ranks, each with its own data:
// f32, f16 and bf16, hidden 2048, 5120 and 16384, rows 1, 7 and 128; ResidualOut in place
// over the residual, out of place, over In, and NoNorm (which must leave NormOut untouched).
func TestResidualRMSNorm(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(31, 32))
	const maxBytes = 128 * 16384 * 4
	g := newFusedGroup(t, 2, collective.Options{Timeout: 5 * time.Second}, maxBytes)
	poison := make([]byte, maxBytes)
	for i := range poison {
		poison[i] = 0xFF
	}
	for _, dt := range dtype.All {
		for _, hidden := range []int{2048, 5120, 16384} {
			for _, rows := range []int{1, 7, 128} {
				for _, variant := range []string{"in place", "out of place", "over In", "NoNorm"} {
					noNorm := variant == "NoNorm"
					cases := make([]*fusedCase, len(g.ranks))
					for r, rb := range g.ranks {
						fc := newFusedCase(rng, dt, 1, rows, hidden)
						cases[r] = fc
						ctx, b := rb.comm.Context(), g.bufs[r]
						n := uint64(len(fc.residual))
						require.NoError(t, ctx.CopyHtoD(b.in, fc.inputs[0]))
						require.NoError(t, ctx.CopyHtoD(b.residual, fc.residual))
						require.NoError(t, ctx.CopyHtoD(b.gamma, fc.gamma))
						require.NoError(t, ctx.MemsetD8(b.residOut, 0xFF, n))
						require.NoError(t, ctx.MemsetD8(b.normOut, 0xFF, n))
						a := g.args(r, fc, variant != "out of place", noNorm)
						if variant == "over In" {
							a.ResidualOut = a.In
						}
						require.NoError(t, rb.comm.ResidualRMSNorm(rb.stream, a), "rank %d", r)
					}
					g.syncAll(30 * time.Second)
					for r, rb := range g.ranks {
						fc, b := cases[r], g.bufs[r]
						what := fmt.Sprintf("%v hidden %d rows %d %s: rank %d", dt, hidden, rows, variant, r)
						wantR, wantN := fc.want(t, collective.OneShot, noNorm)
						residOut := map[string]driver.DevicePtr{"in place": b.residual, "out of place": b.residOut, "over In": b.in, "NoNorm": b.residual}[variant]
						ctx := rb.comm.Context()
						checkOutput(t, ctx, dt, hidden, residOut, wantR, what+": ResidualOut")
						if noNorm {
							checkOutput(t, ctx, dt, hidden, b.normOut, poison[:len(wantR)], what+": NormOut must stay unwritten")
							continue
						}
						checkOutput(t, ctx, dt, hidden, b.normOut, wantN, what+": NormOut")
					}
				}
			}
		}
	}
}

// TestResidualRMSNormAfterAllReduce runs the unfused pair, AllReduce into a sum buffer and
// then ResidualRMSNorm over it with the residual in place, back to back on each rank's stream
// (with PDL on sm_90, the norm launches behind an all-reduce that may trigger early), at 2, 4
// and 8 virtual ranks, bf16 and f16, hidden 8192, rows 1, 8, 128 and 512: the sum bitwise
// against the reference of the algorithm selected, the outputs against the single-input
// reference over that sum. Eagerly, then captured into one graph per rank with Capture and
// replayed on fresh data. One goroutine drives every rank, and every world size starts with
// no kernel loaded in the process (UnloadKernels): the norm kernels are loaded by LoadFused
// before the first all-reduce, without which the first ResidualRMSNorm's module load may
// wait for rank 0's all-reduce, which waits for a rank not launched yet.
func TestResidualRMSNormAfterAllReduce(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(33, 34))
	const hidden = 8192
	const maxBytes = 512 * hidden * 2
	for _, ws := range []int{2, 4, 8} {
		t.Run(fmt.Sprintf("ws%d", ws), func(t *testing.T) {
			require.NoError(t, collective.UnloadKernels())
			g := newFusedGroup(t, ws, collective.Options{Timeout: 5 * time.Second}, maxBytes)
			// This goroutine drives every rank: the norm kernels must be loaded before an
			// all-reduce is in flight (Comm.LoadFused), else the first ResidualRMSNorm of an
			// element type may wait, in the module load, for rank 0's all-reduce, which waits
			// for rank 1's, which this goroutine has not launched yet.
			for _, rb := range g.ranks {
				for _, dt := range []dtype.DType{dtype.BFloat16, dtype.Float16} {
					require.NoError(t, rb.comm.LoadFused(dt))
				}
			}
			// pair issues the pair on every rank: the sum goes to residOut, the residual is
			// updated in place.
			pair := func(rb *rankBufs, fc *fusedCase) error {
				r := rb.comm.Rank()
				b := g.bufs[r]
				if err := rb.comm.AllReduce(rb.stream, b.residOut, b.in, fc.rows*hidden, fc.dt); err != nil {
					return err
				}
				a := g.args(r, fc, true, false)
				a.In = b.residOut
				return rb.comm.ResidualRMSNorm(rb.stream, a)
			}
			// check compares every rank's sum and outputs with the reference of the
			// all-reduce that algo names.
			check := func(fc *fusedCase, algo collective.Algorithm, what string) {
				t.Helper()
				sum, err := reference(algo, fc.dt, fc.inputs)
				require.NoError(t, err)
				f := ref.Fused{DType: fc.dt, Algo: ref.FusedOneShot, Hidden: hidden, Eps: fusedEps,
					Threads: ptx.FusedThreads(hidden * fc.dt.Size() / ptx.VectorBytes)}
				wantR, wantN, err := f.Run([][]byte{sum}, fc.residual, fc.gamma)
				require.NoError(t, err)
				for r, rb := range g.ranks {
					b, ctx := g.bufs[r], rb.comm.Context()
					w := fmt.Sprintf("%s: rank %d", what, r)
					checkOutput(t, ctx, fc.dt, hidden, b.residOut, sum, w+": sum")
					checkOutput(t, ctx, fc.dt, hidden, b.residual, wantR, w+": ResidualOut")
					checkOutput(t, ctx, fc.dt, hidden, b.normOut, wantN, w+": NormOut")
				}
			}
			for _, dt := range []dtype.DType{dtype.BFloat16, dtype.Float16} {
				for _, rows := range []int{1, 8, 128, 512} {
					nbytes := int64(rows * hidden * dt.Size())
					what := fmt.Sprintf("%v rows %d", dt, rows)
					fc := newFusedCase(rng, dt, ws, rows, hidden)
					g.upload(fc)
					for _, rb := range g.ranks {
						require.NoError(t, pair(rb, fc))
					}
					g.syncAll(30 * time.Second)
					check(fc, g.ranks[0].comm.Selected(nbytes, false), what+" eager")

					graphs := make([]*collective.Graph, ws)
					g.parallel(func(rb *rankBufs) error {
						var err error
						graphs[rb.comm.Rank()], err = rb.comm.Capture(context.Background(), rb.stream, func() error { return pair(rb, fc) })
						return err
					})
					for replay := range 2 {
						fc = newFusedCase(rng, dt, ws, rows, hidden)
						g.upload(fc)
						for r, rb := range g.ranks {
							require.NoError(t, graphs[r].Launch(rb.stream))
						}
						g.syncAll(30 * time.Second)
						check(fc, g.ranks[0].comm.Selected(nbytes, true), fmt.Sprintf("%s graph replay %d", what, replay))
					}
					for _, x := range graphs {
						require.NoError(t, x.Close())
					}
				}
			}
		})
	}
}
