package collective

import "github.com/goccl/goccl/ptx"

// arenaLayout places the shared pieces of one rank's arena: the signal region, the staging
// buffer (eager inputs of the pull kernels), TwoShot's tmp buffer and Push's receive buffers.
type arenaLayout struct {
	staging, tmp, recv uint64 // offsets; signals are at 0
	recvSlot           uint64 // bytes of one push receive slot (p_slot)
	total              uint64
}

func newArenaLayout(o Options, worldSize int) arenaLayout {
	var l arenaLayout
	l.staging = ptx.SignalBytes
	l.tmp = l.staging + uint64(o.MaxBytes)
	// TwoShot's tmp holds the largest shard: nvec/ws + nvec%ws vectors; then room for the
	// fused two-shot's inv slots of a band of up to ptx.MaxBlocks rows (ptx.FusedInvBytes),
	// so that such a band fits whenever its rows fill the shard.
	maxVec := uint64(o.MaxBytes) / ptx.VectorBytes
	l.recv = l.tmp + (maxVec/uint64(worldSize)+uint64(worldSize))*ptx.VectorBytes + uint64(ptx.FusedInvBytes(0))
	l.recvSlot = uint64(ptx.PushSlotBytes(o.PushMaxBytes))
	l.total = l.recv + uint64(ptx.PushParts(worldSize)*worldSize)*l.recvSlot
	return l
}
