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
	// (Rows*Hidden elements). It must not overlap any other buffer. Unused with NoNorm (but
	// see AllReduceResidualRMSNorm for NCCL's use of it).
	NormOut driver.DevicePtr
	// ResidualOut receives allreduce(In) + Residual (Rows*Hidden elements): the next
	// layer's residual. It may be Residual itself (in place, the usual case) or In itself;
	// any other overlap with them is refused.
	ResidualOut driver.DevicePtr
	// In is this rank's partial sum, the buffer that is all-reduced (Rows*Hidden elements).
	// It is read by the peers like AllReduce's src: registered, or under Capture, it is read
	// in place; otherwise it is first copied into the staging buffer (Push reads it in place
	// and sends it). Registered buffers are matched across ranks as for AllReduce: when one
	// rank passes a registered In, ResidualOut or NormOut, every rank passes its own
	// counterpart, registered in the same order. In is not written unless it is ResidualOut.
	In driver.DevicePtr
	// Residual is added to the all-reduced sum (Rows*Hidden elements).
	Residual driver.DevicePtr
	// Gamma is the norm's weight, one row (Hidden elements). Unused with NoNorm.
	Gamma driver.DevicePtr
	// Rows is the number of rows (tokens), at least 1. goccl's kernels take Rows*Hidden
	// elements up to Options.MaxBytes bytes (Push up to Options.PushMaxBytes); NCCL, where
	// the communicator has it, takes larger calls.
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
// all-reduce sums the ranks in the order AllReduce's kernel of the same algorithm does; the
// residual is added in f32 and the sum rounded once (ResidualOut); the norm reads those
// rounded values (internal/ref.Fused says exactly where every value is rounded, and
// reproduces the results bit for bit). When every rank passes the same Residual and Gamma
// values (replicated, as tensor parallelism has them), both outputs are bitwise identical on
// every rank. (They must be: the Columns kernel below adds, in each rank's band of columns,
// that rank's Residual for every rank.)
//
// Every rank must make the same call (same Rows, Hidden, DType, NoNorm) in the same order as
// its other collective calls; a kernel that sees a peer make another (a plain AllReduce
// included) records a KernelError matching ErrCallMismatch. Arguments are checked as
// AllReduce checks them, before anything is launched; a bad call returns an error wrapping
// ErrInvalidArgument.
//
// Algorithms, chosen per call by size and world size (FusedSelected answers which):
//   - OneShot: every rank reduces every row (rank order) and norms it. From 8 ranks, with
//     GPU-scope barriers (every rank on one GPU), calls of up to 512/ranks rows take OneShot's
//     Columns kernel instead, also where TwoShot would otherwise serve them: each rank reduces
//     its band of the columns of every row into every rank's ResidualOut (where it is visible
//     to the peers: registered, or under Capture, from 2 rows a rank; else, from 3 rows a
//     rank, through the tmp buffers, from which each rank gathers its rows), then norms its
//     own rows. Same bits as OneShot, 1/ranks of the loads a row.
//   - TwoShot, for more rows: each rank reduces and norms its band of rows, then every rank
//     gathers the finished rows; when ResidualOut and NormOut are both visible to the peers
//     (registered with Register, or under Capture), each rank writes its finished rows
//     straight into every rank's outputs instead, and the selection takes TwoShot from fewer
//     rows (at 8 ranks from 3 rows a rank direct, 9 through the gather; at 4 to 7 ranks from
//     24 and 40; at 2 and 3 ranks where the plain all-reduce would take it, from 8 rows a
//     rank).
//   - Push, only where AllReduceResidualRMSNormWith asks for it: every rank sends its rows
//     into every rank's push receive buffer, as AllReduce's Push does, and reduces and norms
//     every row itself, a block a row, with no barrier and no staging copy. Plain and fused
//     Push calls share the receive buffers and may follow each other in any order. Its sums
//     are rank order with +0.0 sent as -0.0, as AllReduce's Push (internal/ref.FusedPush).
//     It takes calls up to Options.PushMaxBytes. The selection never takes it: on an H100
//     with virtual ranks it was slower than OneShot at 1 to 16 rows of 8192 bf16 at 2, 4
//     and 8 ranks (one row: 3.9-4.1 against 3.3-3.4 us at 2 ranks, 8.2-8.3 against 6.4-6.5
//     at 8; docs/benchmarks.md, "Fused push, a block a row"; docs/kernel-abi.md says
//     where the time likely goes).
//   - NCCL, where goccl's kernels cannot take the call (past MaxBytes, or a communicator they
//     cannot serve) and the communicator has NCCL, or where NCCL is forced: see below.
//
// Options.Algorithm (or GOCCL_ALGO) forces an algorithm as it does for AllReduce; a
// communicator forced to Push selects as Auto (the fused Push is slower). The fused kernels
// are JIT-compiled on first use of each (algorithm, element type), or by LoadFused: a process
// that drives several ranks must call LoadFused first (see there).
//
// Through NCCL the call is two steps on stream: NCCL's all-reduce of In into a sum buffer,
// then the residual add and RMSNorm of this rank (ResidualRMSNorm's kernel) from that sum.
// The sum buffer is ResidualOut when it is not Residual (out of place, or ResidualOut ==
// In: the norm then reads and writes each element in one thread); else NormOut (each row's
// sum is read whole before the row's NormOut is written); else, with NoNorm, the rank's
// staging buffer, where goccl's kernels serve the communicator and the call fits MaxBytes.
// A NoNorm call in place over Residual is refused otherwise: pass a ResidualOut of its own.
// In is not written unless it is ResidualOut. NCCL sums in its own order and rounds the sum
// to DType before the residual is added: results match the kernels' within rounding, not
// bitwise, and are bitwise equal across ranks only as far as NCCL's all-reduce is.
func (c *Comm) AllReduceResidualRMSNorm(stream *driver.Stream, a FusedArgs) error {
	if c == nil {
		return errNilComm
	}
	return c.AllReduceResidualRMSNormWith(stream, a, Auto)
}

// AllReduceResidualRMSNormWith is AllReduceResidualRMSNorm with the algorithm chosen by the
// caller for this call: Auto (Options.Algorithm where set, else the selection), OneShot,
// TwoShot, Push or NCCL. A kernel the call does not fit (Push past PushMaxBytes, TwoShot
// without room for its bands) is refused. Every rank must pass the same algorithm. It exists
// for benchmarks and tests; services use AllReduceResidualRMSNorm.
func (c *Comm) AllReduceResidualRMSNormWith(stream *driver.Stream, a FusedArgs, algo Algorithm) error {
	if c == nil {
		return errNilComm
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Captured only on the stream Capture records, as AllReduce.
	defer c.endCall(c.callOn(stream))
	if err := c.usable(); err != nil {
		return err
	}
	nbytes, err := c.validateFused(stream, a)
	if err != nil {
		return err
	}
	// Direct: both outputs are visible to the peers (registered, or under Capture).
	residReg, residShared := c.sharedOutput(a.ResidualOut, uint64(nbytes))
	direct := residShared
	var normReg *Registration
	if direct && !a.NoNorm {
		normReg, direct = c.sharedOutput(a.NormOut, uint64(nbytes))
	}
	if algo, err = c.routeFused(algo, a, nbytes, direct, residShared); err != nil {
		return err
	}
	switch algo {
	case NCCL:
		return c.ncclFused(stream, a, nbytes)
	case Push:
		return c.fusedPush(stream, a)
	}
	kernel, _ := algo.kernel()
	if kernel == ptx.OneShot && c.columnsServe(a, residShared) {
		kernel = ptx.Columns
	}
	fn, occ, err := c.kernels.fusedKernel(c.scope, kernel, a.DType, fusedRowCache(kernel, c.size, a.Rows, c.blocks))
	if err != nil {
		// The peers may have launched this call: this rank is out of step with them from
		// here on. The kernel is compiled on the first call of its (algorithm, element type,
		// row cache); inside a stream capture of the caller's own in global mode the driver
		// may refuse to load a module, hence the advice.
		return c.fail(fmt.Errorf("collective: rank %d: %w (the fused kernels load on their first call: make one outside a global-mode stream capture)", c.rank, err))
	}
	// Columns reads and writes each element in one thread, as the direct TwoShot does: the
	// peers read the inputs in place
	inputAlgo := algo
	if kernel == ptx.Columns {
		inputAlgo = TwoShot
	}
	inputs, err := c.pullInput(stream, inputAlgo, a.ResidualOut, a.In, uint64(nbytes))
	if err != nil {
		return err
	}
	var residOuts, normOuts driver.DevicePtr
	if kernel == ptx.Columns && residShared {
		if residOuts, err = c.pullOutput(a.ResidualOut, uint64(nbytes), residReg); err != nil {
			return err
		}
	}
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
	blocks, threads := fusedShape(algo, a.Rows, hvec, c.size, c.fusedLimit(occ))
	if kernel == ptx.Columns {
		blocks = max(1, min(c.fusedLimit(occ), a.Rows)) // stage 2: a block per row
	}
	ws8 := 8 * c.size
	p := fusedParams{inputs: inputs, residOuts: residOuts, normOuts: normOuts, a: &a, hvec: hvec,
		rank: c.rank, errRec: c.errRec.DevicePtr(), timeout: c.timeout, sig: c.sig[:ws8], buf: c.tmp[:ws8],
		flags: c.fusedFlags(kernel, blocks, a.NoNorm), call: c.fusedCall(kernel, a, residOuts != 0)}
	p.pack(&c.args)
	return c.launch(stream, fn, blocks, threads, &c.args)
}

// LoadFused loads now the kernels that AllReduceResidualRMSNorm and ResidualRMSNorm launch
// for dt, which otherwise load on the first call of each (algorithm, element type): the fused
// one-shot (up to 8 ranks two builds: with the row cache, for calls of few rows, and without),
// Columns where the communicator may take it and the two-shot, all of the communicator's
// barrier scope, the push (its one build), and the single-rank residual add + RMSNorm kernel
// (on a communicator that NCCL alone serves, that one alone). It is not a collective call and
// launches nothing; a second call finds them loaded.
//
// Loading a module can wait for the kernels running on the device: with the driver's lazy
// loading (the default since CUDA 12.2) loading a kernel may synchronize the context. In a
// process that drives several ranks (NewGroup), a first call made while an earlier
// all-reduce of the process waits for a peer not launched yet then blocks until that
// all-reduce times out. Such a process calls LoadFused on every rank for each element type
// it will use, before its first all-reduce. With one process per rank a first call at worst
// waits for the rank's own work in flight.
func (c *Comm) LoadFused(dt DType) error {
	if c == nil {
		return errNilComm
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return err
	}
	if !dt.Valid() {
		return invalid("LoadFused: unsupported element type %v: use Float32, Float16 or BFloat16", dt)
	}
	if c.kernels == nil {
		_, err := c.ncclNormKernel(dt)
		return err
	}
	for _, k := range []struct {
		algo     ptx.Algorithm
		rowCache bool
	}{{ptx.OneShot, false}, {ptx.OneShot, true}, {ptx.Columns, false}, {ptx.TwoShot, false}, {ptx.Push, false}} {
		if k.rowCache && c.size > ptx.MaxRowCacheRanks || k.algo == ptx.Columns && !c.fusedColumns(1) {
			continue
		}
		scope := c.scope
		if k.algo == ptx.Push {
			scope = ptx.ScopeSystem // the one push build fusedPush launches
		}
		if _, _, err := c.kernels.fusedKernel(scope, k.algo, dt, k.rowCache); err != nil {
			return fmt.Errorf("collective: rank %d: %w", c.rank, err)
		}
	}
	if _, err := c.kernels.normKernel(dt); err != nil {
		return fmt.Errorf("collective: rank %d: %w", c.rank, err)
	}
	return nil
}

// fusedParams are the values of one launch of a kernel with ptx.FusedParams' list: the fused
// all-reduce, and with no tables, peers, error record or call, the single-rank norm kernel.
type fusedParams struct {
	// inputs is p_inputs: the registration slot of the ranks' In, or (one rank) In itself;
	// residOuts and normOuts the direct two-shot's output tables, else 0.
	inputs, residOuts, normOuts driver.DevicePtr
	a                           *FusedArgs
	hvec, rank                  int
	errRec                      driver.DevicePtr
	timeout                     uint64
	sig, buf                    []byte // p_sig and p_buf: a pointer (8 bytes) per rank
	flags                       uint32
	call                        uint64
}

// pack writes the launch's arguments into args in ptx.FusedParams order.
func (p *fusedParams) pack(args *driver.Args) {
	args.Reset()
	args.Ptr(p.inputs)
	args.Ptr(p.residOuts)
	args.Ptr(p.normOuts)
	args.Ptr(p.a.ResidualOut)
	args.Ptr(p.a.NormOut)
	args.Ptr(p.a.Residual)
	args.Ptr(p.a.Gamma)
	args.U32(uint32(p.a.Rows))
	args.U32(uint32(p.hvec))
	args.U32(uint32(p.rank))
	args.U32(math.Float32bits(p.a.Eps))
	args.Ptr(p.errRec)
	args.U64(p.timeout)
	args.Bytes(p.sig, 8)
	args.Bytes(p.buf, 8)
	args.U32(p.flags)
	args.U64(p.call)
}

// fusedFlags are the p_flags of a fused launch of kernel over blocks blocks.
func (c *Comm) fusedFlags(kernel ptx.Algorithm, blocks int, noNorm bool) uint32 {
	flags := c.triggerFlags(kernel, blocks)
	if noNorm {
		flags |= ptx.FlagNoNorm
	}
	return flags
}

// ncclFused serves a fused call through NCCL (see AllReduceResidualRMSNorm): NCCL's
// all-reduce of In into the sum buffer, then the single-rank residual add + RMSNorm kernel,
// one block per row, reading the sum from there. What it cannot serve is refused before
// anything is enqueued.
func (c *Comm) ncclFused(stream *driver.Stream, a FusedArgs, nbytes int64) error {
	var staging driver.DevicePtr
	if c.custom && nbytes <= c.opts.MaxBytes {
		// Only this rank's own kernels write its staging buffer, and the peers read it only
		// inside pull calls, complete before this call's work starts on stream.
		staging = c.peers[c.rank].Ptr() + driver.DevicePtr(c.layout.staging)
	}
	sum, err := ncclSumBuffer(a, staging)
	if err != nil {
		return err
	}
	fn, err := c.ncclNormKernel(a.DType)
	if err != nil {
		return err
	}
	if err := c.ncclAllReduce(stream, sum, a.In, a.Rows*a.Hidden, a.DType); err != nil {
		return err
	}
	a.In = sum
	return c.residualRMSNorm(stream, fn, a, a.Rows)
}

// ncclSumBuffer is where the NCCL route of a fused call leaves NCCL's sum, for the norm kernel
// to read as its In: ResidualOut unless it is Residual (out of place, or ResidualOut == In:
// the norm kernel reads each element of its In in the thread that then writes it to
// ResidualOut), else NormOut (it overlaps nothing; the norm kernel reads a row's sum whole,
// for the residual add, before its block writes the row's NormOut), else (NoNorm) staging,
// if not 0. In itself is never the sum unless it is ResidualOut: it is the caller's.
func ncclSumBuffer(a FusedArgs, staging driver.DevicePtr) (driver.DevicePtr, error) {
	switch {
	case a.ResidualOut != a.Residual:
		return a.ResidualOut, nil
	case !a.NoNorm:
		return a.NormOut, nil
	case staging != 0:
		return staging, nil
	}
	return 0, invalid("NoNorm with ResidualOut == Residual through NCCL leaves no buffer for NCCL's sum (the staging buffer takes calls up to MaxBytes where goccl's kernels serve the communicator): pass a ResidualOut of its own, or In as ResidualOut")
}

// ncclNormKernel returns the single-rank residual add + RMSNorm kernel of dt for the NCCL
// route: from the kernel set where the communicator has one, else straight from the
// process's module cache (a communicator that NCCL alone serves loads no kernel set).
func (c *Comm) ncclNormKernel(dt DType) (*driver.Function, error) {
	if c.kernels != nil {
		return c.normKernel(dt)
	}
	return c.heldNormKernel(&modules, dt)
}

// heldNorm is a kernel a communicator without a kernel set holds (heldNormKernel): its module,
// and its function once loaded.
type heldNorm struct {
	key moduleKey
	fn  *driver.Function
}

// heldNormKernel is ncclNormKernel's kernel for a communicator without a kernel set, from mc:
// the communicator holds its module through UnloadKernels until Close, and keeps the function,
// so that later calls take it as it is (building its name would allocate on every call).
func (c *Comm) heldNormKernel(mc *moduleCache, dt DType) (*driver.Function, error) {
	h := &c.heldNorms[dt]
	if h.fn != nil {
		return h.fn, nil
	}
	target, err := ptx.TargetFor(c.major, c.minor)
	if err != nil {
		return nil, fmt.Errorf("collective: rank %d: the residual add + RMSNorm after NCCL's all-reduce: %w", c.rank, err)
	}
	spec := ptx.NormSpec{DType: dt, Target: target}
	key := moduleKey{dev: c.dev, target: target, entry: spec.EntryName()}
	if h.key != key {
		// Held before it is loaded: from here on UnloadKernels keeps it, until Close.
		holdModule(key)
		h.key = key
	}
	m, _, err := mc.get(key, spec.Generate)
	if err != nil {
		return nil, c.fail(fmt.Errorf("collective: rank %d: %w", c.rank, err))
	}
	h.fn = m.fn
	return m.fn, nil
}

// fusedRowCacheRows is the most rows of a fused one-shot call that takes the kernel with the
// row cache (ptx.FusedSpec.RowCache). Measured on an H200, virtual ranks, hidden 8192 bf16,
// one graph per rank (arsmoke --fused -g, four passes alternating in one call, a build with one
// fused one-shot that carried the cache against one without it): at 2 ranks 3.21-3.53 against
// 3.37-3.81 us at 1 row, 3.42-3.62 against 3.72-4.09 at 8, 3.51-4.00 against 3.81-4.04 at 32,
// but 4.12-4.59 against 4.03-4.35 at 64 and 6.62-6.86 against 5.61-5.90 at 128 (two rows a
// block); at 4 and 8 ranks faster or even from 1 to 64 rows (docs/benchmarks.md, "Row cache").
const fusedRowCacheRows = 32

// fusedRowCache reports whether a fused call of rows rows takes the one-shot with the row
// cache: kernel OneShot, at most ptx.MaxRowCacheRanks ranks, at most fusedRowCacheRows rows,
// and one block per row (at most blocks, the communicator's grid).
func fusedRowCache(kernel ptx.Algorithm, worldSize, rows, blocks int) bool {
	return kernel == ptx.OneShot && worldSize <= ptx.MaxRowCacheRanks && rows <= min(fusedRowCacheRows, blocks)
}

// fusedColumns reports whether the Columns kernel (ptx.Columns: the one-shot's bits, each rank
// reducing its band of the columns of every row, then norming its own rows) may take a fused
// call of rows rows on this communicator: within fusedColumnsMaxRows, and with GPU-scope
// barriers only: its middle barrier releases the block's writes, which at system scope costs
// 1.3 to 3.3 us more at 4 and 8 ranks on one GPU (docs/kernel-abi.md, "Scope"), and it was
// measured at GPU scope alone. columnsServe adds the route. Every rank computes the same
// answer from the same call.
func (c *Comm) fusedColumns(rows int) bool {
	return c.scope == ptx.ScopeGPU && rows <= fusedColumnsMaxRows(c.size)
}

// columnsServe reports whether the Columns kernel takes a fused OneShot call (fusedColumns):
// into every rank's ResidualOut where it is shared, from fusedColumnsRowsPerRank rows a rank
// where the one-shot with the row cache would serve the call (fusedRowCache), from one row
// where it would not; else through the tmp buffers, from fusedColumnsTmpRowsPerRank rows a
// rank and where its bands fit them (ptx.ColumnsTmpBytes).
// Through tmp each rank gathers every vector of its rows from the vector's owner and stores
// it, which costs more than reading back its own ResidualOut: on an H200 (8 virtual ranks,
// hidden 8192 bf16, BenchmarkAllReduceResidualRMSNorm, outputs not shared, two passes) the
// Columns kernel through tmp took 8.33-8.39 us against the one-shot's 7.56-7.60 at 1 row,
// 8.71 against 8.03-8.07 at 8, 9.05-9.07 against 8.92 at 16, 9.74-9.79 against 11.67-11.68
// at 24 (two rows in some blocks: the one-shot norms them one after the other, Columns both
// at once), and 11.25-11.27 against 12.26-12.28 at 32.
func (c *Comm) columnsServe(a FusedArgs, residShared bool) bool {
	if !c.fusedColumns(a.Rows) {
		return false
	}
	if residShared {
		return a.Rows >= fusedColumnsRowsPerRank*c.size || !fusedRowCache(ptx.OneShot, c.size, a.Rows, c.blocks)
	}
	hvec := a.Hidden * a.DType.Size() / ptx.VectorBytes
	return a.Rows >= fusedColumnsTmpRowsPerRank*c.size && ptx.ColumnsTmpBytes(c.size, a.Rows, hvec) <= int64(c.layout.recv-c.layout.tmp)
}

// fusedColumnsTmpRowsPerRank is the fewest rows a rank of a Columns call through tmp: see
// columnsServe.
const fusedColumnsTmpRowsPerRank = 3

// fusedColumnsRowsPerRank is the fewest rows a rank of a direct Columns call where the one-shot
// with the row cache could take it instead. Below it the row cache's one-shot is the faster:
// on an H100 (8 virtual ranks, hidden 8192 bf16, one graph per rank, ResidualOut shared; two
// calls of three passes, docs/benchmarks.md, "Columns against the row cache") it took 4.93 to
// 4.97 us against Columns' 5.82 to 5.89 at one row, 5.42 to 5.52 against 5.93 to 6.01 at 8
// rows and 5.87 to 5.91 against 6.09 to 6.15 at 12, and lost at 16 (6.39 to 6.47 against 6.25
// to 6.32).
const fusedColumnsRowsPerRank = 2

// fusedCall is the call fingerprint of a fused launch of kernel; direct says that it writes
// into every rank's outputs through their table (p_resid_outs). A Columns launch through the
// tmp buffers (not direct) is marked Staged, and a direct TwoShot Direct, so that ranks that
// disagree on the route (one rank's outputs registered, a peer's not) are a mismatch rather
// than wrong rows: a TwoShot through tmp would otherwise gather stale rows from a direct
// peer's tmp buffer, the two kernels passing as many barriers.
func (c *Comm) fusedCall(kernel ptx.Algorithm, a FusedArgs, direct bool) uint64 {
	call := ptx.FusedCall(kernel, a.DType, a.Rows, a.Hidden, a.NoNorm)
	call.Staged = kernel == ptx.Columns && !direct
	call.Direct = kernel == ptx.TwoShot && direct
	return call.Fingerprint()
}

// fusedColumnsMaxRows is the most rows of a fused call that the Columns kernel takes at
// worldSize ranks (0: none): from 8 ranks, up to 512/worldSize rows (64 at 8 ranks, 32 at
// 16). Measured on an H200, virtual ranks, hidden 8192 bf16, one graph per rank (arsmoke
// --fused -g, ResidualOut shared; docs/benchmarks.md, "Columns"), us: at 8 ranks Columns
// against the one-shot 7.60-7.88 against 10.24-10.30 at 24 rows (below 2 rows a rank the
// row cache's one-shot wins: fusedColumnsRowsPerRank). Against the direct TwoShot, with the
// blocks of more than one row norming two at once (the grid is 16 blocks at 8 ranks on one
// GPU, 8 at 16): at 8 ranks 10.23-10.60 against 11.73-11.91 at 48 rows, 11.42-11.76 against
// 11.88-12.51 at 64, 16.04-16.23 against 14.37-14.70 at 96 (TwoShot from there); at 16 ranks
// 10.89-11.09 against 13.62-14.98 at 16, 14.30-14.34 against 15.65-16.39 at 32, 18.11-18.27
// against 18.41-18.70 at 48, 23.46-24.30 against 22.43-23.33 at 64. Below 8 ranks the
// one-shot's loads are few enough that Columns' middle barrier and second read of the row
// cost more: 4.23-4.30 against 3.05-3.14 at 2 ranks and 1 row, 4.69-4.88 against 4.06-4.20
// at 4 ranks.
func fusedColumnsMaxRows(worldSize int) int {
	if worldSize < fusedColumnsMinRanks {
		return 0
	}
	return fusedColumnsRankRows / worldSize
}

// fusedColumnsMinRanks and fusedColumnsRankRows bound the Columns kernel's calls: see
// fusedColumnsMaxRows.
const (
	fusedColumnsMinRanks = 8
	fusedColumnsRankRows = 512
)

// fusedLimit is the largest grid of a fused kernel that fits occ blocks per SM. The ranks
// sharing a GPU sized their grids (c.blocks) for the plain kernels' c.blocksPerSM, so that
// every block of every rank is resident at once and PDL's early launches leave room
// (ptx.EarlyTriggerRoom). A fused kernel that fits fewer (its registers, as the driver's JIT
// assigns them) gets a grid that takes no more of the GPU: c.blocks*occ/c.blocksPerSM. Every
// rank computes the same limit: the ranks sharing a GPU load the same kernel for the same
// device. With a GPU per rank nothing needs to be resident at once: the grid stays.
func (c *Comm) fusedLimit(occ int) int {
	if c.ranksOnGPU <= 1 || occ >= c.blocksPerSM {
		return c.blocks
	}
	return max(1, c.blocks*occ/c.blocksPerSM)
}

// fusedShape is the grid of a fused launch: one block per row (OneShot) or per row of the
// largest band (TwoShot, ceil(rows/ws)), each of ptx.FusedThreads threads, at most limit. A
// TwoShot band of at most fusedSpreadRows rows has each row spread over several blocks of
// fewer threads (ptx.FusedPieces), so that more SMs move the band's data; the blocks of a row
// then meet once in the kernel to add their sums of squares, which costs 1 to 1.5 us on an
// H200. Measured there with virtual ranks, hidden 8192 bf16 (arsmoke --fused -g): 8 ranks,
// 4 rows a rank, 9.8 to 10.3 against one-shot's 10.7 to 11.4 us; 8 rows a rank, 11.5 to 12.5
// spread against 11.4 to 11.7 with a block per row (no gain); and spread one-shot rows were
// 1 to 1.5 us slower at 1 to 32 rows and 2 to 8 ranks, so OneShot never spreads. Every rank
// computes the same shape from the same call.
func fusedShape(algo Algorithm, rows, rowVectors, worldSize, limit int) (blocks, threads int) {
	work, pieces, threads := rows, 1, ptx.FusedThreads(rowVectors)
	if algo == TwoShot {
		work = (rows + worldSize - 1) / worldSize
		if work <= fusedSpreadRows {
			pieces, threads = ptx.FusedPieces(work, rowVectors, limit, fusedMinThreads)
		}
	}
	return max(1, min(limit, work*pieces)), threads
}

// fusedSpreadRows is the largest TwoShot band whose rows are spread over several blocks
// (see fusedShape).
const fusedSpreadRows = 4

// fusedMinThreads is the smallest block a TwoShot launch spreads a row over: two warps, as
// the plain kernels' smallest blocks (MinThreadsPerBlock).
const fusedMinThreads = MinThreadsPerBlock

// fusedTwoShotRowsPerRank is the fewest rows per rank for which the fused TwoShot is chosen
// at worldSize ranks, direct (both outputs shared: TwoShot writes the finished rows straight
// into every rank's outputs) or not (the rows go through tmp, then a second barrier and a
// gather pass: 17.3 against 11.6 us at 8 ranks and 32 rows in BenchmarkAllReduceResidualRMSNorm);
// 0 leaves calls of at least fusedPlainTableRowsPerRank rows a rank to the plain all-reduce's
// table.
func fusedTwoShotRowsPerRank(worldSize int, direct bool) int {
	switch {
	case worldSize >= 8 && direct:
		return 3
	case worldSize >= 8:
		return 9
	case worldSize >= 4 && direct:
		return 24
	case worldSize >= 4:
		return 40
	}
	return 0
}

// fusedPlainTableRowsPerRank is where the fused call of 2 or 3 ranks starts to follow the plain
// all-reduce's table.
const fusedPlainTableRowsPerRank = 8

// selectFused is the fused call's selection table. From 4 ranks: TwoShot from
// fusedTwoShotRowsPerRank rows a rank, OneShot below. Measured with virtual ranks on an H200,
// hidden 8192 bf16. Direct, one graph per rank (arsmoke --fused -g, -a oneshot against -a
// twoshot): at 8 ranks TwoShot, its few rows a rank spread over several blocks (fusedShape),
// took 9.96 against OneShot's 10.65 us at 24 rows and 11.80 against 17.59 at 64, but 9.65
// against 8.14 at 16; at 4 ranks 8.43 against 10.07 at 96 rows and 8.40 against 7.01 at 64.
// Not direct (BenchmarkAllReduceResidualRMSNorm, fused-oneshot against fused-twoshot, two
// passes): at 8 ranks OneShot 11.74-11.85 against 17.24-17.26 us at 24 rows, 18.09-18.25
// against 19.12-19.13 at 64, TwoShot 25.55-25.56 against 35.51-35.52 at 128 (the lines cross
// near 69 rows: 9 a rank); at 4 ranks OneShot 10.35-10.40 against 11.75-11.78 at 128 rows, the
// largest measured (the lines, 7.1 and 10.8 us at 64, cross near 167 rows: 40 a rank). At 2
// and 3 ranks, OneShot below fusedPlainTableRowsPerRank rows a rank (TwoShot's reduce would
// have a handful of rows), then the plain table (with direct as for the plain all-reduce).
func selectFused(major, worldSize, rows int, nbytes int64, direct, gpuScope bool) Algorithm {
	if from := fusedTwoShotRowsPerRank(worldSize, direct); from > 0 {
		if rows >= from*worldSize {
			return TwoShot
		}
		return OneShot
	}
	if rows < fusedPlainTableRowsPerRank*worldSize {
		return OneShot
	}
	// pushMax 0: the plain table never answers Push.
	return selectAlgorithm(major, worldSize, nbytes, 0, direct, gpuScope)
}

// routeFused resolves the algorithm of a fused call and refuses what its engine cannot take;
// direct says that both outputs are shared (TwoShot then needs no tmp), residShared that
// ResidualOut is (the Columns kernel's direct route: columnsServe). Auto is
// Options.Algorithm where set (Push selects as Auto: see AllReduceResidualRMSNorm), else NCCL
// where only NCCL can serve the call, else the selection table.
func (c *Comm) routeFused(algo Algorithm, a FusedArgs, nbytes int64, direct, residShared bool) (Algorithm, error) {
	if algo == Auto {
		algo = c.opts.Algorithm
		if algo == Push {
			algo = Auto
		}
	}
	rowBytes := int64(a.Hidden * a.DType.Size())
	tmpFits := func() bool {
		return direct || ptx.FusedTmpBytes(c.size, a.Rows, rowBytes) <= int64(c.layout.recv-c.layout.tmp)
	}
	switch algo {
	case Auto:
		if c.nccl != nil && (!c.custom || nbytes > c.opts.MaxBytes) {
			return NCCL, nil
		}
		if err := c.fusedKernelsServe(a, nbytes); err != nil {
			return 0, err
		}
		algo = selectFused(c.major, c.size, a.Rows, nbytes, direct, c.scope == ptx.ScopeGPU)
		if algo == TwoShot && !tmpFits() || c.columnsServe(a, residShared) {
			// (OneShot's Columns kernel beats TwoShot where it serves: see fusedColumnsMaxRows)
			algo = OneShot
		}
		return algo, nil
	case NCCL:
		if c.nccl == nil {
			return 0, invalid("the call needs NCCL, which this communicator does not have: %s", c.ncclWhy)
		}
		return NCCL, nil
	case OneShot, TwoShot, Push:
		if err := c.fusedKernelsServe(a, nbytes); err != nil {
			return 0, err
		}
		switch {
		case algo == Push && nbytes > c.opts.PushMaxBytes:
			// The kernel writes the whole call into every peer's receive slot.
			return 0, invalid("%d rows of %d %v elements are %d bytes, more than PushMaxBytes (%d) for the Push algorithm: use Auto, or raise Options.PushMaxBytes", a.Rows, a.Hidden, a.DType, nbytes, c.opts.PushMaxBytes)
		case algo == TwoShot && !tmpFits():
			return 0, invalid("TwoShot needs %d bytes of tmp buffer for %d rows of %d bytes over %d ranks, the communicator has %d: use OneShot, or raise Options.MaxBytes",
				ptx.FusedTmpBytes(c.size, a.Rows, rowBytes), a.Rows, rowBytes, c.size, c.layout.recv-c.layout.tmp)
		}
		return algo, nil
	}
	return 0, invalid("unknown algorithm %v for the fused all-reduce + RMSNorm: use Auto, OneShot, TwoShot, Push or NCCL", algo)
}

// fusedKernelsServe refuses a fused call that goccl's kernels cannot take, saying what can.
func (c *Comm) fusedKernelsServe(a FusedArgs, nbytes int64) error {
	switch {
	case !c.custom:
		return invalid("the fused all-reduce + RMSNorm: goccl's kernels cannot serve this communicator (%s): %s", c.noCustomWhy, c.ncclAlternative())
	case nbytes > c.opts.MaxBytes:
		return invalid("%d rows of %d %v elements are %d bytes, more than MaxBytes (%d): raise Options.MaxBytes, split the rows, or %s", a.Rows, a.Hidden, a.DType, nbytes, c.opts.MaxBytes, c.ncclAlternative())
	}
	return nil
}

// ncclAlternative says how NCCL could take a fused call that the kernels cannot.
func (c *Comm) ncclAlternative() string {
	if c.nccl != nil {
		return "use Auto or NCCL, which takes it"
	}
	return "make libnccl available so that NCCL takes it (" + c.ncclWhy + ")"
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
	set, err := a.buffers(nbytes, rowBytes)
	if err != nil {
		return 0, err
	}
	bufs := set.list()
	if err := c.checkStream(stream); err != nil {
		return 0, err
	}
	// Each pointer once: ResidualOut may be Residual or In.
next:
	for i, b := range bufs {
		for _, earlier := range bufs[:i] {
			if earlier.ptr == b.ptr {
				continue next
			}
		}
		if err := c.checkPointer(b.name, b.ptr, b.n); err != nil {
			return 0, err
		}
	}
	return nbytes, nil
}

// fusedBuffer is one buffer of a fused call, as validateFused checks it.
type fusedBuffer struct {
	name string
	ptr  driver.DevicePtr
	n    uint64
}

// fusedBuffers are the buffers of a fused call, held by value: the check runs for every
// layer, and a slice grown by append would allocate each time.
type fusedBuffers struct {
	b [5]fusedBuffer
	n int
}

// list returns the buffers, backed by f.
func (f *fusedBuffers) list() []fusedBuffer { return f.b[:f.n] }

// buffers returns the call's buffers (In, ResidualOut, Residual, and with the norm NormOut
// and Gamma) of nbytes each (Gamma of rowBytes), checked as far as that needs no driver:
// none nil, each 16-byte aligned and within the address space, and only the overlaps the
// kernels allow.
func (a *FusedArgs) buffers(nbytes, rowBytes int64) (fusedBuffers, error) {
	set := fusedBuffers{b: [5]fusedBuffer{{"In", a.In, uint64(nbytes)}, {"ResidualOut", a.ResidualOut, uint64(nbytes)},
		{"Residual", a.Residual, uint64(nbytes)}, {"NormOut", a.NormOut, uint64(nbytes)}, {"Gamma", a.Gamma, uint64(rowBytes)}}, n: 5}
	if a.NoNorm {
		set.n = 3
	}
	bufs := set.list()
	for _, b := range bufs {
		switch {
		case b.ptr == 0:
			return fusedBuffers{}, invalid("nil %s", b.name)
		case b.ptr%ptx.VectorBytes != 0:
			return fusedBuffers{}, invalid("%s %#x is not 16-byte aligned", b.name, uint64(b.ptr))
		case uint64(b.ptr) > math.MaxUint64-b.n:
			return fusedBuffers{}, invalid("%s %#x of %d bytes wraps around the address space", b.name, uint64(b.ptr), b.n)
		}
	}
	n := uint64(nbytes)
	// ResidualOut is written: it may be exactly Residual or In (each element is read before
	// the same thread writes it, and In is staged or read only before the peers are done
	// with it), and must not touch anything else it could corrupt before it is read.
	for _, b := range [...]fusedBuffer{{"Residual", a.Residual, n}, {"In", a.In, n}} {
		if b.ptr != a.ResidualOut && overlap2(a.ResidualOut, n, b.ptr, b.n) {
			return fusedBuffers{}, invalid("ResidualOut %#x and %s %#x overlap without being equal (%d bytes): pass the same buffer, or buffers that do not overlap", uint64(a.ResidualOut), b.name, uint64(b.ptr), n)
		}
	}
	if !a.NoNorm {
		if overlap2(a.ResidualOut, n, a.Gamma, uint64(rowBytes)) {
			return fusedBuffers{}, invalid("Gamma %#x overlaps ResidualOut %#x: pass a weight of its own", uint64(a.Gamma), uint64(a.ResidualOut))
		}
		// NormOut is written from rows of ResidualOut that other threads (and, through In,
		// other ranks) may still read: it overlaps nothing.
		for _, b := range bufs {
			if b.name != "NormOut" && overlap2(a.NormOut, n, b.ptr, b.n) {
				return fusedBuffers{}, invalid("NormOut %#x overlaps %s %#x: pass an output of its own", uint64(a.NormOut), b.name, uint64(b.ptr))
			}
		}
	}
	return set, nil
}

// overlap2 reports whether [a, a+an) and [b, b+bn) share a byte.
func overlap2(a driver.DevicePtr, an uint64, b driver.DevicePtr, bn uint64) bool {
	return a < b+driver.DevicePtr(bn) && b < a+driver.DevicePtr(an)
}
