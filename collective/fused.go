package collective

import (
	"fmt"
	"math"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/ptx"
)

// FusedArgs are the buffers and shape of one AllReduceResidualRMSNorm call: Rows rows of
// Hidden elements of DType each. Every pointer is 16-byte aligned device memory of this
// rank's device.
type FusedArgs struct {
	// NormOut receives ResidualOut * 1/sqrt(mean(ResidualOut^2) + Eps) * Gamma, row by row
	// (Rows*Hidden elements). It must not overlap any other buffer. Unused with NoNorm.
	NormOut driver.DevicePtr
	// ResidualOut receives allreduce(In) + Residual (Rows*Hidden elements): the next
	// layer's residual. It may be Residual itself (in place, the usual case) or In itself;
	// any other overlap with them is refused.
	ResidualOut driver.DevicePtr
	// In is this rank's partial sum, the buffer that is all-reduced (Rows*Hidden elements).
	// It is read by the peers like AllReduce's src: registered, or under Capture, it is read
	// in place; otherwise it is first copied into the staging buffer. Registered buffers are
	// matched across ranks as for AllReduce: when one rank passes a registered In, ResidualOut
	// or NormOut, every rank passes its own counterpart, registered in the same order.
	In driver.DevicePtr
	// Residual is added to the all-reduced sum (Rows*Hidden elements).
	Residual driver.DevicePtr
	// Gamma is the norm's weight, one row (Hidden elements). Unused with NoNorm.
	Gamma driver.DevicePtr
	// Rows is the number of rows (tokens), at least 1, with Rows*Hidden elements at most
	// Options.MaxBytes bytes.
	Rows int
	// Hidden is the number of elements per row: a multiple of ptx.HiddenMultiple in
	// [ptx.MinHidden, ptx.MaxHidden].
	Hidden int
	// Eps is added to the mean of the squares before the square root.
	Eps float32
	// DType is the element type of every buffer.
	DType DType
	// NoNorm stops after the residual add: ResidualOut only, NormOut and Gamma are not read.
	NoNorm bool
}

// AllReduceResidualRMSNorm is the end of a tensor-parallel layer in one launch: ResidualOut
// = allreduce(In) + Residual, and NormOut = RMSNorm(ResidualOut) * Gamma, row by row. The
// all-reduce sums the ranks in the order AllReduce's OneShot or TwoShot does; the residual is
// added in f32 and the sum rounded once (ResidualOut); the norm reads those rounded values
// (internal/ref.Fused says exactly where every value is rounded, and reproduces the results
// bit for bit). When every rank passes the same Residual and Gamma values (replicated, as
// tensor parallelism has them), both outputs are bitwise identical on every rank.
//
// Every rank must make the same call (same Rows, Hidden, DType, NoNorm) in the same order as
// its other collective calls; a kernel that sees a peer make another records a KernelError
// matching ErrCallMismatch. Arguments are checked as AllReduce checks them, before anything
// is launched; a bad call returns an error wrapping ErrInvalidArgument.
//
// The algorithm is OneShot for small messages and TwoShot (each rank reduces and norms its
// band of rows, then every rank gathers the finished rows; when ResidualOut and NormOut are
// both visible to the peers, registered with Register or under Capture, each rank writes its
// finished rows straight into every rank's outputs instead) above, forced by Options.Algorithm
// or GOCCL_ALGO where it names one of them. Push has no fused kernel: a communicator forced
// to Push selects as Auto does. NCCL has none either: such calls are refused. The fused
// kernels are JIT-compiled on first use of each (algorithm, element type).
func (c *Comm) AllReduceResidualRMSNorm(stream *driver.Stream, a FusedArgs) error {
	algo := c.opts.Algorithm
	if algo == Push {
		algo = Auto
	}
	return c.AllReduceResidualRMSNormWith(stream, a, algo)
}

// AllReduceResidualRMSNormWith is AllReduceResidualRMSNorm with the algorithm chosen by the
// caller for this call: Auto, OneShot or TwoShot. Every rank must pass the same algorithm. It
// exists for benchmarks and tests; services use AllReduceResidualRMSNorm.
func (c *Comm) AllReduceResidualRMSNormWith(stream *driver.Stream, a FusedArgs, algo Algorithm) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return err
	}
	nbytes, err := c.validateFused(stream, a)
	if err != nil {
		return err
	}
	// Direct: both outputs are visible to the peers (registered, or under Capture).
	residReg, direct := c.sharedOutput(a.ResidualOut, uint64(nbytes))
	var normReg *Registration
	if direct && !a.NoNorm {
		normReg, direct = c.sharedOutput(a.NormOut, uint64(nbytes))
	}
	if algo, err = c.routeFused(algo, a, nbytes, direct); err != nil {
		return err
	}
	kernel, _ := algo.kernel()
	fn, err := c.kernels.fusedKernel(c.scope, kernel, a.DType)
	if err != nil {
		return c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, err))
	}
	inputs, err := c.pullInput(stream, algo, a.ResidualOut, a.In, uint64(nbytes))
	if err != nil {
		return err
	}
	var residOuts, normOuts driver.DevicePtr
	if algo == TwoShot && direct {
		if residOuts, err = c.pullOutput(a.ResidualOut, uint64(nbytes), residReg); err != nil {
			return err
		}
		if !a.NoNorm {
			if normOuts, err = c.pullOutput(a.NormOut, uint64(nbytes), normReg); err != nil {
				return err
			}
		}
	}
	hvec := a.Hidden * a.DType.Size() / ptx.VectorBytes
	blocks, threads := fusedShape(algo, a.Rows, hvec, c.size, c.blocks)
	ws8 := 8 * c.size
	args := &c.args
	args.Reset()
	args.Ptr(inputs)
	args.Ptr(residOuts)
	args.Ptr(normOuts)
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
	args.Bytes(c.tmp[:ws8], 8)
	var flags uint32
	if blocks <= c.earlyRoom {
		flags |= ptx.FlagEarlyTrigger
	}
	if a.NoNorm {
		flags |= ptx.FlagNoNorm
	}
	args.U32(flags)
	args.U64(ptx.FusedCall(kernel, a.DType, a.Rows, a.Hidden, a.NoNorm).Fingerprint())
	return c.launch(stream, fn, blocks, threads, args)
}

// fusedShape is the grid of a fused launch: one block per row (OneShot) or per row of the
// largest band (TwoShot, ceil(rows/ws)), at most limit, each of ptx.FusedThreads threads.
// Every rank computes the same shape from the same call.
func fusedShape(algo Algorithm, rows, rowVectors, worldSize, limit int) (blocks, threads int) {
	work := rows
	if algo == TwoShot {
		work = (rows + worldSize - 1) / worldSize
	}
	return max(1, min(limit, work)), ptx.FusedThreads(rowVectors)
}

// selectFused is the fused call's selection table: OneShot up to the plain all-reduce's
// OneShot limit (direct: both outputs shared, so that TwoShot writes the finished rows
// straight into them), TwoShot above, where every rank has at least one row of its own. The
// thresholds are the plain kernels' until the fused ones are measured.
func selectFused(major, worldSize, rows int, nbytes int64, direct, gpuScope bool) Algorithm {
	if rows < worldSize {
		return OneShot
	}
	// pushMax 0: Push is never chosen.
	return selectAlgorithm(major, worldSize, nbytes, 0, direct, gpuScope)
}

// routeFused resolves the algorithm of a fused call and refuses what the fused kernels
// cannot take; direct says that both outputs are shared (TwoShot then needs no tmp).
func (c *Comm) routeFused(algo Algorithm, a FusedArgs, nbytes int64, direct bool) (Algorithm, error) {
	switch {
	case !c.custom:
		return 0, invalid("the fused all-reduce + RMSNorm runs on goccl's kernels only, which cannot serve this communicator (%s)", c.noCustomWhy)
	case nbytes > c.opts.MaxBytes:
		return 0, invalid("%d rows of %d %v elements are %d bytes, more than MaxBytes (%d): raise Options.MaxBytes or split the rows", a.Rows, a.Hidden, a.DType, nbytes, c.opts.MaxBytes)
	}
	rowBytes := int64(a.Hidden * a.DType.Size())
	tmpFits := direct || ptx.FusedTmpBytes(c.size, a.Rows, rowBytes) <= int64(c.layout.recv-c.layout.tmp)
	switch algo {
	case Auto:
		algo = selectFused(c.major, c.size, a.Rows, nbytes, direct, c.scope == ptx.ScopeGPU)
		if algo == TwoShot && !tmpFits {
			algo = OneShot
		}
	case OneShot:
	case TwoShot:
		if !tmpFits {
			return 0, invalid("TwoShot needs %d bytes of tmp buffer for %d rows of %d bytes over %d ranks, the communicator has %d: use OneShot, or raise Options.MaxBytes",
				ptx.FusedTmpBytes(c.size, a.Rows, rowBytes), a.Rows, rowBytes, c.size, c.layout.recv-c.layout.tmp)
		}
	default:
		return 0, invalid("the fused all-reduce + RMSNorm has no %v kernel: use Auto, OneShot or TwoShot", algo)
	}
	return algo, nil
}

// validateFused checks a fused call's arguments and returns its size in bytes (of In, and of
// each output). It runs before anything is launched.
func (c *Comm) validateFused(stream *driver.Stream, a FusedArgs) (int64, error) {
	dt := a.DType
	if !dt.Valid() {
		return 0, invalid("unsupported element type %v: use Float32, Float16 or BFloat16", dt)
	}
	if a.Hidden < ptx.MinHidden || a.Hidden > ptx.MaxHidden || a.Hidden%ptx.HiddenMultiple != 0 {
		return 0, invalid("hidden size %d: the fused kernels take a multiple of %d in [%d, %d]", a.Hidden, ptx.HiddenMultiple, ptx.MinHidden, ptx.MaxHidden)
	}
	if a.Rows <= 0 || a.Rows >= ptx.MaxFusedRows {
		return 0, invalid("%d rows: must be in [1, %d]", a.Rows, ptx.MaxFusedRows-1)
	}
	if math.IsNaN(float64(a.Eps)) || math.IsInf(float64(a.Eps), 0) || a.Eps < 0 {
		return 0, invalid("eps %v: must be a finite number >= 0", a.Eps)
	}
	// rows < 2^24 and a row is at most 64 KiB: the product fits an int64.
	rowBytes := int64(a.Hidden) * int64(dt.Size())
	nbytes := int64(a.Rows) * rowBytes
	type buffer struct {
		name string
		ptr  driver.DevicePtr
		n    uint64
	}
	bufs := []buffer{{"In", a.In, uint64(nbytes)}, {"ResidualOut", a.ResidualOut, uint64(nbytes)}, {"Residual", a.Residual, uint64(nbytes)}}
	if !a.NoNorm {
		bufs = append(bufs, buffer{"NormOut", a.NormOut, uint64(nbytes)}, buffer{"Gamma", a.Gamma, uint64(rowBytes)})
	}
	for _, b := range bufs {
		switch {
		case b.ptr == 0:
			return 0, invalid("nil %s", b.name)
		case b.ptr%ptx.VectorBytes != 0:
			return 0, invalid("%s %#x is not 16-byte aligned", b.name, uint64(b.ptr))
		case uint64(b.ptr) > math.MaxUint64-b.n:
			return 0, invalid("%s %#x of %d bytes wraps around the address space", b.name, uint64(b.ptr), b.n)
		}
	}
	n := uint64(nbytes)
	// ResidualOut is written: it may be exactly Residual or In (each element is read before
	// the same thread writes it, and In is staged or read only before the peers are done
	// with it), and must not touch anything else it could corrupt before it is read.
	for _, b := range []buffer{{"Residual", a.Residual, n}, {"In", a.In, n}} {
		if b.ptr != a.ResidualOut && overlap2(a.ResidualOut, n, b.ptr, b.n) {
			return 0, invalid("ResidualOut %#x and %s %#x overlap without being equal (%d bytes): pass the same buffer, or buffers that do not overlap", uint64(a.ResidualOut), b.name, uint64(b.ptr), n)
		}
	}
	if !a.NoNorm {
		if overlap2(a.ResidualOut, n, a.Gamma, uint64(rowBytes)) {
			return 0, invalid("Gamma %#x overlaps ResidualOut %#x: pass a weight of its own", uint64(a.Gamma), uint64(a.ResidualOut))
		}
		// NormOut is written from rows of ResidualOut that other threads (and, through In,
		// other ranks) may still read: it overlaps nothing.
		for _, b := range bufs {
			if b.name != "NormOut" && overlap2(a.NormOut, n, b.ptr, b.n) {
				return 0, invalid("NormOut %#x overlaps %s %#x: pass an output of its own", uint64(a.NormOut), b.name, uint64(b.ptr))
			}
		}
	}
	switch {
	case stream == nil:
		return 0, invalid("nil stream")
	case stream.Context().Device() != c.dev:
		return 0, invalid("stream belongs to device %d, this rank runs on device %d", stream.Context().Device(), c.dev)
	}
	checked := map[driver.DevicePtr]bool{}
	for _, b := range bufs {
		if checked[b.ptr] {
			continue
		}
		checked[b.ptr] = true
		if err := c.checkPointer(b.name, b.ptr, b.n); err != nil {
			return 0, err
		}
	}
	return nbytes, nil
}

// overlap2 reports whether [a, a+an) and [b, b+bn) share a byte.
func overlap2(a driver.DevicePtr, an uint64, b driver.DevicePtr, bn uint64) bool {
	return a < b+driver.DevicePtr(bn) && b < a+driver.DevicePtr(an)
}
