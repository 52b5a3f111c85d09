package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/gputest"
	"github.com/goccl/goccl/internal/ref"
	"github.com/goccl/goccl/nccl"
	"github.com/goccl/goccl/ptx"
)

// fusedBufs is one rank's buffers of the fused tests, each of the largest message.
type fusedBufs struct {
	in, residual, residOut, normOut, gamma driver.DevicePtr
}

// fusedGroup is a group of virtual ranks with the fused call's buffers on every rank.
type fusedGroup struct {
	*group
	bufs []fusedBufs
}

func newFusedGroup(t testing.TB, ws int, opts collective.Options, maxBytes int) *fusedGroup {
	t.Helper()
	opts.MaxBytes = int64(maxBytes)
	return newFusedGroupOn(t, virtualRanks(ws), opts, maxBytes)
}

// newFusedGroupOn is newFusedGroup on the given devices (one rank each), with buffers of
// maxBytes whatever opts.MaxBytes says.
func newFusedGroupOn(t testing.TB, devices []int, opts collective.Options, maxBytes int) *fusedGroup {
	t.Helper()
	g := &fusedGroup{group: newGroup(t, devices, opts, 16)}
	for _, rb := range g.ranks {
		alloc := cleanupAlloc(t, rb.comm.Context())
		g.bufs = append(g.bufs, fusedBufs{in: alloc(maxBytes), residual: alloc(maxBytes), residOut: alloc(maxBytes),
			normOut: alloc(maxBytes), gamma: alloc(ptx.MaxHidden * 4)})
	}
	return g
}

// cleanupAlloc returns a function that allocates n bytes of device memory in ctx, freed when
// the test ends.
func cleanupAlloc(t testing.TB, ctx *driver.Context) func(n int) driver.DevicePtr {
	return func(n int) driver.DevicePtr {
		p, err := ctx.Alloc(uint64(n))
		require.NoError(t, err)
		t.Cleanup(func() { ctx.Free(p) })
		return p
	}
}

// fusedCase is the data of one call shape: every rank's input, and the residual and gamma
// that every rank passes.
type fusedCase struct {
	dt              dtype.DType
	rows, hidden    int
	inputs          [][]byte
	residual, gamma []byte
}

func newFusedCase(rng *rand.Rand, dt dtype.DType, ws, rows, hidden int) *fusedCase {
	fc := &fusedCase{dt: dt, rows: rows, hidden: hidden, inputs: make([][]byte, ws)}
	// One generator per rank, seeded from rng, so that the ranks' inputs (up to 513 rows of
	// 16384 elements each) are drawn in parallel and still depend only on rng.
	var wg sync.WaitGroup
	for r := range fc.inputs {
		src := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			fc.inputs[r] = ref.Activations(src, dt, rows*hidden, 1)
		}()
	}
	fc.residual = ref.Activations(rng, dt, rows*hidden, 4)
	fc.gamma = ref.Activations(rng, dt, hidden, 1.5)
	wg.Wait()
	return fc
}

const fusedEps = 1e-6

// want returns the reference ResidualOut and NormOut of algo.
func (fc *fusedCase) want(t testing.TB, algo collective.Algorithm, noNorm bool) (resid, norm []byte) {
	t.Helper()
	order := ref.FusedOneShot
	switch algo {
	case collective.TwoShot:
		order = ref.FusedTwoShot
	case collective.Push:
		order = ref.FusedPush
	}
	f := ref.Fused{DType: fc.dt, Algo: order, Hidden: fc.hidden, Eps: fusedEps, NoNorm: noNorm,
		Threads: ptx.FusedThreads(fc.hidden * fc.dt.Size() / ptx.VectorBytes)}
	resid, norm, err := f.Run(fc.inputs, fc.residual, fc.gamma)
	require.NoError(t, err)
	return resid, norm
}

// upload writes the case's inputs, residual and gamma to every rank and poisons both outputs
// (0xFF.. is a NaN in every element type: an unwritten element cannot pass).
func (g *fusedGroup) upload(fc *fusedCase) {
	g.t.Helper()
	n := uint64(len(fc.residual))
	for r, rb := range g.ranks {
		ctx, b := rb.comm.Context(), g.bufs[r]
		require.NoError(g.t, ctx.CopyHtoD(b.in, fc.inputs[r]))
		require.NoError(g.t, ctx.CopyHtoD(b.residual, fc.residual))
		require.NoError(g.t, ctx.CopyHtoD(b.gamma, fc.gamma))
		require.NoError(g.t, ctx.MemsetD8(b.residOut, 0xFF, n))
		require.NoError(g.t, ctx.MemsetD8(b.normOut, 0xFF, n))
	}
}

// args returns rank r's arguments; inPlace makes ResidualOut the residual buffer.
func (g *fusedGroup) args(r int, fc *fusedCase, inPlace, noNorm bool) collective.FusedArgs {
	b := g.bufs[r]
	a := collective.FusedArgs{NormOut: b.normOut, ResidualOut: b.residOut, In: b.in, Residual: b.residual, Gamma: b.gamma,
		Rows: fc.rows, Hidden: fc.hidden, Eps: fusedEps, DType: fc.dt, NoNorm: noNorm}
	if inPlace {
		a.ResidualOut = b.residual
	}
	return a
}

// registerOutputs registers every rank's residual buffer (the tests' ResidualOut in place)
// and NormOut, n bytes each: a collective call.
func (g *fusedGroup) registerOutputs(n int) {
	g.t.Helper()
	g.parallel(func(rb *rankBufs) error {
		b := g.bufs[rb.comm.Rank()]
		if _, err := rb.comm.Register(context.Background(), b.residual, uint64(n)); err != nil {
			return err
		}
		_, err := rb.comm.Register(context.Background(), b.normOut, uint64(n))
		return err
	})
}

// checkFused compares every rank's outputs bitwise with the reference (and so with each
// other).
func (g *fusedGroup) checkFused(fc *fusedCase, wantResid, wantNorm []byte, inPlace bool, what string) {
	g.t.Helper()
	for r, rb := range g.ranks {
		b := g.bufs[r]
		residOut := b.residOut
		if inPlace {
			residOut = b.residual
		}
		for _, out := range []struct {
			name string
			ptr  driver.DevicePtr
			want []byte
		}{{"ResidualOut", residOut, wantResid}, {"NormOut", b.normOut, wantNorm}} {
			if out.want == nil {
				continue
			}
			got := make([]byte, len(out.want))
			require.NoError(g.t, rb.comm.Context().CopyDtoH(got, out.ptr))
			if n, first := ref.Compare(fc.dt, out.want, got); n != 0 {
				g.t.Fatalf("%s: rank %d: %s: %d of %d elements wrong; first at %d (row %d): want %s, got %s", what, r, out.name, n,
					len(out.want)/fc.dt.Size(), first.Index, first.Index/fc.hidden, ref.Format(fc.dt, first.Want), ref.Format(fc.dt, first.Got))
			}
		}
	}
}

// call issues the fused call on every rank; a TwoShot whose bands do not fit the tmp buffer
// reports false (refused on every rank alike).
func (g *fusedGroup) call(fc *fusedCase, algo collective.Algorithm, inPlace, noNorm bool) bool {
	g.t.Helper()
	for r, rb := range g.ranks {
		err := rb.comm.AllReduceResidualRMSNormWith(rb.stream, g.args(r, fc, inPlace, noNorm), algo)
		if err != nil && r == 0 && strings.Contains(err.Error(), "tmp buffer") {
			return false
		}
		require.NoError(g.t, err, "rank %d", r)
	}
	return true
}

var (
	fusedHidden = []int{2048, 4096, 5120, 8192, 16384}
	fusedRows   = []int{1, 2, 7, 32, 128, 513}
)

// eachFusedShape calls fn with every element type, hidden size of fusedHidden and row count
// of fusedRows, f32 on a smaller grid (hidden 2048 and 4096, up to 128 rows).
func eachFusedShape(fn func(dt dtype.DType, hidden, rows int)) {
	for _, dt := range dtype.All {
		for _, hidden := range fusedHidden {
			for _, rows := range fusedRows {
				if dt == dtype.Float32 && (hidden%2048 != 0 || hidden > 4096 || rows > 128) {
					continue
				}
				fn(dt, hidden, rows)
			}
		}
	}
}

// fusedAlgos are the algorithms a fused call of rows rows of hidden elements of dt is tested
// with: OneShot and TwoShot always, Push where the call fits the default PushMaxBytes (rows
// 1 to 32: more rows than the push grid has blocks in some).
func fusedAlgos(dt dtype.DType, rows, hidden int) []collective.Algorithm {
	algos := []collective.Algorithm{collective.OneShot, collective.TwoShot}
	if int64(rows*hidden*dt.Size()) <= collective.DefaultPushMaxBytes {
		algos = append(algos, collective.Push)
	}
	return algos
}

// TestAllReduceResidualRMSNorm runs the fused kernels at 2, 4, 8 and 16 virtual ranks, bf16
// and f16, every hidden size of fusedHidden and row count of fusedRows (MaxBytes 17 MiB holds
// 513 rows of 16384 bf16), ResidualOut in place over the residual; each result bitwise
// against internal/ref on every rank. OneShot and TwoShot everywhere, Push where fusedAlgos
// has it. Out of place and NoNorm (hidden 5120, up to 32 rows), and f32 (hidden 2048 and
// 4096, up to 128 rows) on a smaller grid.
func TestAllReduceResidualRMSNorm(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(21, 22))
	const maxBytes = 17 << 20
	for _, ws := range []int{2, 4, 8, 16} {
		t.Run(fmt.Sprintf("ws%d", ws), func(t *testing.T) {
			g := newFusedGroup(t, ws, collective.Options{Timeout: 5 * time.Second}, maxBytes)
			eachFusedShape(func(dt dtype.DType, hidden, rows int) {
				fc := newFusedCase(rng, dt, ws, rows, hidden)
				for _, algo := range fusedAlgos(dt, rows, hidden) {
					what := fmt.Sprintf("%v %v rows %d hidden %d", algo, dt, rows, hidden)
					wantR, wantN := fc.want(t, algo, false)
					g.upload(fc)
					if !g.call(fc, algo, true, false) {
						t.Logf("%s: bands do not fit the tmp buffer, refused", what)
						continue
					}
					g.syncAll(30 * time.Second)
					g.checkFused(fc, wantR, wantN, true, what+" in place")
					if hidden != 5120 || rows > 32 {
						continue
					}
					g.upload(fc)
					require.True(t, g.call(fc, algo, false, false))
					g.syncAll(30 * time.Second)
					g.checkFused(fc, wantR, wantN, false, what+" out of place")
					wantR, _ = fc.want(t, algo, true)
					g.upload(fc)
					require.True(t, g.call(fc, algo, true, true))
					g.syncAll(30 * time.Second)
					g.checkFused(fc, wantR, nil, true, what+" NoNorm")
				}
			})
		})
	}
}

// TestAllReduceResidualRMSNormRegisteredAndGraph: registered inputs (read in place by the
// peers, also with In == ResidualOut, which OneShot then stages), then registered outputs too
// (TwoShot writes the finished rows straight into every rank's outputs: direct), and graphs
// captured with Capture (direct as well), replayed on fresh data, at 2, 4, 8 and 16 ranks,
// every kernel, bf16 and f16, hidden 5120 and 8192, rows 7 and 128 (the grid of the eager
// test is cut here). Push (rows 7 only: 128 rows are past PushMaxBytes) reads In in place
// whatever is registered; with In == ResidualOut its blocks write rows of In that other
// blocks send.
func TestAllReduceResidualRMSNormRegisteredAndGraph(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(23, 24))
	const maxBytes = 4 << 20
	for _, ws := range []int{2, 4, 8, 16} {
		for _, algo := range []collective.Algorithm{collective.OneShot, collective.TwoShot, collective.Push} {
			t.Run(fmt.Sprintf("ws%d/%v", ws, algo), func(t *testing.T) {
				g := newFusedGroup(t, ws, collective.Options{Timeout: 5 * time.Second}, maxBytes)
				g.parallel(func(rb *rankBufs) error {
					_, err := rb.comm.Register(context.Background(), g.bufs[rb.comm.Rank()].in, maxBytes)
					return err
				})
				for _, outputs := range []bool{false, true} {
					if outputs {
						g.registerOutputs(maxBytes)
					}
					for _, dt := range []dtype.DType{dtype.BFloat16, dtype.Float16} {
						for _, hidden := range []int{5120, 8192} {
							for _, rows := range []int{7, 128} {
								if !slices.Contains(fusedAlgos(dt, rows, hidden), algo) {
									continue
								}
								fc := newFusedCase(rng, dt, ws, rows, hidden)
								what := fmt.Sprintf("%v rows %d hidden %d registered outputs %v", dt, rows, hidden, outputs)
								wantR, wantN := fc.want(t, algo, false)
								g.upload(fc)
								require.True(t, g.call(fc, algo, true, false))
								g.syncAll(30 * time.Second)
								g.checkFused(fc, wantR, wantN, true, what+" registered")

								// In == ResidualOut: the residual goes into the input buffer.
								g.upload(fc)
								for r, rb := range g.ranks {
									a := g.args(r, fc, false, false)
									a.ResidualOut = a.In
									require.NoError(t, rb.comm.AllReduceResidualRMSNormWith(rb.stream, a, algo))
								}
								g.syncAll(30 * time.Second)
								for r, rb := range g.ranks {
									got := make([]byte, len(wantR))
									require.NoError(t, rb.comm.Context().CopyDtoH(got, g.bufs[r].in))
									n, _ := ref.Compare(dt, wantR, got)
									require.Zero(t, n, "%s: rank %d: In == ResidualOut", what, r)
								}

								// A graph of the call, replayed twice on fresh inputs.
								graphs := make([]*collective.Graph, ws)
								g.parallel(func(rb *rankBufs) error {
									r := rb.comm.Rank()
									var err error
									graphs[r], err = rb.comm.Capture(context.Background(), rb.stream, func() error {
										return rb.comm.AllReduceResidualRMSNormWith(rb.stream, g.args(r, fc, true, false), algo)
									})
									return err
								})
								for replay := range 2 {
									fc = newFusedCase(rng, dt, ws, rows, hidden)
									wantR, wantN = fc.want(t, algo, false)
									g.upload(fc)
									for r, rb := range g.ranks {
										require.NoError(t, graphs[r].Launch(rb.stream))
									}
									g.syncAll(30 * time.Second)
									g.checkFused(fc, wantR, wantN, true, fmt.Sprintf("%s graph replay %d", what, replay))
								}
								for _, x := range graphs {
									require.NoError(t, x.Close())
								}
							}
						}
					}
				}
			})
		}
	}
}

// TestFusedColumnsRowsPerBlock runs the Columns kernel where its blocks hold several rows
// each (stage 2 norms two rows of a block at once where a thread's two cached vectors hold
// the whole row, and one at a time otherwise): 8 virtual ranks (16 blocks on an H200; Columns
// up to 64 rows, through tmp from 24) and 16 (8 blocks, up to 32 rows, direct), rows that
// give every block two, some blocks three, and every block three and four rows (two pairs),
// every hidden size of fusedHidden (16384 bf16 is past the pair: one row at a time), bf16,
// f16 and f32 (hidden 2048 and 4096), ResidualOut in place over the residual, through tmp
// and with the outputs registered (direct); bitwise against the one-shot's reference on
// every rank.
func TestFusedColumnsRowsPerBlock(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(25, 26))
	const maxBytes = 4 << 20
	for _, tc := range []struct {
		ws   int
		rows []int
	}{{8, []int{24, 33, 48, 64}}, {16, []int{9, 17, 24, 32}}} {
		t.Run(fmt.Sprintf("ws%d", tc.ws), func(t *testing.T) {
			g := newFusedGroup(t, tc.ws, collective.Options{Timeout: 5 * time.Second}, maxBytes)
			for _, outputs := range []bool{false, true} {
				if outputs {
					g.registerOutputs(maxBytes)
				}
				for _, dt := range dtype.All {
					for _, hidden := range fusedHidden {
						for _, rows := range tc.rows {
							if dt == dtype.Float32 && hidden > 4096 || rows*hidden*dt.Size() > maxBytes {
								continue
							}
							fc := newFusedCase(rng, dt, tc.ws, rows, hidden)
							what := fmt.Sprintf("%v rows %d hidden %d registered outputs %v", dt, rows, hidden, outputs)
							wantR, wantN := fc.want(t, collective.OneShot, false)
							g.upload(fc)
							require.True(t, g.call(fc, collective.OneShot, true, false))
							g.syncAll(30 * time.Second)
							g.checkFused(fc, wantR, wantN, true, what)
						}
					}
				}
			}
		})
	}
}

// TestAllReduceResidualRMSNormSystemScope runs the fused kernels with the system-scope
// barriers that ranks on several GPUs use (virtual ranks get the GPU-scope ones by default):
// 2, 4 and 8 ranks, OneShot and TwoShot, through tmp and with registered outputs (the direct
// two-shot, whose delivered barrier releases its writes at system scope), bf16, rows from one
// to a two-shot band spread over blocks to bands of several rows; bitwise on every rank. Both
// system-scope protocols: counted arrivals (GPUs with native peer atomics) and round-number
// flags (Options.FlagBarriers, the PCIe one), the latter at 4 ranks.
func TestAllReduceResidualRMSNormSystemScope(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(25, 26))
	const maxBytes, hidden = 4 << 20, 4096
	for _, su := range []struct {
		ws    int
		flags bool
	}{{2, false}, {4, false}, {8, false}, {4, true}} {
		ws := su.ws
		t.Run(fmt.Sprintf("ws%d/flags%v", ws, su.flags), func(t *testing.T) {
			g := newFusedGroup(t, ws, collective.Options{Timeout: 5 * time.Second, SystemScope: true, FlagBarriers: su.flags}, maxBytes)
			for _, outputs := range []bool{false, true} {
				if outputs {
					g.registerOutputs(maxBytes)
				}
				for _, rows := range []int{1, 7, 128, 257} {
					fc := newFusedCase(rng, dtype.BFloat16, ws, rows, hidden)
					for _, algo := range []collective.Algorithm{collective.OneShot, collective.TwoShot} {
						what := fmt.Sprintf("%v rows %d registered outputs %v", algo, rows, outputs)
						wantR, wantN := fc.want(t, algo, false)
						for range 3 {
							g.upload(fc)
							require.True(t, g.call(fc, algo, true, false), what)
							g.syncAll(30 * time.Second)
							g.checkFused(fc, wantR, wantN, true, what)
						}
					}
				}
			}
		})
	}
}

// TestAllReduceResidualRMSNormRefusals: aliasing and shapes the call refuses, with real
// device memory, leave the communicator usable; ranks that split the same elements into
// other rows are caught by the kernels' call check.
func TestAllReduceResidualRMSNormRefusals(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(25, 26))
	g := newFusedGroup(t, 2, collective.Options{Timeout: 3 * time.Second}, 1<<20)
	fc := newFusedCase(rng, dtype.BFloat16, 2, 8, 4096)
	rb := g.ranks[0]
	goMemory := make([]byte, 2*16384+16)
	hostPtr := driver.DevicePtr((uintptr(unsafe.Pointer(&goMemory[0])) + 15) &^ 15)
	defer runtime.KeepAlive(goMemory)
	bad := map[string]func(a *collective.FusedArgs){
		"NormOut is In":             func(a *collective.FusedArgs) { a.NormOut = a.In },
		"NormOut is ResidualOut":    func(a *collective.FusedArgs) { a.NormOut = a.ResidualOut },
		"Gamma inside ResidualOut":  func(a *collective.FusedArgs) { a.Gamma = a.ResidualOut + 4096 },
		"ResidualOut shifted by 16": func(a *collective.FusedArgs) { a.ResidualOut = a.Residual + 16 },
		"hidden 4100":               func(a *collective.FusedArgs) { a.Hidden = 4100; a.Rows = 1 },
		"hidden 1024":               func(a *collective.FusedArgs) { a.Hidden = 1024 },
		"past MaxBytes":             func(a *collective.FusedArgs) { a.Rows = 129 },
		"pageable Go memory":        func(a *collective.FusedArgs) { a.Gamma = hostPtr },
	}
	for name, f := range bad {
		a := g.args(0, fc, true, false)
		f(&a)
		assert.ErrorIs(t, rb.comm.AllReduceResidualRMSNorm(rb.stream, a), collective.ErrInvalidArgument, name)
	}
	g.upload(fc)
	wantR, wantN := fc.want(t, collective.OneShot, false)
	require.True(t, g.call(fc, collective.OneShot, true, false))
	g.syncAll(30 * time.Second)
	g.checkFused(fc, wantR, wantN, true, "after the refusals")

	// rank 0: 8 rows of 4096, rank 1: 4 rows of 8192, the same bytes
	start := time.Now()
	for r, rb := range g.ranks {
		a := g.args(r, fc, true, false)
		if r == 1 {
			a.Rows, a.Hidden = 4, 8192
		}
		require.NoError(t, rb.comm.AllReduceResidualRMSNormWith(rb.stream, a, collective.OneShot))
	}
	g.waitAll(20 * time.Second)
	err := g.ranks[0].comm.Err()
	require.ErrorIs(t, err, collective.ErrCallMismatch, "after %v", time.Since(start))
	var ke *collective.KernelError
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, ptx.OpAllReduceRMSNorm, ke.Mine.Op)
	rows, hidden := ptx.FusedShape(ke.Mine.Count)
	assert.Equal(t, [2]int{8, 4096}, [2]int{rows, hidden})
	rows, hidden = ptx.FusedShape(ke.Theirs.Count)
	assert.Equal(t, [2]int{4, 8192}, [2]int{rows, hidden})
	t.Logf("rank 0: %v", err)
}

// TestFusedCallMismatch: ranks whose fused calls differ in their rows get an error naming both
// calls at once, not wrong rows or a hang: OneShot with few rows (its row-cache build, whose
// blocks check the calls after their sum pass) and with more, and TwoShot. The grids differ
// too (a block per row), so the blocks that only some ranks launch give up once their rank's
// record is set.
func TestFusedCallMismatch(t *testing.T) {
	requireGPU(t)
	const ws, hidden = 3, 4096
	cases := []struct {
		algo        collective.Algorithm
		rank0, rest int
	}{
		{collective.OneShot, 4, 8},
		{collective.OneShot, 40, 48},
		{collective.TwoShot, 24, 30},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%v/rows%d-%d", tc.algo, tc.rank0, tc.rest), func(t *testing.T) {
			timeout := 3 * time.Second
			g := newFusedGroup(t, ws, collective.Options{Timeout: timeout}, 1<<20)
			start := time.Now()
			for r, rb := range g.ranks {
				rows := tc.rest
				if r == 0 {
					rows = tc.rank0
				}
				fc := &fusedCase{dt: dtype.BFloat16, rows: rows, hidden: hidden}
				require.NoError(t, rb.comm.AllReduceResidualRMSNormWith(rb.stream, g.args(r, fc, false, false), tc.algo), "rank %d", r)
			}
			g.waitAll(4 * timeout)
			ke := rank0Mismatch(t, g.group, start)
			mine, mineHidden := ptx.FusedShape(ke.Mine.Count)
			theirs, theirsHidden := ptx.FusedShape(ke.Theirs.Count)
			assert.Equal(t, []int{tc.rank0, hidden}, []int{mine, mineHidden})
			assert.Equal(t, []int{tc.rest, hidden}, []int{theirs, theirsHidden})
			assert.Less(t, time.Since(start), timeout, "the mismatch should be reported at once, not after the watchdog's timeout")
			for r, rb := range g.ranks {
				require.Error(t, rb.comm.Err(), "rank %d took part in a mismatched call and must not look healthy", r)
			}
			t.Logf("rank 0: %v", ke)
		})
	}
}

// TestRMSNormKernel checks the single-rank kernel of the unfused pair (Comm.ResidualRMSNorm)
// bitwise against the reference with one input, bf16 and f16, every hidden size of fusedHidden
// and row count of fusedRows, in place over the residual.
func TestRMSNormKernel(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(27, 28))
	g := newFusedGroup(t, 2, collective.Options{}, 17<<20)
	rb, b := g.ranks[0], g.bufs[0]
	ctx := rb.comm.Context()
	for _, dt := range []dtype.DType{dtype.BFloat16, dtype.Float16} {
		for _, hidden := range fusedHidden {
			for _, rows := range fusedRows {
				fc := newFusedCase(rng, dt, 1, rows, hidden)
				wantR, wantN := fc.want(t, collective.OneShot, false)
				require.NoError(t, ctx.CopyHtoD(b.in, fc.inputs[0]))
				require.NoError(t, ctx.CopyHtoD(b.residual, fc.residual))
				require.NoError(t, ctx.CopyHtoD(b.gamma, fc.gamma))
				require.NoError(t, ctx.MemsetD8(b.normOut, 0xFF, uint64(len(wantN))))
				require.NoError(t, rb.comm.ResidualRMSNorm(rb.stream, collective.FusedArgs{NormOut: b.normOut, ResidualOut: b.residual,
					In: b.in, Residual: b.residual, Gamma: b.gamma, Rows: rows, Hidden: hidden, Eps: fusedEps, DType: dt}))
				require.NoError(t, rb.stream.Synchronize())
				for _, out := range []struct {
					ptr  driver.DevicePtr
					want []byte
				}{{b.residual, wantR}, {b.normOut, wantN}} {
					got := make([]byte, len(out.want))
					require.NoError(t, ctx.CopyDtoH(got, out.ptr))
					n, first := ref.Compare(dt, out.want, got)
					if n != 0 {
						t.Fatalf("%v rows %d hidden %d: %d wrong, first at %d: want %s, got %s", dt, rows, hidden, n, first.Index,
							ref.Format(dt, first.Want), ref.Format(dt, first.Got))
					}
				}
			}
		}
	}
}

// BenchmarkAllReduceResidualRMSNorm compares the fused call with the unfused pair (AllReduce
// into a sum buffer, then Comm.ResidualRMSNorm) in the fork/join
// harness of BenchmarkAllReduceForkJoin: one CUDA graph of 200 layers, registered inputs,
// ResidualOut in place over the residual, bf16, hidden 8192, rows 1 to 512, at 2, 4 and 8
// virtual ranks, Auto selection for both (the log says which algorithm each fused variant
// ran). fused-direct registers ResidualOut and NormOut too, so that a TwoShot writes the
// finished rows straight into every rank's outputs; fused-nonorm is the residual add alone
// (NoNorm), which tells the norm's part of the fused call; fused-oneshot, fused-twoshot and
// fused-push (where the call fits PushMaxBytes) force the algorithm (outputs not shared: the
// two-shot goes through tmp), for the selection table; allreduce is the pair's all-reduce
// alone, so that the pair less it is the norm kernel's share, the most fusing can save.
func BenchmarkAllReduceResidualRMSNorm(b *testing.B) {
	requireGPU(b)
	const hidden = 8192
	dt := dtype.BFloat16
	for _, ws := range []int{2, 4, 8} {
		for _, rows := range []int{1, 2, 4, 8, 16, 24, 32, 64, 128, 512} {
			for _, variant := range []string{"fused", "fused-direct", "fused-nonorm", "fused-oneshot", "fused-twoshot", "fused-push", "unfused", "allreduce"} {
				// allreduce: the pair's all-reduce alone, so that what the pair's norm kernel
				// adds to it (unfused less allreduce), the most fusing can save, is in the run
				fused := variant != "unfused" && variant != "allreduce"
				if variant == "fused-push" && !slices.Contains(fusedAlgos(dt, rows, hidden), collective.Push) {
					continue
				}
				b.Run(fmt.Sprintf("ws%d/rows%d/%s", ws, rows, variant), func(b *testing.B) {
					nbytes := rows * hidden * dt.Size()
					g := newFusedGroup(b, ws, collective.Options{Timeout: 50 * time.Millisecond}, max(nbytes, 1<<20))
					g.parallel(func(rb *rankBufs) error {
						bf := g.bufs[rb.comm.Rank()]
						bufs := []driver.DevicePtr{bf.in}
						if variant == "fused-direct" {
							bufs = append(bufs, bf.residual, bf.normOut)
						}
						for _, p := range bufs {
							if _, err := rb.comm.Register(context.Background(), p, uint64(max(nbytes, 1<<20))); err != nil {
								return err
							}
						}
						return nil
					})
					fc := newFusedCase(rand.New(rand.NewPCG(1, 2)), dt, ws, rows, hidden)
					g.upload(fc)
					streams := make([]*driver.Stream, ws)
					for r, rb := range g.ranks {
						streams[r] = rb.stream
					}
					// the variant's algorithm: Auto but where forced
					algo := map[string]collective.Algorithm{"fused-oneshot": collective.OneShot, "fused-twoshot": collective.TwoShot, "fused-push": collective.Push}[variant]
					if fused && algo == collective.Auto {
						// the harness's own capture: the outputs are shared where registered
						path, err := g.ranks[0].comm.FusedSelected(rows, hidden, dt, variant == "fused-direct")
						require.NoError(b, err)
						b.Logf("fused: %v", path)
					}
					f := newHarness(b, g.ranks[0].comm.Context(), g.ranks[0].stream, streams)
					x := f.capture(b, f.main, func() {
						f.forkJoinLayer(b, true, func(r int, s *driver.Stream) {
							c, bf := g.ranks[r].comm, g.bufs[r]
							if fused {
								require.NoError(b, c.AllReduceResidualRMSNormWith(s, g.args(r, fc, true, variant == "fused-nonorm"), algo))
								return
							}
							// the sum goes to residOut, which the in-place pair does not otherwise use
							require.NoError(b, c.AllReduce(s, bf.residOut, bf.in, rows*hidden, dt))
							if variant == "allreduce" {
								return
							}
							require.NoError(b, c.ResidualRMSNorm(s, collective.FusedArgs{NormOut: bf.normOut, ResidualOut: bf.residual,
								In: bf.residOut, Residual: bf.residual, Gamma: bf.gamma, Rows: rows, Hidden: hidden, Eps: fusedEps, DType: dt}))
						})
					})
					defer x.Close()
					require.NoError(b, x.Launch(f.main))
					g.syncAll(time.Minute)
					b.ResetTimer()
					require.NoError(b, f.start.Record(f.main))
					for range b.N {
						require.NoError(b, x.Launch(f.main))
					}
					require.NoError(b, f.end.Record(f.main))
					g.syncAll(time.Minute)
					d, err := driver.Elapsed(f.start, f.end)
					require.NoError(b, err)
					b.ReportMetric(float64(d)/float64(time.Microsecond)/float64(b.N*floorLayers), "us/layer")
				})
			}
		}
	}
}

// pushStep is one call of TestFusedPushInterleaved: a plain Push all-reduce of count bf16
// elements, or a fused Push call of rows rows of hidden elements (alias: "residual" for
// ResidualOut over Residual, "in" for ResidualOut over In).
type pushStep struct {
	fused        bool
	count        int
	rows, hidden int
	noNorm       bool
	alias        string
}

// elems is the step's element count: a fused call's rows*hidden, a plain one's count.
func (st pushStep) elems() int {
	if st.fused {
		return st.rows * st.hidden
	}
	return st.count
}

// pushStepBufs are one rank's buffers of one step, and its data.
type pushStepBufs struct {
	in, residual, residOut, normOut, gamma, out driver.DevicePtr
}

// TestFusedPushInterleaved: plain Push all-reduces and fused Push calls on one communicator,
// back to back on each rank's stream without a host sync in between (they share the receive
// buffers and the per-block parts; from 8 ranks on, a plain call of one vector per thread
// leaves its re-arm to the next call, fused or not), eager and then captured into one graph
// per rank and replayed twice on fresh data, at 2, 4, 8 and 16 virtual ranks; every result
// bitwise against internal/ref on every rank.
func TestFusedPushInterleaved(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(31, 32))
	dt := dtype.BFloat16
	steps := []pushStep{
		{count: 8192}, // 16 KiB: one vector per thread of the default push grid (deferred re-arm from 8 ranks)
		{fused: true, rows: 1, hidden: 8192, alias: "residual"}, // one row: block 0 receives, the others only send
		{count: 8192},
		{count: 2051}, // a partial last vector
		{fused: true, rows: 3, hidden: 2048},
		{fused: true, rows: 2, hidden: 5120, noNorm: true, alias: "in"},
		{count: 32768}, // 64 KiB
		{fused: true, rows: 20, hidden: 4096, alias: "residual"}, // more rows than push blocks
		{fused: true, rows: 1, hidden: 16384, alias: "in"},
		{count: 8192},
	}
	for _, ws := range []int{2, 4, 8, 16} {
		t.Run(fmt.Sprintf("ws%d", ws), func(t *testing.T) {
			g := newGroup(t, virtualRanks(ws), collective.Options{Timeout: 5 * time.Second, MaxBytes: 1 << 20}, 16)
			// The fused kernels load before the first all-reduce is in flight (LoadFused): a
			// rank's first fused call would otherwise load its module while the plain push
			// before it waits for the next rank.
			for _, rb := range g.ranks {
				require.NoError(t, rb.comm.LoadFused(dt))
			}
			bufs := make([][]pushStepBufs, ws)
			for r, rb := range g.ranks {
				alloc := cleanupAlloc(t, rb.comm.Context())
				for _, st := range steps {
					n := st.elems() * dt.Size()
					bufs[r] = append(bufs[r], pushStepBufs{in: alloc(n), residual: alloc(n), residOut: alloc(n), normOut: alloc(n),
						gamma: alloc(ptx.MaxHidden * 4), out: alloc(n)})
				}
			}
			args := func(r, i int) collective.FusedArgs {
				st, b := steps[i], bufs[r][i]
				a := collective.FusedArgs{NormOut: b.normOut, ResidualOut: b.residOut, In: b.in, Residual: b.residual, Gamma: b.gamma,
					Rows: st.rows, Hidden: st.hidden, Eps: fusedEps, DType: dt, NoNorm: st.noNorm}
				switch st.alias {
				case "residual":
					a.ResidualOut = a.Residual
				case "in":
					a.ResidualOut = a.In
				}
				return a
			}
			// issue enqueues every step on rank r's stream.
			issue := func(r int, s *driver.Stream) error {
				c := g.ranks[r].comm
				for i, st := range steps {
					var err error
					if st.fused {
						err = c.AllReduceResidualRMSNormWith(s, args(r, i), collective.Push)
					} else {
						err = c.AllReduceWith(s, bufs[r][i].out, bufs[r][i].in, st.count, dt, collective.Push)
					}
					if err != nil {
						return fmt.Errorf("step %d: %w", i, err)
					}
				}
				return nil
			}
			// upload writes fresh data for every step and poisons the outputs; check compares
			// every step's outputs with the reference.
			type stepData struct {
				inputs          [][]byte
				residual, gamma []byte
			}
			upload := func() []stepData {
				data := make([]stepData, len(steps))
				for i, st := range steps {
					n := st.elems()
					d := stepData{inputs: make([][]byte, ws), residual: ref.Activations(rng, dt, n, 4)}
					for r := range d.inputs {
						d.inputs[r] = ref.Activations(rng, dt, n, 1)
					}
					if st.fused {
						d.gamma = ref.Activations(rng, dt, st.hidden, 1.5)
					}
					data[i] = d
					for r, rb := range g.ranks {
						ctx, b := rb.comm.Context(), bufs[r][i]
						require.NoError(t, ctx.CopyHtoD(b.in, d.inputs[r]))
						for _, p := range []driver.DevicePtr{b.residOut, b.normOut, b.out} {
							require.NoError(t, ctx.MemsetD8(p, 0xFF, uint64(n*dt.Size())))
						}
						if st.fused {
							require.NoError(t, ctx.CopyHtoD(b.residual, d.residual))
							require.NoError(t, ctx.CopyHtoD(b.gamma, d.gamma))
						}
					}
				}
				return data
			}
			check := func(data []stepData, what string) {
				for i, st := range steps {
					d := data[i]
					type output struct {
						name string
						want []byte
						ptr  func(r int) driver.DevicePtr
					}
					var outs []output
					if st.fused {
						f := ref.Fused{DType: dt, Algo: ref.FusedPush, Hidden: st.hidden, Eps: fusedEps, NoNorm: st.noNorm,
							Threads: ptx.FusedThreads(st.hidden * dt.Size() / ptx.VectorBytes)}
						wantR, wantN, err := f.Run(d.inputs, d.residual, d.gamma)
						require.NoError(t, err)
						outs = append(outs, output{"ResidualOut", wantR, func(r int) driver.DevicePtr { return args(r, i).ResidualOut }})
						if !st.noNorm {
							outs = append(outs, output{"NormOut", wantN, func(r int) driver.DevicePtr { return bufs[r][i].normOut }})
						}
					} else {
						want, err := ref.Push(dt, d.inputs)
						require.NoError(t, err)
						outs = append(outs, output{"out", want, func(r int) driver.DevicePtr { return bufs[r][i].out }})
					}
					for r, rb := range g.ranks {
						for _, o := range outs {
							got := make([]byte, len(o.want))
							require.NoError(t, rb.comm.Context().CopyDtoH(got, o.ptr(r)))
							if n, first := ref.Compare(dt, o.want, got); n != 0 {
								t.Fatalf("%s: step %d (%+v): rank %d: %s: %d of %d elements wrong; first at %d: want %s, got %s", what, i, st, r,
									o.name, n, len(o.want)/dt.Size(), first.Index, ref.Format(dt, first.Want), ref.Format(dt, first.Got))
							}
						}
					}
				}
			}

			for round := range 2 {
				data := upload()
				for r, rb := range g.ranks {
					require.NoError(t, issue(r, rb.stream), "rank %d", r)
				}
				g.syncAll(30 * time.Second)
				check(data, fmt.Sprintf("eager round %d", round))
			}
			graphs := make([]*collective.Graph, ws)
			g.parallel(func(rb *rankBufs) error {
				r := rb.comm.Rank()
				var err error
				graphs[r], err = rb.comm.Capture(context.Background(), rb.stream, func() error { return issue(r, rb.stream) })
				return err
			})
			for replay := range 2 {
				data := upload()
				for r, rb := range g.ranks {
					require.NoError(t, graphs[r].Launch(rb.stream))
				}
				g.syncAll(30 * time.Second)
				check(data, fmt.Sprintf("graph replay %d", replay))
			}
			for _, x := range graphs {
				require.NoError(t, x.Close())
			}
			// and eager again after the graphs: the parts stayed in step
			data := upload()
			for r, rb := range g.ranks {
				require.NoError(t, issue(r, rb.stream), "rank %d", r)
			}
			g.syncAll(30 * time.Second)
			check(data, "eager after the graphs")
		})
	}
}

// TestFusedPushCallMismatch: one rank makes a fused Push call, its peer a plain Push
// all-reduce of the same bytes: both kernels record ErrCallMismatch naming both calls (the
// call headers differ), in well under the timeout.
func TestFusedPushCallMismatch(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(33, 34))
	const timeout = 3 * time.Second
	g := newFusedGroup(t, 2, collective.Options{Timeout: timeout}, 1<<20)
	for _, rb := range g.ranks {
		require.NoError(t, rb.comm.LoadFused(dtype.BFloat16))
	}
	fc := newFusedCase(rng, dtype.BFloat16, 2, 1, 8192)
	g.upload(fc)
	fused := ptx.FusedCall(ptx.Push, dtype.BFloat16, 1, 8192, false)
	plain := ptx.Call{Op: ptx.OpAllReduce, Algo: ptx.Push, DType: dtype.BFloat16, Count: 8192}
	r0, r1 := g.ranks[0], g.ranks[1]
	require.NoError(t, r0.comm.AllReduceResidualRMSNormWith(r0.stream, g.args(0, fc, true, false), collective.Push))
	require.NoError(t, r1.comm.AllReduceWith(r1.stream, g.bufs[1].residOut, g.bufs[1].in, 8192, dtype.BFloat16, collective.Push))
	start := time.Now()
	wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, rb := range g.ranks {
		require.NoError(t, rb.stream.Wait(wctx))
	}
	assert.Less(t, time.Since(start), timeout, "a mismatch is seen in the headers, not by a timeout")
	for r, want := range []struct{ mine, theirs ptx.Call }{{fused, plain}, {plain, fused}} {
		err := g.ranks[r].comm.Err()
		require.ErrorIs(t, err, collective.ErrCallMismatch, "rank %d", r)
		var ke *collective.KernelError
		require.ErrorAs(t, err, &ke)
		assert.Equal(t, r, ke.Rank)
		assert.Equal(t, 1-r, ke.Peer)
		assert.Equal(t, ptx.PhasePush, ke.Phase)
		assert.Equal(t, want.mine, ke.Mine, "rank %d", r)
		assert.Equal(t, want.theirs, ke.Theirs, "rank %d", r)
		t.Logf("rank %d: %v", r, err)
	}
}

// runFusedNCCL checks the fused call's NCCL route on comm, one of size ranks that NCCL alone
// serves (every call goes to it): bf16, f16 and f32, rows 1, 7 and 600 (past the default
// MaxBytes), in place over Residual (the sum goes through NormOut), out of place, ResidualOut
// == In, and NoNorm out of place, each bitwise against internal/ref; In stays the caller's
// unless it is ResidualOut. The inputs are small integers, whose sums are exact in any order,
// so NCCL's sum (rounded to the element type before the residual add) is the reference's. A
// NoNorm call in place over Residual has no buffer for NCCL's sum here: refused.
func runFusedNCCL(t *testing.T, comm *collective.Comm, rank, size int) {
	t.Helper()
	got, err := comm.FusedSelected(1, 8192, dtype.BFloat16, false)
	require.NoError(t, err)
	require.Equal(t, collective.NCCL, got)
	dev := comm.Context()
	stream, err := dev.NewStream()
	require.NoError(t, err)
	defer stream.Close()
	const capacity = 16 << 20
	alloc := func() driver.DevicePtr {
		p, err := dev.Alloc(capacity)
		require.NoError(t, err)
		t.Cleanup(func() { dev.Free(p) })
		return p
	}
	in, residual, residOut, normOut, gamma := alloc(), alloc(), alloc(), alloc(), alloc()
	wait := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, stream.Wait(ctx))
		require.NoError(t, comm.Err())
	}
	compare := func(dt dtype.DType, want []byte, ptr driver.DevicePtr, what string) {
		got := make([]byte, len(want))
		require.NoError(t, dev.CopyDtoH(got, ptr))
		if n, first := ref.Compare(dt, want, got); n != 0 {
			t.Fatalf("rank %d: %s: %d of %d elements wrong; first at %d: want %s, got %s", rank, what, n, len(want)/dt.Size(),
				first.Index, ref.Format(dt, first.Want), ref.Format(dt, first.Got))
		}
	}
	for _, dt := range dtype.All {
		hidden := 8192
		if dt == dtype.Float32 {
			hidden = 4096
		}
		for _, rows := range []int{1, 7, 600} {
			n := rows * hidden
			inputs := make([][]byte, size)
			for r := range inputs {
				inputs[r] = smallIntegers(rand.New(rand.NewPCG(uint64(r), uint64(n))), dt, n)
			}
			seeded := rand.New(rand.NewPCG(uint64(n), 7))
			res, gam := ref.Activations(seeded, dt, n, 4), ref.Activations(seeded, dt, hidden, 1.5)
			f := ref.Fused{DType: dt, Algo: ref.FusedOneShot, Hidden: hidden, Eps: fusedEps,
				Threads: ptx.FusedThreads(hidden * dt.Size() / ptx.VectorBytes)}
			wantR, wantN, err := f.Run(inputs, res, gam)
			require.NoError(t, err)
			for _, alias := range []string{"in place", "out of place", "In is ResidualOut", "NoNorm out of place"} {
				what := fmt.Sprintf("%v rows %d %s", dt, rows, alias)
				require.NoError(t, dev.CopyHtoD(in, inputs[rank]))
				require.NoError(t, dev.CopyHtoD(residual, res))
				require.NoError(t, dev.CopyHtoD(gamma, gam))
				require.NoError(t, dev.MemsetD8(residOut, 0xFF, uint64(len(res))))
				require.NoError(t, dev.MemsetD8(normOut, 0xFF, uint64(len(res))))
				a := collective.FusedArgs{NormOut: normOut, ResidualOut: residOut, In: in, Residual: residual, Gamma: gamma,
					Rows: rows, Hidden: hidden, Eps: fusedEps, DType: dt}
				switch alias {
				case "in place":
					a.ResidualOut = residual
				case "In is ResidualOut":
					a.ResidualOut = in
				case "NoNorm out of place":
					a.NoNorm = true
				}
				require.NoError(t, comm.AllReduceResidualRMSNorm(stream, a), what)
				wait()
				compare(dt, wantR, a.ResidualOut, what+": ResidualOut")
				if !a.NoNorm {
					compare(dt, wantN, normOut, what+": NormOut")
				}
				if a.ResidualOut != in {
					compare(dt, inputs[rank], in, what+": In unchanged")
				}
			}
			a := collective.FusedArgs{ResidualOut: residual, In: in, Residual: residual, Rows: rows, Hidden: hidden, DType: dt, NoNorm: true}
			err = comm.AllReduceResidualRMSNorm(stream, a)
			require.ErrorIs(t, err, collective.ErrInvalidArgument)
			require.ErrorContains(t, err, "pass a ResidualOut of its own")
		}
	}
}

// TestFusedNCCLOneRank: a communicator of one rank (no kernels, NCCL serves every call) takes
// the fused call through NCCL; see runFusedNCCL. About 5 s.
func TestFusedNCCLOneRank(t *testing.T) {
	requireNCCL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	boots, err := bootstrap.NewInProcess(1)
	require.NoError(t, err)
	comm, err := collective.New(ctx, 0, boots[0], collective.Options{NCCL: collective.NCCLAlways, Timeout: 10 * time.Second})
	require.NoError(t, err)
	defer comm.Close()
	runFusedNCCL(t, comm, 0, 1)
}

// Fused NCCL job children: their rank in GOCCL_FUSED_NCCL_RANK.
const envFusedNCCLRank = "GOCCL_FUSED_NCCL_RANK"

// TestFusedNCCLMultiNode runs 2 processes on GPU 0 as if on two hosts (each its own
// NCCL_HOSTID, NCCL over its socket transport on lo), so that NCCL alone serves them, and
// checks the fused call's NCCL route in each (runFusedNCCL). About 10 s.
func TestFusedNCCLMultiNode(t *testing.T) {
	requireNCCL(t)
	const procs = 2
	cmds, outs := startNCCLHosts(t, "TestFusedNCCLChild", procs, 3*time.Minute, func(r int) []string {
		return []string{envFusedNCCLRank + "=" + strconv.Itoa(r)}
	})
	for r, c := range cmds {
		require.NoError(t, c.Wait(), "rank %d failed:\n%s", r, outs[r])
		require.Contains(t, outs[r].String(), "fused nccl rank ok", "rank %d:\n%s", r, outs[r])
	}
}

// TestFusedNCCLChild is one rank of TestFusedNCCLMultiNode; it does nothing unless started
// by it.
func TestFusedNCCLChild(t *testing.T) {
	rankStr := os.Getenv(envFusedNCCLRank)
	if rankStr == "" {
		t.Skip("run by TestFusedNCCLMultiNode")
	}
	rank, _ := strconv.Atoi(rankStr)
	size, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	boot, err := bootstrap.FromEnv(ctx)
	require.NoError(t, err)
	comm, err := collective.New(ctx, 0, boot, collective.Options{NCCL: collective.NCCLAlways, Timeout: 10 * time.Second})
	require.NoError(t, err)
	defer comm.Close()
	runFusedNCCL(t, comm, rank, size)
	fmt.Println("fused nccl rank ok")
}

// TestFusedNCCLTwoGPUs: with goccl's kernels and NCCL on two GPUs, the fused call goes to NCCL
// past MaxBytes (Auto) or when forced, and to the kernels below; a forced NCCL NoNorm call in
// place over Residual leaves NCCL's sum in the staging buffer. Integer inputs: every route
// bitwise against its reference. Needs two GPUs (and libnccl).
func TestFusedNCCLTwoGPUs(t *testing.T) {
	gputest.RequireDevices(t, 2)
	if err := nccl.Load(); err != nil {
		t.Skipf("no usable libnccl: %v", err)
	}
	const maxBytes = 1 << 20
	g := newFusedGroupOn(t, []int{0, 1}, collective.Options{Timeout: 10 * time.Second, NCCL: collective.NCCLAlways, MaxBytes: maxBytes}, 2*maxBytes)
	dt, hidden := dtype.BFloat16, 8192
	engines := g.ranks[0].comm.Engines()
	t.Logf("engines: %+v", engines)
	for _, tc := range []struct {
		rows   int
		algo   collective.Algorithm
		noNorm bool
		want   collective.Algorithm
	}{
		{1, collective.Auto, false, collective.OneShot},
		{65, collective.Auto, false, collective.NCCL}, // 1040 KiB, past MaxBytes
		{8, collective.NCCL, false, collective.NCCL},
		{8, collective.NCCL, true, collective.NCCL},  // NoNorm in place: the staging buffer
		{65, collective.Auto, true, collective.NCCL}, // NoNorm in place past MaxBytes: refused
	} {
		what := fmt.Sprintf("%d rows %v NoNorm %v", tc.rows, tc.algo, tc.noNorm)
		if !engines.Kernels {
			// the GPUs are not eligible for the kernels: NCCL serves everything
			tc.want = collective.NCCL
		}
		path := tc.algo
		if path == collective.Auto {
			var err error
			path, err = g.ranks[0].comm.FusedSelected(tc.rows, hidden, dt, false)
			require.NoError(t, err)
		}
		require.Equal(t, tc.want, path, what)
		n := tc.rows * hidden
		fc := &fusedCase{dt: dt, rows: tc.rows, hidden: hidden, inputs: make([][]byte, 2)}
		for r := range fc.inputs {
			fc.inputs[r] = smallIntegers(rand.New(rand.NewPCG(uint64(r), uint64(n))), dt, n)
		}
		seeded := rand.New(rand.NewPCG(uint64(n), 9))
		fc.residual, fc.gamma = ref.Activations(seeded, dt, n, 4), ref.Activations(seeded, dt, hidden, 1.5)
		// NCCL's exact integer sums are the one-shot reference's
		wantR, wantN := fc.want(t, collective.OneShot, tc.noNorm)
		g.upload(fc)
		if tc.noNorm && path == collective.NCCL && (!engines.Kernels || n*dt.Size() > maxBytes) {
			// no staging buffer for NCCL's sum: refused, on every rank alike
			g.parallel(func(rb *rankBufs) error {
				err := rb.comm.AllReduceResidualRMSNormWith(rb.stream, g.args(rb.comm.Rank(), fc, true, true), tc.algo)
				if !errors.Is(err, collective.ErrInvalidArgument) || !strings.Contains(err.Error(), "pass a ResidualOut of its own") {
					return fmt.Errorf("%s: want the refusal, got %v", what, err)
				}
				return nil
			})
			continue
		}
		g.parallel(func(rb *rankBufs) error {
			return rb.comm.AllReduceResidualRMSNormWith(rb.stream, g.args(rb.comm.Rank(), fc, true, tc.noNorm), tc.algo)
		})
		g.syncAll(time.Minute)
		g.checkFused(fc, wantR, wantN, true, what)
	}
}
