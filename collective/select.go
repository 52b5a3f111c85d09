package collective

import (
	"fmt"
	"math"

	"github.com/goccl/goccl/ptx"
)

// selectAlgorithm is the selection table: which algorithm is fastest for a message of bytes
// among worldSize ranks on GPUs of compute capability major. Thresholds come from
// measurements (docs/benchmarks.md); pushMax is the communicator's PushMaxBytes; direct says
// that TwoShot can write straight into every rank's output (Comm.Selected); gpuScope that its
// barriers are GPU-scope (every rank on one GPU, ptx.ScopeGPU).
func selectAlgorithm(major, worldSize int, bytes, pushMax int64, direct, gpuScope bool) Algorithm {
	// Push has no barrier: it wins while the message is small enough that writing it to
	// every peer costs less than the two barrier round trips of OneShot. With 8 virtual ranks
	// on an H200 (one graph per rank, f318863) push took 3.69 us against OneShot's 4.22 at
	// 16 KiB, and 4.70 against 4.51 at 32 KiB.
	pushLimit := int64(64 << 10)
	if worldSize > 4 {
		pushLimit = 16 << 10
	}
	if bytes <= min(pushLimit, pushMax) {
		return Push
	}
	// OneShot reads worldSize times the message; TwoShot moves about twice the message but
	// pays a third barrier, or, writing straight into the outputs (direct), moves each shard
	// once in and once out with two barriers. The crossover moves down as ranks are added.
	// Measured on an H200 with virtual ranks, one graph per rank (docs/benchmarks.md).
	var oneShotLimit int64
	switch {
	case worldSize <= 2:
		// direct: OneShot 4.01, TwoShot 4.33 us at 2 MiB; 5.94 and 5.98 at 4 MiB; 12.15 and
		// 10.20 at 8 MiB (f318863)
		oneShotLimit = 8 << 20
		if direct {
			oneShotLimit = 2 << 20
		}
	case worldSize <= 4:
		// OneShot 5.58, TwoShot 6.31 us at 1 MiB. Direct: OneShot 8.06, TwoShot 9.03 us at
		// 2 MiB; 14.0 and 12.4 at 4 MiB (eca01b3).
		oneShotLimit = 1 << 20
		if direct {
			oneShotLimit = 2 << 20
		}
		if direct && gpuScope {
			// With GPU-scope barriers the direct TwoShot's crossover is lower (4 virtual
			// ranks, one graph per rank): OneShot 4.38-4.39, TwoShot 4.28-4.39 us at 512 KiB;
			// 5.06-5.08 and 4.74-4.78 at 1 MiB; 6.82-6.87 and 6.12-6.23 at 2 MiB. At system
			// scope its release costs 2 to 3 us more here (docs/benchmarks.md, "The target
			// points"), so the limit above stays.
			oneShotLimit = 512 << 10
		}
	case worldSize <= 8:
		// fork/join harness (f318863): OneShot 7.77, TwoShot through tmp 7.35 us at 256 KiB
		oneShotLimit = 256 << 10
		if direct && gpuScope {
			// GPU-scope barriers make the direct TwoShot cheaper (8 virtual ranks, one graph
			// per rank, f318863): OneShot 4.46, TwoShot 4.84 us at 64 KiB; 4.93 and 4.78 at
			// 128 KiB
			oneShotLimit = 64 << 10
		}
	default:
		oneShotLimit = 128 << 10
	}
	if major < 9 {
		// Ampere's NVLink has less bandwidth per read than Hopper's: switch earlier.
		oneShotLimit /= 2
	}
	if bytes <= oneShotLimit {
		return OneShot
	}
	return TwoShot
}

// MinThreadsPerBlock is the smallest block a launch uses when it spreads a small message.
const MinThreadsPerBlock = 64

// twoShotMinThreads is the smallest block TwoShot spreads a shard over.
const twoShotMinThreads = 128

// launchShape is the grid of one launch: blocks and threads per block. Every thread handles
// one vector per loop iteration (of the largest shard for TwoShot).
//
// OneShot uses blocks of ptx.ThreadsPerBlock threads, as many as the message needs, at most
// limit; so does TwoShot for its largest shard, unless that would fill at most half of limit:
// then it spreads the shard over smaller blocks. Push keeps its fixed pushBlocks (its epochs
// are per block) and, for a message smaller than that grid, shrinks its blocks (to a multiple
// of 32, at least MinThreadsPerBlock) so that the message is spread over all of them, and over
// as many SMs. On an H200 with 8 virtual ranks, 16 KiB went from 7.3 to 6.1 us. (Fewer
// instructions per thread were not the point: push threads handling 4 bytes instead of 16
// gained nothing there.) OneShot got no faster (2 ranks slower: more blocks, a longer tail of
// barriers), so it keeps full blocks.
// fixed > 0 (Options.ThreadsPerBlock) sets the block size of every launch instead. Every
// rank computes the same shape from the same arguments, which the per-block barrier and the
// per-block push epochs need.
func launchShape(algo Algorithm, nvec, worldSize, limit, pushBlocks, fixed int) (blocks, threads int) {
	if algo == Push {
		threads = fixed
		if threads == 0 {
			threads = spreadThreads(nvec, pushBlocks)
		}
		return pushBlocks, threads
	}
	work := nvec
	if algo == TwoShot {
		// Both stages loop over the largest shard.
		work = nvec/worldSize + nvec%worldSize
	}
	threads = fixed
	if threads == 0 {
		threads = ptx.ThreadsPerBlock
		if algo == TwoShot && (work+threads-1)/threads <= limit/2 {
			// A shard that fills at most half the grid in full blocks is spread over up to
			// limit blocks of at least 128 threads, so that more SMs move it. H200, virtual
			// ranks, direct, 256 KiB: 8 ranks 8.19 us with 4 blocks of 512 threads, 7.27 with
			// 16 of 128; 4 ranks 4.62 and 4.29; 2 ranks 3.23 and 3.11. Blocks of 64 threads
			// were slower at 16 KiB with 2 and 4 ranks, and nearly full grids gained nothing.
			threads = max(twoShotMinThreads, spreadThreads(work, limit))
		}
	}
	return max(1, min(limit, (work+threads-1)/threads)), threads
}

// spreadThreads is the block size that spreads work vectors over blocks blocks: a multiple of
// 32 in [MinThreadsPerBlock, ptx.ThreadsPerBlock].
func spreadThreads(work, blocks int) int {
	perBlock := (work + blocks - 1) / blocks
	return min(ptx.ThreadsPerBlock, max(MinThreadsPerBlock, (perBlock+31)/32*32))
}

// blockCap is how many blocks each rank may launch so that the blocks of all ranks sharing
// one GPU are resident at once: a block that cannot be scheduled while its peers spin waiting
// for it would deadlock the barrier (the watchdog would then fire).
func blockCap(want, smCount, blocksPerSM, ranksOnGPU int) int {
	if ranksOnGPU <= 1 {
		return want
	}
	return max(1, min(want, smCount*blocksPerSM/ranksOnGPU))
}

// tuning is a tuning table section compiled for the hot path: per (graph, direct), the bands
// by increasing size. AllReduce consults it without allocating or locking anything more.
type tuning struct {
	bands      [2][2][]tunedBand // [graph][direct]
	pushBlocks int               // every Push launch's grid; 0: the communicator's
	largest    int               // the largest grid any band launches
}

// tunedBand is one band: calls of at most upTo bytes use algo, and, when that is the algorithm
// that runs, the grid limit blocks (0: the communicator's) of threads (0: automatic).
type tunedBand struct {
	upTo            int64
	algo            Algorithm
	blocks, threads int
}

// compileTuning turns a validated section into a tuning for a communicator with options o
// (with defaults) whose ranks can keep grids of maxBlocks resident. Grid fields the caller set
// in o win over the section's; a grid past maxBlocks is an error, since the blocks of ranks
// sharing a GPU that cannot all be resident deadlock their barriers.
func compileTuning(s TuneSection, o Options, maxBlocks int) (*tuning, error) {
	t := &tuning{}
	if o.defaultPushBlocks && s.PushBlocks > 0 {
		if s.PushBlocks > maxBlocks {
			return nil, fmt.Errorf("push_blocks %d is more than the %d blocks every rank can keep resident here", s.PushBlocks, maxBlocks)
		}
		t.pushBlocks = s.PushBlocks
		t.largest = s.PushBlocks
	}
	for _, e := range s.Entries {
		bands := make([]tunedBand, len(e.Bands))
		for i, b := range e.Bands {
			algo, err := ParseAlgorithm(b.Algorithm)
			if err != nil {
				return nil, err
			}
			tb := tunedBand{upTo: b.UpTo, algo: algo, blocks: b.Blocks, threads: b.Threads}
			if tb.upTo == 0 {
				tb.upTo = math.MaxInt64
			}
			if algo == Push || !o.defaultBlocks {
				tb.blocks = 0 // push: the section's grid; else the caller's Options.Blocks
			}
			if o.ThreadsPerBlock != 0 {
				tb.threads = 0 // the caller's, for every launch
			}
			if tb.blocks > maxBlocks {
				return nil, fmt.Errorf("%s %v band up to %d bytes: %d blocks is more than the %d every rank can keep resident here",
					e.Mode, algo, b.UpTo, tb.blocks, maxBlocks)
			}
			t.largest = max(t.largest, tb.blocks)
			bands[i] = tb
		}
		t.bands[b01(e.Mode == TuneModeGraph)][b01(e.Direct)] = bands
	}
	return t, nil
}

// band returns the band of a call of nbytes, nil when the table has none (or t is nil).
func (t *tuning) band(graph, direct bool, nbytes int64) *tunedBand {
	if t == nil {
		return nil
	}
	bands := t.bands[b01(graph)][b01(direct)]
	for i := range bands {
		if nbytes <= bands[i].upTo {
			return &bands[i]
		}
	}
	return nil
}

// largestGrid is the largest grid t launches; 0 for nil.
func (t *tuning) largestGrid() int {
	if t == nil {
		return 0
	}
	return t.largest
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}

// selectedIn is the algorithm of a call of nbytes, captured (graph) or not, whose output the
// peers see or not, in place or not: the forced one, NCCL where only it can serve the call,
// the tuning table's band (a Push band past PushMaxBytes excepted), or the built-in selection;
// TwoShot instead of OneShot for an in-place call whose output the peers see.
func (c *Comm) selectedIn(graph bool, nbytes int64, sharedOutput, inPlace bool) Algorithm {
	if c.opts.Algorithm != Auto {
		return c.opts.Algorithm
	}
	if c.nccl != nil && (!c.custom || nbytes > c.opts.MaxBytes) {
		return NCCL
	}
	var algo Algorithm
	if b := c.tuning.table.band(graph, sharedOutput, nbytes); b != nil && (b.algo != Push || nbytes <= c.opts.PushMaxBytes) {
		algo = b.algo
	} else {
		algo = selectAlgorithm(c.major, c.size, nbytes, c.opts.PushMaxBytes, sharedOutput, c.scope == ptx.ScopeGPU)
	}
	if algo == OneShot && inPlace && sharedOutput {
		// In place, OneShot stages its input (its kernel copies it before the entry barrier:
		// a slower peer would otherwise read elements this rank has overwritten), and the
		// direct TwoShot needs no copy: every element of the buffer is read and then written
		// by one thread of one rank. The tables (the tuning table's too) are measured out of
		// place. In place, TwoShot won at every size OneShot serves: 8 virtual ranks on an
		// H200, one graph per rank, 32 KiB 5.02-5.26 against 5.59-6.00 us, 64 KiB 5.09-5.51
		// against 5.90-6.21; 2 ranks 128 KiB 2.57-2.62 against 3.11-3.15, 2 MiB 3.79-3.88
		// against 5.73-5.95 (docs/benchmarks.md, "In place with a shared output"). Ranks that
		// differ in being in place already differ in their calls (the in-place OneShot's input
		// is staged, and the call check tells), so the choice stays alike on every rank.
		return TwoShot
	}
	return algo
}

// shape is the grid of one all-reduce of algo over nvec vectors (nbytes): the tuning table's
// band for the call where it names this algorithm, else the communicator's grid (launchShape).
func (c *Comm) shape(algo Algorithm, nvec int, nbytes int64, direct bool) (blocks, threads int) {
	limit, fixed := c.blocks, c.opts.ThreadsPerBlock
	if b := c.tuning.table.band(c.capture != nil, direct, nbytes); b != nil && b.algo == algo {
		if b.blocks > 0 {
			limit = b.blocks
		}
		if b.threads > 0 {
			fixed = b.threads
		}
	}
	return launchShape(algo, nvec, c.size, limit, c.pushBlocks, fixed)
}
