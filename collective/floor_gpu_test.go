package collective_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/ptx"
)

const emptyKernelPTX = `
.version 7.8
.target sm_80
.address_size 64
.visible .entry goccl_floor_empty()
{
	ret;
}
`

// pdlFloorPTX holds the floor's empty kernels for PDL launches (sm_90): goccl_floor_pdl waits
// for its predecessor and lets its dependents launch when it exits, as goccl's kernels do
// without ptx.FlagEarlyTrigger; goccl_floor_pdl_early lets them launch first thing, as they
// do with it.
const pdlFloorPTX = `
.version 7.8
.target sm_90
.address_size 64
.visible .entry goccl_floor_pdl()
{
	griddepcontrol.wait;
	ret;
}
.visible .entry goccl_floor_pdl_early()
{
	griddepcontrol.launch_dependents;
	griddepcontrol.wait;
	ret;
}
`

// BenchmarkGraphForkJoinFloor measures the harnesses of the graph benchmarks without any
// all-reduce, with empty kernels: whatever an all-reduce costs above this is its own.
//
//   - fork-main: one graph of 200 layers, each an event fork from a stream of its own to ws
//     rank streams, one kernel per rank stream and a join back;
//   - fork-rank0: the same with rank 0's kernel on the main stream (ws-1 forks per layer):
//     the fork/join harness, "a fork from stream 0 to every rank's stream";
//   - per-rank: one graph of 200 kernels per rank stream, as every process of a real job
//     captures its own (what arsmoke -g does); the time runs from an event before all of them
//     to the join after.
//
// On sm_90, fork-rank0-pdl and fork-rank0-pdl-early are fork-rank0 with every kernel launched
// with PDL (driver.LaunchEx), the kernels of pdlFloorPTX: what PDL can take off the harness.
func BenchmarkGraphForkJoinFloor(b *testing.B) {
	requireGPU(b)
	dev, err := driver.GetDevice(0)
	require.NoError(b, err)
	c, err := driver.PrimaryContext(dev)
	require.NoError(b, err)
	defer c.Close()
	mod, err := c.LoadModule("goccl_floor_empty", []byte(emptyKernelPTX))
	require.NoError(b, err)
	defer mod.Close()
	fn, err := mod.Function("goccl_floor_empty")
	require.NoError(b, err)
	harnesses := []string{"fork-main", "fork-rank0", "per-rank"}
	pdlFn := map[string]*driver.Function{}
	if major, _, err := dev.ComputeCapability(); err == nil && major >= 9 && driver.Has(driver.FeatureLaunchEx) {
		pdlMod, err := c.LoadModule("goccl_floor_pdl", []byte(pdlFloorPTX))
		require.NoError(b, err)
		defer pdlMod.Close()
		for _, h := range [][2]string{{"fork-rank0-pdl", "goccl_floor_pdl"}, {"fork-rank0-pdl-early", "goccl_floor_pdl_early"}} {
			pdlFn[h[0]], err = pdlMod.Function(h[1])
			require.NoError(b, err)
			harnesses = append(harnesses, h[0])
		}
	}
	for _, harness := range harnesses {
		for _, ws := range []int{2, 4, 8} {
			b.Run(fmt.Sprintf("%s/ws%d", harness, ws), func(b *testing.B) {
				f := newFloor(b, c, ws)
				var graphs []*driver.GraphExec
				switch harness {
				case "per-rank":
					for _, s := range f.streams {
						graphs = append(graphs, f.capture(b, s, func() { f.launch(b, s, fn, false) }))
					}
				case "fork-rank0-pdl", "fork-rank0-pdl-early":
					graphs = append(graphs, f.capture(b, f.main, func() {
						f.forkJoinLayer(b, true, func(_ int, s *driver.Stream) { f.launch(b, s, pdlFn[harness], true) })
					}))
				default:
					rank0 := harness == "fork-rank0"
					graphs = append(graphs, f.capture(b, f.main, func() {
						f.forkJoinLayer(b, rank0, func(_ int, s *driver.Stream) { f.launch(b, s, fn, false) })
					}))
				}
				defer func() {
					for _, g := range graphs {
						g.Close()
					}
				}()
				run := func() {
					if len(graphs) == 1 {
						require.NoError(b, graphs[0].Launch(f.main))
						return
					}
					f.fork(b, false)
					for r, g := range graphs {
						require.NoError(b, g.Launch(f.streams[r]))
					}
					f.join(b, false)
				}
				run()
				require.NoError(b, f.main.Synchronize())
				b.ResetTimer()
				require.NoError(b, f.start.Record(f.main))
				for range b.N {
					run()
				}
				require.NoError(b, f.end.Record(f.main))
				require.NoError(b, f.main.Synchronize())
				d, err := driver.Elapsed(f.start, f.end)
				require.NoError(b, err)
				b.ReportMetric(float64(d)/float64(time.Microsecond)/float64(b.N*floorLayers), "us/layer")
			})
		}
	}
}

const floorLayers = 200

// floor holds the streams and events of one harness.
type floor struct {
	main       *driver.Stream
	streams    []*driver.Stream
	forkEv     *driver.Event
	joins      []*driver.Event
	start, end *driver.Event
}

// newFloor makes a harness of a main stream and ws rank streams of its own.
func newFloor(b *testing.B, c *driver.Context, ws int) *floor {
	newStream := func() *driver.Stream {
		s, err := c.NewStream()
		require.NoError(b, err)
		b.Cleanup(func() { s.Close() })
		return s
	}
	main := newStream()
	streams := make([]*driver.Stream, ws)
	for r := range streams {
		streams[r] = newStream()
	}
	return newHarness(b, c, main, streams)
}

// newHarness makes the events of a harness over main and the rank streams.
func newHarness(b *testing.B, c *driver.Context, main *driver.Stream, streams []*driver.Stream) *floor {
	f := floor{main: main, streams: streams}
	newEvent := func(timing bool) *driver.Event {
		ev, err := c.NewEvent(timing)
		require.NoError(b, err)
		b.Cleanup(func() { ev.Close() })
		return ev
	}
	f.forkEv, f.start, f.end = newEvent(false), newEvent(true), newEvent(true)
	for range streams {
		f.joins = append(f.joins, newEvent(false))
	}
	return &f
}

// capture records floorLayers calls of layer on s into a graph.
func (f *floor) capture(b *testing.B, s *driver.Stream, layer func()) *driver.GraphExec {
	require.NoError(b, s.BeginCapture(driver.CaptureRelaxed))
	for range floorLayers {
		layer()
	}
	g, err := s.EndCapture()
	require.NoError(b, err)
	x, err := g.Instantiate()
	require.NoError(b, err)
	require.NoError(b, g.Close())
	return x
}

// launch queues one empty kernel of the floor on s, with PDL or without.
func (f *floor) launch(b *testing.B, s *driver.Stream, fn *driver.Function, pdl bool) {
	var args driver.Args
	cfg := driver.LaunchConfig{Grid: [3]uint32{2, 1, 1}, Block: [3]uint32{512, 1, 1}}
	if pdl {
		require.NoError(b, driver.LaunchEx(s, fn, &cfg, &args, true))
		return
	}
	require.NoError(b, driver.Launch(s, fn, &cfg, &args))
}

// fork makes the rank streams (all, or all but the first with skipRank0) wait for main.
func (f *floor) fork(b *testing.B, skipRank0 bool) {
	require.NoError(b, f.forkEv.Record(f.main))
	for r, s := range f.streams {
		if r > 0 || !skipRank0 {
			require.NoError(b, s.WaitEvent(f.forkEv))
		}
	}
}

// join makes main wait for every rank stream (all, or all but the first with skipRank0).
func (f *floor) join(b *testing.B, skipRank0 bool) {
	for r, s := range f.streams {
		if r > 0 || !skipRank0 {
			require.NoError(b, f.joins[r].Record(s))
			require.NoError(b, f.main.WaitEvent(f.joins[r]))
		}
	}
}

// forkJoinLayer is one layer of the fork/join harness: launch(r, s) enqueues rank r's work on
// s, its stream, or main for rank 0 with rank0.
func (f *floor) forkJoinLayer(b *testing.B, rank0 bool, launch func(r int, s *driver.Stream)) {
	f.fork(b, rank0)
	for r, s := range f.streams {
		if r == 0 && rank0 {
			s = f.main
		}
		launch(r, s)
	}
	f.join(b, rank0)
}

// BenchmarkAllReduceForkJoin runs the fork/join harness with real all-reduces: one CUDA graph of
// 200 layers, each an event fork from stream 0 (rank 0's stream) to the other ranks' streams,
// one bf16 all-reduce per rank (registered input, out of place) and a join back. Compare it
// with BenchmarkGraphForkJoinFloor/fork-rank0, the same graph with empty kernels, and with
// arsmoke -g, which replays one graph per rank instead. Besides the three algorithms as the
// reference runs them (output not shared), twoshot-direct registers the outputs too, and
// twoshot-direct-512 fixes 512-thread blocks (Options.ThreadsPerBlock) where the default
// spreads a small shard over smaller ones; push-8blocks and push-32blocks change push's fixed
// grid (Options.PushBlocks, default 16); the -nopdl variants launch without PDL
// (Options.DisablePDL).
//
// The graph executor does not promise to run the kernels of one layer at once; if it does
// not, the barrier waits for a kernel queued behind it until the watchdog (50 ms here) fires,
// and the benchmark fails saying so.
func BenchmarkAllReduceForkJoin(b *testing.B) {
	requireGPU(b)
	type variant struct {
		name           string
		algo           collective.Algorithm
		threads        int
		pushBlocks     int
		registerOutput bool
		noPDL          bool
	}
	variants := []variant{
		{name: "oneshot", algo: collective.OneShot},
		{name: "twoshot", algo: collective.TwoShot},
		{name: "twoshot-direct", algo: collective.TwoShot, registerOutput: true},
		{name: "twoshot-direct-512", algo: collective.TwoShot, threads: 512, registerOutput: true},
		{name: "push", algo: collective.Push},
		// other fixed grids for push (default 16 blocks), at 16 KiB only
		{name: "push-8blocks", algo: collective.Push, pushBlocks: 8},
		{name: "push-32blocks", algo: collective.Push, pushBlocks: 32},
		// without PDL (the default on sm_90)
		{name: "oneshot-nopdl", algo: collective.OneShot, noPDL: true},
		{name: "twoshot-direct-nopdl", algo: collective.TwoShot, registerOutput: true, noPDL: true},
		{name: "push-nopdl", algo: collective.Push, noPDL: true},
	}
	for _, ws := range []int{2, 4, 8} {
		for _, v := range variants {
			for _, nbytes := range []int{16 << 10, 256 << 10, 1 << 20, 8 << 20} {
				// Push is for small messages (its receive buffers grow with the size); its
				// other grids are compared where it is used, at 16 KiB.
				if v.algo == collective.Push && nbytes > 1<<20 || v.pushBlocks != 0 && nbytes > 16<<10 {
					continue
				}
				b.Run(fmt.Sprintf("ws%d/%s/%s", ws, v.name, sizeName(nbytes)), func(b *testing.B) {
					opts := collective.Options{Algorithm: v.algo, MaxBytes: int64(nbytes), PushMaxBytes: int64(nbytes),
						ThreadsPerBlock: v.threads, PushBlocks: v.pushBlocks, DisablePDL: v.noPDL, Timeout: 50 * time.Millisecond}
					benchForkJoin(b, ws, opts, nbytes, v.registerOutput, false)
				})
			}
		}
	}
}

// BenchmarkAllReduceGrid measures the points of the performance target (2, 4 and 8 ranks;
// 16 KiB, 256 KiB, 1 MiB, 8 MiB) in the fork/join harness for each algorithm that may serve
// them (the two-shot direct, its outputs registered, and through tmp), with the default grid
// and with Options.Blocks = ptx.MaxBlocks (push: Options.PushBlocks; capped by occupancy like
// any grid when ranks share a GPU), at GPU scope (the default with
// every rank on one GPU) and at system scope (Options.SystemScope: the barriers of ranks on
// different GPUs), "sys" counting arrivals as GPUs with native atomics on each other's memory
// do (NVLink), "sysflags" with round-number flags as GPUs without do (Options.FlagBarriers,
// PCIe). Compare it with BenchmarkGraphForkJoinFloor/fork-rank0 of the same run.
func BenchmarkAllReduceGrid(b *testing.B) {
	requireGPU(b)
	type variant struct {
		name                    string
		algo                    collective.Algorithm
		registerOutput, inPlace bool
	}
	variants := []variant{{"oneshot", collective.OneShot, false, false}, {"twoshot-direct", collective.TwoShot, true, false},
		{"twoshot-tmp", collective.TwoShot, false, false}, {"push", collective.Push, false, false},
		// in place: the input, registered, is the output too, so the two-shot writes it directly
		// (and the ranks' buffers are half the out-of-place footprint)
		{"twoshot-inplace", collective.TwoShot, false, true}, {"oneshot-inplace", collective.OneShot, false, true}}
	for _, ws := range []int{2, 4, 8} {
		for _, nbytes := range []int{16 << 10, 256 << 10, 1 << 20, 8 << 20} {
			for _, v := range variants {
				if v.algo == collective.Push && nbytes > 1<<20 {
					continue
				}
				for _, scope := range []string{"gpu", "sys", "sysflags"} {
					for _, blocks := range []int{0, ptx.MaxBlocks} {
						b.Run(fmt.Sprintf("ws%d/%s/%s/%s/blocks%d", ws, sizeName(nbytes), v.name, scope, blocks), func(b *testing.B) {
							opts := collective.Options{Algorithm: v.algo, MaxBytes: int64(nbytes), PushMaxBytes: int64(nbytes),
								SystemScope: scope != "gpu", FlagBarriers: scope == "sysflags", Timeout: 50 * time.Millisecond}
							// push's grid is its own fixed one
							if v.algo == collective.Push {
								opts.PushBlocks = blocks
							} else {
								opts.Blocks = blocks
							}
							benchForkJoin(b, ws, opts, nbytes, v.registerOutput, v.inPlace)
						})
					}
				}
			}
		}
	}
}

// BenchmarkEarlyTrigger measures the rules for ptx.FlagEarlyTrigger where ranks share one
// GPU, in the fork/join harness: collective's ("rule": every grid of the kernels that trigger
// after their entry barrier, ptx.EarlyTriggerAnyGrid, and push's within
// ptx.EarlyTriggerRoom; the trigger's place as collective chooses it), the same with the
// trigger before the last wait on a peer ("late") and right after the entry barrier
// ("entry", ptx.FlagEntryTrigger) whatever the ranks, the room alone for every kernel
// ("room"), and every grid carrying the flag ("always"). The last is safe in this harness
// alone, where a layer's kernels launch only once every kernel of the layer before has let
// them, so every block of it is resident; elsewhere it may deadlock push. Compare it with
// BenchmarkGraphForkJoinFloor/fork-rank0-pdl-early of the same run.
func BenchmarkEarlyTrigger(b *testing.B) {
	requireGPU(b)
	variants := []struct {
		name           string
		algo           collective.Algorithm
		registerOutput bool
	}{{"oneshot", collective.OneShot, false}, {"twoshot-direct", collective.TwoShot, true}, {"push", collective.Push, false}}
	rules := []struct {
		name    string
		room    int // -1: collective's
		anyGrid bool
		entry   int // -1: collective's; 0 or 1: ptx.FlagEntryTrigger off or on
	}{{"rule", -1, true, -1}, {"late", -1, true, 0}, {"entry", -1, true, 1}, {"room", -1, false, -1}, {"always", ptx.MaxBlocks, true, -1}}
	for _, ws := range []int{2, 4, 8} {
		for _, nbytes := range []int{16 << 10, 256 << 10, 1 << 20} {
			for _, v := range variants {
				if v.algo == collective.Push && nbytes > 256<<10 {
					continue
				}
				for _, scope := range []string{"gpu", "sys"} {
					for _, rule := range rules {
						// push triggers early within the room under either rule, after its
						// sends: it has no entry barrier
						if v.algo == collective.Push && rule.name != "rule" && rule.name != "always" {
							continue
						}
						b.Run(fmt.Sprintf("ws%d/%s/%s/%s/%s", ws, sizeName(nbytes), v.name, scope, rule.name), func(b *testing.B) {
							opts := collective.Options{Algorithm: v.algo, MaxBytes: int64(nbytes), PushMaxBytes: int64(nbytes),
								SystemScope: scope != "gpu", Timeout: 50 * time.Millisecond}
							benchForkJoinRule(b, ws, opts, nbytes, v.registerOutput, false, func(c *collective.Comm) {
								room := rule.room
								if room < 0 {
									room = collective.EarlyRoom(c)
								}
								collective.SetEarlyTrigger(c, room, rule.anyGrid)
								if rule.entry >= 0 {
									collective.SetEntryTrigger(c, rule.entry == 1)
								}
							})
						})
					}
				}
			}
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dM", n>>20)
	}
	return fmt.Sprintf("%dK", n>>10)
}

// benchForkJoin measures one all-reduce a layer of the fork/join harness, out of place (the
// input registered, the output too with registerOutput) or in place over the registered input.
func benchForkJoin(b *testing.B, ws int, opts collective.Options, nbytes int, registerOutput, inPlace bool) {
	benchForkJoinRule(b, ws, opts, nbytes, registerOutput, inPlace, nil)
}

// benchForkJoinRule is benchForkJoin with rule (if not nil) applied to every rank's
// communicator before its first call: collective.SetEarlyTrigger and SetEntryTrigger.
func benchForkJoinRule(b *testing.B, ws int, opts collective.Options, nbytes int, registerOutput, inPlace bool, rule func(*collective.Comm)) {
	g := newGroup(b, virtualRanks(ws), opts, uint64(nbytes))
	if rule != nil {
		for _, rb := range g.ranks {
			rule(rb.comm)
		}
		// after the timed loop: ResetTimer drops the metrics reported before it
		defer b.ReportMetric(float64(collective.EarlyRoom(g.ranks[0].comm)), "room")
	}
	g.parallel(func(rb *rankBufs) error {
		if _, err := rb.comm.Register(context.Background(), rb.in, rb.capacity); err != nil || !registerOutput {
			return err
		}
		_, err := rb.comm.Register(context.Background(), rb.out, rb.capacity)
		return err
	})
	// the fork/join harness on the ranks' own streams: rank 0's is the main stream
	streams := make([]*driver.Stream, ws)
	for r, rb := range g.ranks {
		streams[r] = rb.stream
	}
	f := newHarness(b, g.ranks[0].comm.Context(), g.ranks[0].stream, streams)
	count := nbytes / dtype.BFloat16.Size()
	x := f.capture(b, f.main, func() {
		f.forkJoinLayer(b, true, func(r int, s *driver.Stream) {
			dst := g.ranks[r].out
			if inPlace {
				dst = g.ranks[r].in
			}
			require.NoError(b, g.ranks[r].comm.AllReduce(s, dst, g.ranks[r].in, count, dtype.BFloat16))
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
	us := float64(d) / float64(time.Microsecond) / float64(b.N*floorLayers)
	b.ReportMetric(us, "us/allreduce")
	// algbw as nccl-tests defines it: message bytes per second.
	b.ReportMetric(float64(nbytes)/us/1e3, "algGB/s")
}

// BenchmarkPushGrid measures where push's band ends: push with the default grid and with
// Options.PushBlocks = ptx.MaxBlocks (capped by occupancy like any grid when ranks share a
// GPU) against one-shot, 16 KiB to 1 MiB, in the fork/join harness (outputs not registered);
// and, up to 64 KiB (push's band), push with grids of 2, 4, 8 and 32 blocks.
func BenchmarkPushGrid(b *testing.B) {
	requireGPU(b)
	variants := []struct {
		name       string
		algo       collective.Algorithm
		pushBlocks int
		bandOnly   bool // measured up to 64 KiB alone
	}{{"oneshot", collective.OneShot, 0, false}, {"push", collective.Push, 0, false}, {"push-maxblocks", collective.Push, ptx.MaxBlocks, false},
		{"push-blocks2", collective.Push, 2, true}, {"push-blocks4", collective.Push, 4, true}, {"push-blocks8", collective.Push, 8, true},
		{"push-blocks32", collective.Push, 32, true}}
	for _, ws := range []int{2, 4, 8} {
		for nbytes := 16 << 10; nbytes <= 1<<20; nbytes *= 2 {
			for _, v := range variants {
				if v.bandOnly && nbytes > 64<<10 {
					continue
				}
				b.Run(fmt.Sprintf("ws%d/%s/%s", ws, sizeName(nbytes), v.name), func(b *testing.B) {
					opts := collective.Options{Algorithm: v.algo, MaxBytes: int64(nbytes), PushMaxBytes: int64(nbytes),
						PushBlocks: v.pushBlocks, Timeout: 50 * time.Millisecond}
					benchForkJoin(b, ws, opts, nbytes, false, false)
				})
			}
		}
	}
}
