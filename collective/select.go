package collective

import "github.com/goccl/goccl/ptx"

// selectAlgorithm is the selection table: which algorithm is fastest for a message of bytes
// among worldSize ranks on GPUs of compute capability major. Thresholds come from
// measurements (docs/benchmarks.md); pushMax is the communicator's PushMaxBytes.
func selectAlgorithm(major, worldSize int, bytes, pushMax int64) Algorithm {
	// Push has no barrier: it wins while the message is small enough that writing it to
	// every peer costs less than the two barrier round trips of OneShot.
	pushLimit := int64(64 << 10)
	if worldSize > 8 {
		pushLimit = 32 << 10
	}
	if bytes <= min(pushLimit, pushMax) {
		return Push
	}
	// OneShot reads worldSize times the message; TwoShot moves about twice the message but
	// pays a third barrier. The crossover moves down as ranks are added.
	var oneShotLimit int64
	switch {
	case worldSize <= 2:
		oneShotLimit = 8 << 20
	case worldSize <= 4:
		// Measured at 4 virtual ranks on an H200: OneShot 12.9 us, TwoShot 13.2 us at 1 MiB;
		// TwoShot ahead from 2 MiB (docs/benchmarks.md).
		oneShotLimit = 1 << 20
	case worldSize <= 8:
		oneShotLimit = 256 << 10
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

// gridBlocks is the block count of one launch: enough blocks for one vector per thread, at
// most limit. Every rank computes the same value from the same arguments, which the per-block
// barrier needs.
func gridBlocks(algo Algorithm, nvec, worldSize, limit, pushBlocks int) int {
	threads := nvec
	switch algo {
	case Push:
		// The per-block epoch counters stay in step only if every push launch of the
		// communicator uses the same grid.
		return pushBlocks
	case TwoShot:
		// Both stages loop over the largest shard.
		threads = nvec/worldSize + nvec%worldSize
	}
	blocks := (threads + ptx.ThreadsPerBlock - 1) / ptx.ThreadsPerBlock
	return max(1, min(blocks, limit))
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
