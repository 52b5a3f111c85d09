package collective

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/ptx"
)

// requireGPUHere is the external tests' requireGPU for the internal ones: skip without a
// driver or device, unless GOCCL_REQUIRE_GPU=1 demands one; fail on any other error.
func requireGPUHere(tb testing.TB) {
	tb.Helper()
	if err := driver.Init(); err != nil {
		if os.Getenv("GOCCL_REQUIRE_GPU") == "1" || !(errors.Is(err, driver.ErrNoDriver) || errors.Is(err, driver.ErrNoDevice)) {
			tb.Fatal(err)
		}
		tb.Skipf("no GPU: %v", err)
	}
}

// BenchmarkAllReduceLaunchOnly is the baseline of BenchmarkAllReduceHost (in the external
// tests): the same kernel, launched with the same arguments on the same two virtual ranks'
// streams, through driver.Launch alone. The difference between the two is what AllReduce
// itself costs above the driver launch (lock, checks, argument packing).
func BenchmarkAllReduceLaunchOnly(b *testing.B) {
	requireGPUHere(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms, err := NewGroup(ctx, []int{0, 0}, Options{Algorithm: Push})
	if err != nil {
		b.Fatal(err)
	}
	const count = 8 << 10 // 16 KiB of bf16, as BenchmarkAllReduceHost
	streams := make([]*driver.Stream, len(comms))
	bufs := make([]driver.DevicePtr, len(comms))
	for r, c := range comms {
		if streams[r], err = c.Context().NewStream(); err != nil {
			b.Fatal(err)
		}
		if bufs[r], err = c.Context().Alloc(2 * count); err != nil {
			b.Fatal(err)
		}
	}
	// wait bounds every wait for the GPU: a stuck kernel fails the benchmark, never hangs it.
	wait := func() {
		wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, s := range streams {
			if err := s.Wait(wctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	defer func() {
		wait()
		for r, c := range comms {
			streams[r].Close()
			c.Context().Free(bufs[r])
			c.Close()
		}
	}()
	// One real call per rank packs the arguments; the loop relaunches them as they are.
	for r, c := range comms {
		if err := c.AllReduce(streams[r], bufs[r], bufs[r], count, dtype.BFloat16); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		for r, c := range comms {
			if err := driver.Launch(streams[r], c.kernels.fn[c.scope][Push][dtype.BFloat16], &c.cfg, &c.args); err != nil {
				b.Fatal(err)
			}
		}
		if i%64 == 63 {
			b.StopTimer()
			wait()
			b.StartTimer()
		}
	}
	b.StopTimer()
	wait()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/call")
	for _, c := range comms {
		if err := c.Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBarrierScope checks which kernels a communicator launches: ranks that all run on one
// GPU get GPU-scope barriers unless Options.SystemScope asks otherwise.
func TestBarrierScope(t *testing.T) {
	requireGPUHere(t)
	for _, systemScope := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		comms, err := NewGroup(ctx, []int{0, 0, 0}, Options{SystemScope: systemScope})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		want := ptx.ScopeGPU
		if systemScope {
			want = ptx.ScopeSystem
		}
		for _, c := range comms {
			if c.scope != want {
				t.Errorf("SystemScope=%v: rank %d uses %v barriers, want %v", systemScope, c.rank, c.scope, want)
			}
			// PDL is safe with every rank on one GPU, whatever the scope (FlagEarlyTrigger)
			if wantPDL := c.major >= 9 && driver.Has(driver.FeatureLaunchEx); c.pdl != wantPDL {
				t.Errorf("SystemScope=%v: rank %d on sm_%d0: PDL %v, want %v", systemScope, c.rank, c.major, c.pdl, wantPDL)
			}
			// the barrier kernels follow the scope; push has no barrier and one kernel for both
			for algo, scope := range map[Algorithm]ptx.Scope{OneShot: want, TwoShot: want, Push: ptx.ScopeSystem} {
				spec := ptx.Spec{Algo: algo, DType: dtype.BFloat16, WorldSize: 3, Scope: scope}
				if name := c.kernels.fn[c.scope][algo][dtype.BFloat16].Name(); name != spec.EntryName() {
					t.Errorf("SystemScope=%v: rank %d launches %s for %v, want %s", systemScope, c.rank, name, algo, spec.EntryName())
				}
			}
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		}
	}
}
