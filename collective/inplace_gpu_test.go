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
)

// The in-place OneShot stages its own input: with dst == src (or a src the peers cannot read
// in place) its kernel copies the input into the rank's staging buffer before its entry
// barrier, instead of a copy enqueued before it. These tests check the results bit for bit and
// the staging buffer's reuse from call to call; they use the public API only, so that they also
// run against a build that enqueues the copy.

// ipCounts are the element counts of the in-place tests: one element, partial last vectors of
// every length for some element type, a whole vector, and counts spanning many blocks.
var ipCounts = []int{1, 7, 8, 9, 4095, 16385, 100003}

// ipRegion is one call's part of a rank's buffers: its byte offset and size.
type ipRegion struct {
	off, nbytes int
}

// ipLayout places one region per count, 16-byte aligned, with a gap after each whose bytes no
// call may write (the partial last vector is written only up to the message's end). It
// returns the regions and the bytes they span.
func ipLayout(dt dtype.DType, counts []int) ([]ipRegion, int) {
	var rs []ipRegion
	off := 0
	for _, n := range counts {
		nbytes := n * dt.Size()
		rs = append(rs, ipRegion{off, nbytes})
		off += (nbytes+15)/16*16 + 48
	}
	return rs, off
}

// ipImages are the host copies of every rank's in and out buffers that the GPU's must equal.
type ipImages struct {
	in, out [][]byte
}

// ipFill uploads fresh random inputs over used bytes of every rank's in buffer and poisons its
// out buffer, returning the images.
func ipFill(t testing.TB, g *group, rng *rand.Rand, dt dtype.DType, used int) *ipImages {
	t.Helper()
	im := &ipImages{}
	for _, rb := range g.ranks {
		in := ref.Random(rng, dt, used)
		out := make([]byte, used)
		for i := range out {
			out[i] = 0xFF // a NaN in every type: an unwritten element cannot pass
		}
		require.NoError(t, rb.comm.Context().CopyHtoD(rb.in, in))
		require.NoError(t, rb.comm.Context().CopyHtoD(rb.out, out))
		im.in, im.out = append(im.in, in), append(im.out, out)
	}
	return im
}

// ipCall is one all-reduce of a region on every rank: from the rank's in or out buffer into its
// in or out buffer.
type ipCall struct {
	algo          collective.Algorithm
	src, dst      ipRegion
	srcIn, dstIn  bool // the region of the in buffer (else out)
	inPlaceOnRank func(r int) bool
}

// buffers returns rank r's dst and src of the call.
func (c ipCall) buffers(rb *rankBufs, r int) (dst, src driver.DevicePtr) {
	pick := func(reg ipRegion, in bool) driver.DevicePtr {
		if in {
			return rb.in + driver.DevicePtr(reg.off)
		}
		return rb.out + driver.DevicePtr(reg.off)
	}
	src = pick(c.src, c.srcIn)
	if c.inPlaceOnRank != nil && c.inPlaceOnRank(r) {
		return src, src
	}
	return pick(c.dst, c.dstIn), src
}

// apply computes the call's result on the images.
func (c ipCall) apply(t testing.TB, im *ipImages, dt dtype.DType) {
	t.Helper()
	buf := func(r int, in bool) []byte {
		if in {
			return im.in[r]
		}
		return im.out[r]
	}
	inputs := make([][]byte, len(im.in))
	for r := range inputs {
		inputs[r] = buf(r, c.srcIn)[c.src.off : c.src.off+c.src.nbytes]
	}
	want, err := reference(c.algo, dt, inputs)
	require.NoError(t, err)
	for r := range inputs {
		if c.inPlaceOnRank != nil && c.inPlaceOnRank(r) {
			copy(buf(r, c.srcIn)[c.src.off:], want)
			continue
		}
		copy(buf(r, c.dstIn)[c.dst.off:], want)
	}
}

// issue enqueues the call on every rank's stream.
func (c ipCall) issue(t testing.TB, g *group, dt dtype.DType) error {
	for r, rb := range g.ranks {
		dst, src := c.buffers(rb, r)
		if err := rb.comm.AllReduceWith(rb.stream, dst, src, c.src.nbytes/dt.Size(), dt, c.algo); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

// ipCheck compares every rank's in and out buffers, over used bytes, with the images: the
// results bit for bit, and every byte no call wrote unchanged.
func ipCheck(t testing.TB, g *group, im *ipImages, dt dtype.DType, used int, what string) {
	t.Helper()
	for r, rb := range g.ranks {
		for _, side := range []struct {
			name string
			ptr  driver.DevicePtr
			want []byte
		}{{"in", rb.in, im.in[r]}, {"out", rb.out, im.out[r]}} {
			got := make([]byte, used)
			require.NoError(t, rb.comm.Context().CopyDtoH(got, side.ptr))
			if n, first := ref.Compare(dt, side.want, got); n != 0 {
				t.Fatalf("%s: rank %d, %s buffer: %d of %d elements wrong; first at byte %d: want %s, got %s", what, r, side.name, n,
					used/dt.Size(), first.Index*dt.Size(), ref.Format(dt, first.Want), ref.Format(dt, first.Got))
			}
		}
	}
}

// ipCapture captures calls on every rank into a graph, one capture per rank, concurrently.
func ipCapture(t testing.TB, g *group, calls []ipCall, dt dtype.DType) []*collective.Graph {
	t.Helper()
	graphs := make([]*collective.Graph, len(g.ranks))
	g.parallel(func(rb *rankBufs) error {
		r := rb.comm.Rank()
		var err error
		graphs[r], err = rb.comm.Capture(context.Background(), rb.stream, func() error {
			for _, c := range calls {
				dst, src := c.buffers(rb, r)
				if err := rb.comm.AllReduceWith(rb.stream, dst, src, c.src.nbytes/dt.Size(), dt, c.algo); err != nil {
					return err
				}
			}
			return nil
		})
		return err
	})
	t.Cleanup(func() {
		for _, gr := range graphs {
			require.NoError(t, gr.Close())
		}
	})
	return graphs
}

// ipRun runs calls eager, or captured and replayed twice, on fresh data each time, and checks
// every rank's buffers after each run.
func ipRun(t *testing.T, g *group, rng *rand.Rand, dt dtype.DType, used int, calls []ipCall, captured bool, what string) {
	t.Helper()
	var graphs []*collective.Graph
	runs := 1
	if captured {
		graphs = ipCapture(t, g, calls, dt)
		runs = 2
	}
	for run := range runs {
		im := ipFill(t, g, rng, dt, used)
		for _, c := range calls {
			c.apply(t, im, dt)
		}
		if captured {
			for r, rb := range g.ranks {
				require.NoError(t, graphs[r].Launch(rb.stream))
			}
		} else {
			for _, c := range calls {
				require.NoError(t, c.issue(t, g, dt), what)
			}
		}
		g.syncAll(30 * time.Second)
		ipCheck(t, g, im, dt, used, fmt.Sprintf("%s, run %d", what, run))
	}
}

// scopeSetup is a subtest's world size and barrier scope (Options.SystemScope, and
// Options.FlagBarriers for the round-number flags of GPUs without native peer atomics).
type scopeSetup struct {
	ws                 int
	systemScope, flags bool
}

// String names the subtest: ws<N>, with -systemscope for system-scope barriers and -flags
// for round-number flags.
func (su scopeSetup) String() string {
	name := fmt.Sprintf("ws%d", su.ws)
	if su.systemScope {
		name += "-systemscope"
	}
	if su.flags {
		name += "-flags"
	}
	return name
}

// options are the subtest's communicator options.
func (su scopeSetup) options() collective.Options {
	return collective.Options{Timeout: 5 * time.Second, SystemScope: su.systemScope, FlagBarriers: su.flags}
}

// TestAllReduceInPlaceOneShot runs OneShot in place (and with inputs the peers cannot read in
// place) at 2 to 16 virtual ranks, every barrier scope, every element type and counts with odd
// tails, eager and captured, with unregistered and registered inputs, and compares every
// rank's buffers bit for bit with internal/ref, bytes past each message included.
func TestAllReduceInPlaceOneShot(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, su := range []scopeSetup{{2, false, false}, {4, false, false}, {8, false, false}, {16, false, false}, {4, true, false}, {8, true, false}, {4, true, true}} {
		t.Run(su.String(), func(t *testing.T) {
			g := newGroup(t, virtualRanks(su.ws), su.options(), 1<<20)
			for _, dt := range dtype.All {
				regions, used := ipLayout(dt, ipCounts)
				calls := func(inPlace func(int) bool) []ipCall {
					var cs []ipCall
					for _, reg := range regions {
						cs = append(cs, ipCall{algo: collective.OneShot, src: reg, dst: reg, srcIn: true, inPlaceOnRank: inPlace})
					}
					return cs
				}
				always := func(int) bool { return true }
				never := func(int) bool { return false }
				even := func(r int) bool { return r%2 == 0 }
				// Unregistered inputs: the peers read the staging buffers whether the call is
				// in place or not, so ranks may also mix the two.
				ipRun(t, g, rng, dt, used, calls(always), false, fmt.Sprintf("%v eager in place", dt))
				ipRun(t, g, rng, dt, used, calls(never), false, fmt.Sprintf("%v eager out of place, unregistered", dt))
				ipRun(t, g, rng, dt, used, calls(even), false, fmt.Sprintf("%v eager, even ranks in place", dt))
				ipRun(t, g, rng, dt, used, calls(always), true, fmt.Sprintf("%v captured in place", dt))

				// Registered inputs: in place they still go through the staging buffer (the
				// kernel overwrites them), out of place the peers read them in place.
				var regs []*collective.Registration
				for _, reg := range regions {
					regs = append(regs, ipRegisterAll(t, g, reg)...)
				}
				ipRun(t, g, rng, dt, used, calls(always), false, fmt.Sprintf("%v eager in place, registered", dt))
				ipRun(t, g, rng, dt, used, calls(never), false, fmt.Sprintf("%v eager out of place, registered", dt))
				ipRun(t, g, rng, dt, used, calls(always), true, fmt.Sprintf("%v captured in place, registered", dt))
				for _, reg := range regs {
					require.NoError(t, reg.Release())
				}
			}
		})
	}
}

// ipRegisterAll registers region reg of every rank's in buffer (a collective call).
func ipRegisterAll(t testing.TB, g *group, reg ipRegion) []*collective.Registration {
	t.Helper()
	regs := make([]*collective.Registration, len(g.ranks))
	g.parallel(func(rb *rankBufs) error {
		var err error
		regs[rb.comm.Rank()], err = rb.comm.Register(context.Background(), rb.in+driver.DevicePtr(reg.off), uint64(reg.nbytes))
		return err
	})
	return regs
}

// TestAllReduceInPlaceStagingReuse queues, without waiting in between, a random sequence of
// all-reduces that reuse the staging buffer from call to call: in-place OneShot calls (their
// kernels stage), repeated back to back on the same buffer, alternating with out-of-place
// OneShot calls of unregistered inputs (staged by the kernel too, with src != dst), TwoShot
// calls of unregistered inputs (a copy into the staging buffer before the kernel), and Push
// calls (no staging), at changing sizes. Every call's result, and every byte no call wrote,
// is checked against the sequence replayed on the CPU; then the same sequence captured in a
// graph and replayed.
func TestAllReduceInPlaceStagingReuse(t *testing.T) {
	requireGPU(t)
	for _, su := range []scopeSetup{{2, false, false}, {8, false, false}, {16, false, false}, {8, true, false}, {8, true, true}} {
		t.Run(su.String(), func(t *testing.T) {
			g := newGroup(t, virtualRanks(su.ws), su.options(), 8<<20)
			for _, dt := range dtype.All {
				rng := rand.New(rand.NewPCG(uint64(su.ws), uint64(dt)))
				calls, used := ipSequence(rng, dt, 60, int(g.ranks[0].capacity))
				ipRun(t, g, rng, dt, used, calls, false, fmt.Sprintf("%v eager sequence", dt))
				ipRun(t, g, rng, dt, used, calls, true, fmt.Sprintf("%v captured sequence", dt))
			}
		})
	}
}

// ipSequence draws n calls over fresh regions of the in and out buffers (at most capacity
// bytes each) and returns them with the bytes they span.
func ipSequence(rng *rand.Rand, dt dtype.DType, n, capacity int) ([]ipCall, int) {
	counts := []int{1, 7, 9, 1000, 4095, 8192, 16385, 30001, 65536}
	off := 0
	fresh := func(count int) ipRegion {
		reg := ipRegion{off, count * dt.Size()}
		off += (reg.nbytes+15)/16*16 + 32
		return reg
	}
	always := func(int) bool { return true }
	var calls []ipCall
	var last *ipCall // the previous call, if it left its result in place in the in buffer
	// room for two regions of the largest count
	for len(calls) < n && off+2*(65536*dt.Size()+64) <= capacity {
		count := counts[rng.IntN(len(counts))]
		var c ipCall
		switch k := rng.IntN(6); {
		case k == 0 && last != nil:
			// back to back on the buffer the previous call reduced in place
			c = *last
			c.algo = collective.OneShot
		case k <= 1:
			reg := fresh(count)
			c = ipCall{algo: collective.OneShot, src: reg, dst: reg, srcIn: true, inPlaceOnRank: always}
		case k == 2:
			c = ipCall{algo: collective.OneShot, src: fresh(count), dst: fresh(count), srcIn: true}
		case k == 3:
			reg := fresh(count)
			c = ipCall{algo: collective.TwoShot, src: reg, dst: reg, srcIn: true, inPlaceOnRank: always}
		case k == 4:
			c = ipCall{algo: collective.TwoShot, src: fresh(count), dst: fresh(count), srcIn: true}
		default:
			reg := fresh(count)
			c = ipCall{algo: collective.Push, src: reg, dst: reg, srcIn: true, inPlaceOnRank: always}
		}
		calls = append(calls, c)
		last = nil
		if c.inPlaceOnRank != nil {
			last = &calls[len(calls)-1]
		}
	}
	return calls, off
}

// BenchmarkAllReduceInPlaceEager measures eager OneShot all-reduces with 8 virtual ranks, in
// place against out of place (unregistered input: the peers read the staging buffer too; and
// registered input: the peers read it in place), at 32, 64 and 256 KiB. An iteration is one
// all-reduce: every rank's call, issued from one goroutine as virtual ranks are, and the GPU
// work, which the timer includes (the streams are waited for every 64 iterations), so ns/op
// is the eager wall time of one all-reduce and ns/call the time per rank's call. Eager calls
// of virtual ranks are host-bound: every driver call of every rank goes through one thread.
func BenchmarkAllReduceInPlaceEager(b *testing.B) {
	requireGPU(b)
	const ws = 8
	g := newGroup(b, virtualRanks(ws), collective.Options{Timeout: 5 * time.Second}, 256<<10)
	// rb.in is registered, rb.out is not.
	regs := make([]*collective.Registration, ws)
	g.parallel(func(rb *rankBufs) error {
		var err error
		regs[rb.comm.Rank()], err = rb.comm.Register(context.Background(), rb.in, rb.capacity)
		return err
	})
	b.Cleanup(func() {
		for _, r := range regs {
			require.NoError(b, r.Release())
		}
	})
	for _, rb := range g.ranks {
		zero := make([]byte, rb.capacity)
		require.NoError(b, rb.comm.Context().CopyHtoD(rb.in, zero))
		require.NoError(b, rb.comm.Context().CopyHtoD(rb.out, zero))
	}
	modes := []struct {
		name string
		// buffers returns dst and src
		buffers func(rb *rankBufs) (driver.DevicePtr, driver.DevicePtr)
	}{
		{"inplace", func(rb *rankBufs) (driver.DevicePtr, driver.DevicePtr) { return rb.out, rb.out }},
		{"outofplace", func(rb *rankBufs) (driver.DevicePtr, driver.DevicePtr) { return rb.in, rb.out }},
		{"outofplace-registered", func(rb *rankBufs) (driver.DevicePtr, driver.DevicePtr) { return rb.out, rb.in }},
	}
	for _, nbytes := range []int{32 << 10, 64 << 10, 256 << 10} {
		for _, m := range modes {
			b.Run(fmt.Sprintf("%dKiB/%s", nbytes>>10, m.name), func(b *testing.B) {
				count := nbytes / 2
				call := func() {
					for _, rb := range g.ranks {
						dst, src := m.buffers(rb)
						if err := rb.comm.AllReduceWith(rb.stream, dst, src, count, dtype.BFloat16, collective.OneShot); err != nil {
							b.Fatal(err)
						}
					}
				}
				for range 16 {
					call()
				}
				g.syncAll(time.Minute)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					call()
					if i%64 == 63 {
						g.syncAll(time.Minute)
					}
				}
				g.syncAll(time.Minute)
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ws*b.N), "ns/call")
			})
		}
	}
}

// TestAllReduceInPlaceSelected: with Auto, an in-place call into a registered buffer takes the
// direct TwoShot where an out-of-place one takes OneShot, eager and captured, and its result is
// the TwoShot reference's, bit for bit, on every rank.
func TestAllReduceInPlaceSelected(t *testing.T) {
	requireGPU(t)
	const capacity = 1 << 20
	for _, ws := range []int{2, 4, 8} {
		t.Run(fmt.Sprintf("ws%d", ws), func(t *testing.T) {
			g := newGroup(t, virtualRanks(ws), collective.Options{Timeout: 5 * time.Second}, capacity)
			g.parallel(func(rb *rankBufs) error {
				_, err := rb.comm.Register(context.Background(), rb.in, rb.capacity)
				return err
			})
			rng := rand.New(rand.NewPCG(uint64(ws), 11))
			comm := g.ranks[0].comm
			tested := 0
			for _, nbytes := range []int{32 << 10, 64<<10 - 2, 128 << 10, 256<<10 + 2, 1 << 20} {
				count := nbytes / dtype.BFloat16.Size()
				outOfPlace := comm.SelectedFor(int64(nbytes), collective.CallKind{SharedOutput: true})
				inPlace := comm.SelectedFor(int64(nbytes), collective.CallKind{SharedOutput: true, InPlace: true})
				captured := comm.SelectedFor(int64(nbytes), collective.CallKind{Captured: true, InPlace: true})
				if outOfPlace == collective.OneShot {
					require.Equal(t, collective.TwoShot, inPlace, "%d bytes in place", nbytes)
					tested++
				}
				if comm.SelectedCaptured(int64(nbytes)) == collective.OneShot {
					require.Equal(t, collective.TwoShot, captured, "%d bytes in place, captured", nbytes)
				}
				what := fmt.Sprintf("%d bytes, out of place %v, in place %v", nbytes, outOfPlace, inPlace)

				inputs := g.fill(rng, dtype.BFloat16, nbytes, true)
				want, err := reference(inPlace, dtype.BFloat16, inputs)
				require.NoError(t, err)
				for _, rb := range g.ranks {
					require.NoError(t, rb.comm.AllReduce(rb.stream, rb.in, rb.in, count, dtype.BFloat16))
				}
				g.syncAll(30 * time.Second)
				g.check(dtype.BFloat16, want, true, what+", eager")

				graphs := make([]*collective.Graph, ws)
				g.parallel(func(rb *rankBufs) error {
					var err error
					graphs[rb.comm.Rank()], err = rb.comm.Capture(context.Background(), rb.stream, func() error {
						return rb.comm.AllReduce(rb.stream, rb.in, rb.in, count, dtype.BFloat16)
					})
					return err
				})
				inputs = g.fill(rng, dtype.BFloat16, nbytes, true)
				want, err = reference(captured, dtype.BFloat16, inputs)
				require.NoError(t, err)
				for r, rb := range g.ranks {
					require.NoError(t, graphs[r].Launch(rb.stream))
				}
				g.syncAll(30 * time.Second)
				g.check(dtype.BFloat16, want, true, what+", captured")
				for _, x := range graphs {
					require.NoError(t, x.Close())
				}
			}
			require.NotZero(t, tested, "no size where the selection takes OneShot out of place")
		})
	}
}
