package collective

import (
	"fmt"
	"math"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/ptx"
)

// fusedPush launches the fused push kernel (ptx.FusedPushParams) for a call that routeFused
// gave Push: push's fixed grid, whose per-block parts it shares with AllReduce's Push, a
// block of ptx.FusedThreads threads a row (rows b, b+grid, .. in block b). The kernel is the
// same in every barrier scope (it has no barrier); the ScopeSystem build is loaded.
func (c *Comm) fusedPush(stream *driver.Stream, a FusedArgs) error {
	fn, occ, err := c.kernels.fusedKernel(ptx.ScopeSystem, ptx.Push, a.DType, false)
	if err != nil {
		return c.fail(fmt.Errorf("collective: rank %d: %w (the fused kernels load on their first call: make one outside a global-mode stream capture)", c.rank, err))
	}
	slots, ok := c.fusedPushSlots(occ)
	if !ok {
		// The same on every rank: the ranks sharing a GPU load the same kernel for it.
		return invalid("the fused Push kernel fits %d blocks of %d threads per SM, and its grid of %d blocks on each of the %d ranks sharing a GPU would not be resident at once: use Auto, or lower Options.PushBlocks", occ, ptx.ThreadsPerBlock, c.pushBlocks, c.ranksOnGPU)
	}
	hvec := a.Hidden * a.DType.Size() / ptx.VectorBytes
	blocks, threads := c.pushBlocks, ptx.FusedThreads(hvec)
	// The kernel's only trigger is after its sends, before it has seen any peer: push's
	// flagged trigger, which needs room beside the rank's largest grid, counted in slots.
	flags := c.fusedFlags(ptx.Push, blocks*slots, a.NoNorm)
	ws8 := 8 * c.size
	args := &c.args
	args.Reset()
	args.Ptr(a.In)
	args.Ptr(a.ResidualOut)
	args.Ptr(a.NormOut)
	args.Ptr(a.Residual)
	args.Ptr(a.Gamma)
	args.U32(uint32(a.Rows))
	args.U32(uint32(hvec))
	args.U32(uint32(c.rank))
	args.U32(math.Float32bits(a.Eps))
	args.Ptr(c.errRec.DevicePtr())
	args.U64(c.timeout)
	args.Bytes(c.sig[:ws8], 8)
	args.Bytes(c.recv[:ws8], 8)
	args.U64(c.layout.recvSlot)
	args.U32(flags)
	args.U64(ptx.FusedCall(ptx.Push, a.DType, a.Rows, a.Hidden, a.NoNorm).Fingerprint())
	return c.launch(stream, fn, blocks, threads, args)
}

// fusedPushSlots says how many of the plain kernels' block slots (c.blocksPerSM an SM, which
// the ranks sharing a GPU sized every grid by) one block of the fused push kernel takes at
// its occupancy occ (512-thread blocks per SM, from its registers as the driver's JIT assigns
// them), and whether its grid, push's fixed grid, then fits. Push's grid cannot shrink as the
// other fused kernels' do (its parts are per block), so it must take no more slots than the
// largest grid the ranks left room for: every rank's blocks poll for every peer's, and must
// be resident at once, beside whatever an early trigger let in (ptx.EarlyTriggerRoom). With a
// GPU per rank nothing needs to be resident at once.
func (c *Comm) fusedPushSlots(occ int) (slots int, ok bool) {
	if c.ranksOnGPU <= 1 {
		return 1, true
	}
	if occ < 1 {
		return 0, false
	}
	slots = (c.blocksPerSM + occ - 1) / occ
	return slots, c.pushBlocks*slots <= max(c.blocks, c.pushBlocks, c.tuning.table.largestGrid())
}
