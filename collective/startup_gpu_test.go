package collective_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/driver"
)

// startupGroup creates and closes a group of ws virtual ranks on GPU 0 and returns the
// ranks' start-up profiles and how long NewGroup took.
func startupGroup(t testing.TB, ws int, opts collective.Options) ([]collective.StartupProfile, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	comms, err := collective.NewGroup(ctx, virtualRanks(ws), opts)
	took := time.Since(start)
	require.NoError(t, err)
	profiles := make([]collective.StartupProfile, ws)
	for r, c := range comms {
		profiles[r] = c.Startup()
		require.NoError(t, c.Close())
	}
	return profiles, took
}

// startupReport renders the profiles of one NewGroup: for each step, the slowest rank and
// the mean over ranks; each rank's total and kernel sources; then the full profile of the
// rank that compiled the most kernels (the one whose steps show the JIT).
func startupReport(profiles []collective.StartupProfile, took time.Duration) string {
	var b strings.Builder
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	fmt.Fprintf(&b, "NewGroup of %d ranks: %.2f ms\n", len(profiles), ms(took))
	var phases []collective.StartupPhase
	seen := map[collective.StartupPhase]bool{}
	for _, p := range profiles {
		for _, s := range p.Steps {
			if !seen[s.Phase] {
				seen[s.Phase] = true
				phases = append(phases, s.Phase)
			}
		}
	}
	fmt.Fprintf(&b, "  %-16s %10s %10s\n", "step (ms)", "slowest", "mean")
	for _, ph := range phases {
		var most, sum time.Duration
		for _, p := range profiles {
			d := p.Phase(ph)
			most, sum = max(most, d), sum+d
		}
		fmt.Fprintf(&b, "  %-16s %10.2f %10.2f\n", ph, ms(most), ms(sum/time.Duration(len(profiles))))
	}
	compiler := 0
	for r, p := range profiles {
		fmt.Fprintf(&b, "  rank %2d: total %8.2f ms, kernels %8.2f ms: %d compiled, %d shared, %d cached\n", r, ms(p.Total),
			ms(p.Phase(collective.StartupKernels)), p.Count(collective.KernelCompiled), p.Count(collective.KernelShared), p.Count(collective.KernelCached))
		if p.Count(collective.KernelCompiled) > profiles[compiler].Count(collective.KernelCompiled) {
			compiler = r
		}
	}
	fmt.Fprintf(&b, "rank %d:\n%s", compiler, profiles[compiler])
	return b.String()
}

// TestStartupProfile prints where the time of NewGroup goes (Comm.Startup), for 8 virtual
// ranks, first with no kernel loaded in the process and then again, and the same for 2 and
// 4 ranks. The first of each world size compiles each of its nine kernels once (one rank
// compiles, the others wait for it); the second finds them all loaded. It also reports the
// device memory that the loaded kernels keep after every communicator closed, and that
// UnloadKernels gives it back. Run it alone in its process, and with CUDA_CACHE_DISABLE=1 for
// a cold JIT (the driver's on-disk cache otherwise serves kernels an earlier run compiled).
func TestStartupProfile(t *testing.T) {
	requireGPU(t)
	require.NoError(t, collective.UnloadKernels(), "start with no kernel loaded")
	dev, err := driver.PrimaryContext(0)
	require.NoError(t, err)
	defer dev.Close()
	free := func() uint64 {
		f, _, err := dev.MemInfo()
		require.NoError(t, err)
		return f
	}
	t.Logf("CUDA_CACHE_DISABLE=%q", os.Getenv("CUDA_CACHE_DISABLE"))
	free0 := free()
	for _, ws := range []int{8, 2, 4} {
		for run := 1; run <= 2; run++ {
			profiles, took := startupGroup(t, ws, collective.Options{})
			t.Logf("%d ranks, NewGroup %d in this process:\n%s", ws, run, startupReport(profiles, took))
			compiled := 0
			for r, p := range profiles {
				require.Len(t, p.Kernels, 9, "rank %d: kernels of one scope", r)
				compiled += p.Count(collective.KernelCompiled)
				if run == 2 {
					assert.Equal(t, 9, p.Count(collective.KernelCached), "rank %d: the second NewGroup compiles nothing", r)
				}
				for _, ph := range []collective.StartupPhase{collective.StartupDriver, collective.StartupContext, collective.StartupKernels,
					collective.StartupArena, collective.StartupExchangeFacts, collective.StartupBarrier} {
					assert.True(t, hasStep(p, ph), "rank %d: no %q step", r, ph)
				}
				assert.LessOrEqual(t, p.Phase(collective.StartupKernels), p.Total, "rank %d", r)
			}
			if run == 1 {
				assert.Equal(t, 9, compiled, "%d ranks: each kernel compiled once in the process", ws)
			}
		}
	}
	kept := free()
	require.NoError(t, collective.UnloadKernels())
	after := free()
	t.Logf("device memory: %d MiB free before, %d MiB with the kernels of 2, 4 and 8 ranks kept loaded (%.1f MiB), %d MiB after UnloadKernels",
		free0>>20, kept>>20, float64(int64(free0)-int64(kept))/(1<<20), after>>20)
}

func hasStep(p collective.StartupProfile, ph collective.StartupPhase) bool {
	for _, s := range p.Steps {
		if s.Phase == ph {
			return true
		}
	}
	return false
}

// TestUnloadKernelsLeaks creates a group, closes it and unloads the kernels, 10 times: device
// memory must return to its level after the first round. Without UnloadKernels freeing the
// modules, every round would leave nine more loaded.
func TestUnloadKernelsLeaks(t *testing.T) {
	requireGPU(t)
	dev, err := driver.PrimaryContext(0)
	require.NoError(t, err)
	defer dev.Close()
	round := func() {
		startupGroup(t, 2, collective.Options{})
		require.NoError(t, collective.UnloadKernels())
	}
	requireNoDeviceLeak(t, dev, 10, round)
}

// BenchmarkNewGroup measures a NewGroup and Close of 2 and 8 virtual ranks: "cached" with
// the kernels loaded by an earlier round (what every NewGroup after the first costs),
// "unloaded" with UnloadKernels after each round, so that every NewGroup loads its kernels
// again (from the driver's on-disk cache unless CUDA_CACHE_DISABLE=1).
func BenchmarkNewGroup(b *testing.B) {
	requireGPU(b)
	for _, ws := range []int{2, 8} {
		for _, unload := range []bool{false, true} {
			name := fmt.Sprintf("ws%d/cached", ws)
			if unload {
				name = fmt.Sprintf("ws%d/unloaded", ws)
			}
			b.Run(name, func(b *testing.B) {
				startupGroup(b, ws, collective.Options{}) // warm
				for b.Loop() {
					if unload {
						require.NoError(b, collective.UnloadKernels())
					}
					startupGroup(b, ws, collective.Options{})
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/group")
			})
		}
	}
}
