package collective

import (
	"fmt"
	"math"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/ptx"
)

// ResidualRMSNorm is the second half of the unfused pair, the residual add and RMSNorm of
// this rank alone, without communication: ResidualOut = In + Residual, and NormOut =
// RMSNorm(ResidualOut) * Gamma, row by row. In is the sum that an all-reduce already left
// on this rank (AllReduce, or NCCL's); the call is what a layer runs after it when its
// all-reduce went elsewhere, and what the fused AllReduceResidualRMSNorm is measured against.
//
// The arithmetic is the fused kernels' with one rank: In and Residual are widened to f32,
// added (one add.rn) and rounded once to DType (ResidualOut); the norm reads those rounded
// values and sums their squares in the order the fused kernels do, over ptx.FusedThreads
// threads per row. internal/ref.Fused with a single input (In) reproduces both outputs bit
// for bit. NoNorm stops after the residual add: NormOut and Gamma are not read.
//
// The arguments are those of AllReduceResidualRMSNorm, checked the same way before anything
// is launched (a bad call returns an error wrapping ErrInvalidArgument), except that In need
// not be registered and that MaxBytes does not bound the rows: nothing goes through the
// communicator's buffers. ResidualOut may be Residual or In; NormOut overlaps nothing.
//
// It is not a collective call: a rank calls it whenever its sum is ready, and no peer waits
// for it. It only enqueues one kernel on stream (with programmatic dependent launch where the
// communicator launches its own kernels so, so that it overlaps the tail of the all-reduce
// before it; the kernel in turn lets the next one launch as soon as it starts) and returns;
// Close waits for it like for the all-reduces, and a graph captures it like any kernel. The
// kernel is JIT-compiled on the first call of each element type, or by LoadFused (which a
// process driving several ranks needs). It needs goccl's kernels: on a communicator that
// NCCL alone serves it returns an error.
func (c *Comm) ResidualRMSNorm(stream *driver.Stream, a FusedArgs) error {
	if c == nil {
		return errNilComm
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Recorded by a Capture only on its streams, as AllReduce.
	defer c.endCall(c.callOn(stream))
	if err := c.usable(); err != nil {
		return err
	}
	if _, err := c.validateFused(stream, a); err != nil {
		return err
	}
	fn, err := c.normKernel(a.DType)
	if err != nil {
		return err
	}
	// One block per row, at most the communicator's block limit: with PDL the blocks may
	// become resident while the all-reduce before them still waits for its peers, and the
	// limit is what the ranks sharing a GPU sized their grids for (ptx.EarlyTriggerRoom).
	return c.residualRMSNorm(stream, fn, a, c.blocks)
}

// residualRMSNorm enqueues the single-rank kernel fn over a, one block per row, at most limit
// blocks: ResidualRMSNorm without the lock and the checks, for callers that made them. The
// kernel reads each row's In and Residual whole before its block writes the row's NormOut, so
// a.In may also be a.NormOut (the fused call's NCCL route leaves its sum there).
func (c *Comm) residualRMSNorm(stream *driver.Stream, fn *driver.Function, a FusedArgs, limit int) error {
	hvec := a.Hidden * a.DType.Size() / ptx.VectorBytes
	blocks, threads := max(1, min(limit, a.Rows)), ptx.FusedThreads(hvec)
	var flags uint32
	if a.NoNorm {
		flags |= ptx.FlagNoNorm
	}
	// ptx.FusedParams(1): p_inputs is In itself; no output tables (one rank); p_rank, p_err,
	// p_timeout, p_sig, p_buf and p_call are unused by the single-rank kernel (no peer, no
	// barrier).
	p := fusedParams{inputs: a.In, a: &a, hvec: hvec, sig: noPeer[:], buf: noPeer[:], flags: flags}
	p.pack(&c.args)
	return c.launch(stream, fn, blocks, threads, &c.args)
}

// noPeer is the single-rank kernel's p_sig and p_buf: one unused pointer each.
var noPeer [8]byte

// normKernel returns the single-rank kernel of dt from the communicator's kernel set.
func (c *Comm) normKernel(dt dtype.DType) (*driver.Function, error) {
	if c.kernels == nil {
		return nil, invalid("ResidualRMSNorm runs one of goccl's kernels, which this communicator has not loaded: they cannot serve it (%s); run the residual add and RMSNorm outside goccl", c.noCustomWhy)
	}
	fn, err := c.kernels.normKernel(dt)
	if err != nil {
		return nil, c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, err))
	}
	return fn, nil
}

// normKernel returns the single-rank residual add + RMSNorm kernel of dt (ptx.NormSpec),
// loading it on first use. Its occupancy at ThreadsPerBlock must be at least the set's
// maxBlocksPerSM: launched with PDL behind an all-reduce that triggers early, its blocks wait
// beside the all-reduce's, within the share of the GPU that the ranks' grids were sized for.
func (ks *kernelSet) normKernel(dt dtype.DType) (*driver.Function, error) {
	kernelCache.mu.Lock()
	defer kernelCache.mu.Unlock()
	if fn := ks.norm[dt]; fn != nil {
		return fn, nil
	}
	spec := ptx.NormSpec{DType: dt, Target: ks.key.target}
	fn, occ, err := ks.loadModule(spec.EntryName(), spec.Target, spec.Generate)
	if err != nil {
		return nil, err
	}
	if occ < ks.maxBlocksPerSM {
		return nil, fmt.Errorf("collective: kernel %s fits %d blocks per SM, fewer than the %d the grids were sized for", spec.EntryName(), occ, ks.maxBlocksPerSM)
	}
	ks.norm[dt] = fn
	return fn, nil
}

// FusedSelected returns the algorithm that AllReduceResidualRMSNorm picks for rows rows of
// hidden elements of dt: the forced one (Options.Algorithm or GOCCL_ALGO; Push selects as
// Auto, the fused call has none), NCCL where goccl's kernels cannot serve the call
// (past MaxBytes, or a communicator they cannot serve) and NCCL is available, else the fused
// selection table's kernel. sharedOutputs says whether both ResidualOut and NormOut are
// visible to the peers (registered with Register, or the call is captured by Capture):
// TwoShot then writes the finished rows straight into them, and needs no tmp buffer. The
// error is the one the call would return for a shape that the communicator cannot take (no
// engine, past MaxBytes without NCCL, a forced kernel the call does not fit); the finer
// checks of the call (hidden size, rows, pointers, NCCL's buffer for a NoNorm call) are not
// made.
func (c *Comm) FusedSelected(rows, hidden int, dt DType, sharedOutputs bool) (Algorithm, error) {
	if c == nil {
		return 0, errNilComm
	}
	if !dt.Valid() || rows < 1 || hidden < 1 {
		return 0, invalid("fused selection for %d rows of %d %v elements: need a valid element type and at least one row of one element", rows, hidden, dt)
	}
	// Compare before multiplying: the product may not fit an int64, and a wrapped one would be
	// routed as the few bytes it leaves. The call itself takes no such shape.
	rowBytes := int64(dt.Size())
	if int64(hidden) > math.MaxInt64/rowBytes || int64(rows) > math.MaxInt64/(int64(hidden)*rowBytes) {
		return 0, invalid("fused selection for %d rows of %d %v elements: more bytes than an int64 holds", rows, hidden, dt)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	a := FusedArgs{Rows: rows, Hidden: hidden, DType: dt}
	return c.routeFused(Auto, a, int64(rows)*int64(hidden)*rowBytes, sharedOutputs, sharedOutputs)
}
