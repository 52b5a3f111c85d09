package ptx

import (
	"bytes"
	"fmt"

	"github.com/goccl/goccl/dtype"
)

// The fused all-reduce + residual add + RMSNorm kernels (templates/fused.ptx.tmpl,
// docs/kernel-abi.md "Fused all-reduce + RMSNorm"): ResidualOut = allreduce(In) + Residual,
// NormOut = ResidualOut * 1/sqrt(mean(ResidualOut^2) + eps) * Gamma, row by row.

// Operations of the fused kernels' call fingerprints (see FusedCall).
const (
	// OpAllReduceRMSNorm is the all-reduce, the residual add and the RMSNorm.
	OpAllReduceRMSNorm CallOp = 2
	// OpAllReduceResidual is the all-reduce and the residual add alone (FlagNoNorm).
	OpAllReduceResidual CallOp = 3
)

// FlagNoNorm (a bit of p_flags) makes a fused kernel stop after the residual add:
// ResidualOut only, p_norm_out and p_gamma are not read.
const FlagNoNorm = 2

// Row sizes the fused kernels take: Hidden elements per row, a multiple of
// HiddenMultiple in [MinHidden, MaxHidden], so that a row is whole 16-byte vectors of
// every element type and one block of at most ThreadsPerBlock threads covers it in a few
// vectors per thread.
const (
	MinHidden      = 2048
	MaxHidden      = 16384
	HiddenMultiple = 8
)

// MaxFusedRows is one more than the largest row count of a fused call: the call fingerprint
// keeps the rows in 24 bits.
const MaxFusedRows = 1 << 24

// FusedCall is the call fingerprint of a fused call: Count holds the rows in bits 0..23
// and the hidden size in bits 24..39, so that ranks that split the same elements into other
// rows are caught too. noNorm picks OpAllReduceResidual.
func FusedCall(algo Algorithm, dt dtype.DType, rows, hidden int, noNorm bool) Call {
	op := OpAllReduceRMSNorm
	if noNorm {
		op = OpAllReduceResidual
	}
	return Call{Op: op, Algo: algo, DType: dt, Count: uint64(hidden)<<24 | uint64(rows)&(MaxFusedRows-1)}
}

// FusedShape is the fingerprint's Count split back into rows and hidden size.
func FusedShape(count uint64) (rows, hidden int) {
	return int(count & (MaxFusedRows - 1)), int(count >> 24 & 0xFFFF)
}

// FusedThreads is the block size of a fused launch (and of the single-rank RMSNorm kernel)
// for rows of rowVectors 16-byte vectors: one thread per vector, rounded up to whole warps,
// at most ThreadsPerBlock. The kernels' sum of squares depends on it (each thread sums its
// vectors tid, tid+ntid, ..), so internal/ref.ResidualRMSNorm takes the same number.
func FusedThreads(rowVectors int) int {
	return min(ThreadsPerBlock, max(32, (rowVectors+31)/32*32))
}

// FusedParams returns the parameter list of the fused kernels and of the single-rank
// RMSNorm kernel of the given world size (1 for that one), in launch order: the one Go-side
// declaration, packed from by the launcher and checked against every generated .entry.
func FusedParams(worldSize int) []Param {
	return []Param{
		{"p_inputs", 8, 8},     // registration table of ws input pointers (RMSNorm: the summed input)
		{"p_resid_outs", 8, 8}, // two-shot direct: table of every rank's ResidualOut, else 0
		{"p_norm_outs", 8, 8},  // two-shot direct: table of every rank's NormOut (unless FlagNoNorm), else 0
		{"p_resid_out", 8, 8},  // own ResidualOut
		{"p_norm_out", 8, 8},   // own NormOut (unused with FlagNoNorm)
		{"p_residual", 8, 8},   // own Residual
		{"p_gamma", 8, 8},      // own Gamma (unused with FlagNoNorm)
		{"p_rows", 4, 4},
		{"p_hvec", 4, 4}, // 16-byte vectors per row
		{"p_rank", 4, 4},
		{"p_eps", 4, 4}, // f32
		{"p_err", 8, 8},
		{"p_timeout", 8, 8},
		{"p_sig", 8 * worldSize, 8},
		{"p_buf", 8 * worldSize, 8}, // two-shot: tmp buffers
		{"p_flags", 4, 4},           // FlagEarlyTrigger, FlagNoNorm, FlagEntryTrigger
		{"p_call", 8, 8},            // FusedCall's fingerprint
	}
}

// FusedPushParams returns the parameter list of the fused push kernel of the given world size,
// in launch order: the one Go-side declaration, packed from by the launcher and checked
// against every generated .entry. It is FusedParams without the registration tables (push
// reads its own input and writes no peer's output), and with push's receive slot.
func FusedPushParams(worldSize int) []Param {
	return []Param{
		{"p_input", 8, 8}, // own In, read in place (the peers never read it)
		{"p_resid_out", 8, 8},
		{"p_norm_out", 8, 8}, // unused with FlagNoNorm
		{"p_residual", 8, 8},
		{"p_gamma", 8, 8}, // unused with FlagNoNorm
		{"p_rows", 4, 4},
		{"p_hvec", 4, 4},
		{"p_rank", 4, 4},
		{"p_eps", 4, 4},
		{"p_err", 8, 8},
		{"p_timeout", 8, 8},
		{"p_sig", 8 * worldSize, 8},
		{"p_buf", 8 * worldSize, 8}, // every rank's push receive buffer
		{"p_slot", 8, 8},            // bytes of one receive slot, PushSlotBytes(PushMaxBytes)
		{"p_flags", 4, 4},           // FlagEarlyTrigger, FlagNoNorm
		{"p_call", 8, 8},            // FusedCall(Push, ...)'s fingerprint
	}
}

// A fused two-shot call of few rows a rank spreads each row of its band over several blocks
// (FusedPieces), so that more SMs move its data: each block then holds the sums of squares of
// only its warps, and the row's blocks meet once per row, in the kernel, to add them all. They
// meet in the own signal region, which only this rank's kernels write.
const (
	// FusedRowSyncOffset is the byte offset, in the signal region, of fused_rows[MaxSplitRows]
	// (u32): the arrivals of the blocks of a spread row, counted by atom.inc and back at 0 when
	// the last one arrives, so that every call finds them 0 (the region is zeroed once at
	// creation). It follows the call's 64 reserved vectors.
	FusedRowSyncOffset = CallOffset + MaxBlocks*VectorBytes
	// MaxSplitRows bounds the rows of a rank's two-shot band that the fused kernels spread
	// over several blocks: at least two blocks each, at most MaxBlocks blocks.
	MaxSplitRows = MaxBlocks / 2
	// MaxPieces is the most blocks a row is spread over: one warp each.
	MaxPieces = ThreadsPerBlock / 32
	// FusedSumsOffset is the byte offset, in the signal region, of
	// fused_sums[MaxSplitRows][MaxPieces] (f32): the warp sums of squares of a spread row,
	// each written by its warp's lane 0 before the row's blocks meet on fused_rows[row], read
	// by every block of the row after. It follows fused_rows.
	FusedSumsOffset = FusedRowSyncOffset + 4*MaxSplitRows
)

// FusedPieces is the number of blocks a fused kernel spreads each of rows rows of rowVectors
// 16-byte vectors over, with a grid of at most blocks blocks, and the threads of each block:
// a row's FusedThreads(rowVectors) threads (the reference's, whose order of the sum of
// squares the kernel keeps) split into pieces of whole warps, at least minThreads (a multiple
// of 32) each, as many as fit rows*pieces <= blocks. pieces 1 is one block per row (rows b,
// b+nctaid, .. in block b); then threads is FusedThreads(rowVectors). For the two-shot
// kernels rows is the largest band, ceil(rows/ws).
func FusedPieces(rows, rowVectors, blocks, minThreads int) (pieces, threads int) {
	t := FusedThreads(rowVectors)
	warps := t / 32
	pieces = 1
	if rows <= MaxSplitRows {
		for p := warps; p >= 2; p-- {
			if warps%p == 0 && rows*p <= blocks && t/p >= minThreads {
				pieces = p
				break
			}
		}
	}
	return pieces, t / pieces
}

// FusedTmpBytes is the tmp buffer the fused two-shot needs on a rank of worldSize ranks for
// rows rows of rowBytes bytes: its largest band of rows, then their inv slots (FusedInvBytes).
func FusedTmpBytes(worldSize, rows int, rowBytes int64) int64 {
	band := (rows + worldSize - 1) / worldSize
	return int64(band)*rowBytes + FusedInvBytes(band)
}

// FusedInvBytes is the room the fused two-shot takes after a band of rows in its tmp buffer
// for the rows' inv = 1/sqrt(mean + eps): one f32 per row and piece (row j's piece k at slot
// j*pieces + k, FusedPieces), where each block that took part of a row leaves the row's inv
// for the block that reads that part back. One per row, or, where rows are spread over several
// blocks, one per block of the grid: at most max(band, MaxBlocks) slots.
func FusedInvBytes(band int) int64 {
	return 4 * int64(max(band, MaxBlocks))
}

// Columns is an algorithm of the fused kernels alone (FusedSpec; there is no plain kernel of
// it): the one-shot's sums, each rank reducing its band of the columns of every row and
// storing it into every rank's ResidualOut, a release/acquire barrier, then every rank norming
// its own rows (templates/fused.ptx.tmpl, "fused_columns"). Its results are the one-shot's,
// bit for bit; each rank loads 1/ws of a row's inputs instead of all of them, which pays where
// a call has too few rows to spread the one-shot's loads over the GPU. Its ResidualOut must be
// shared (the registration table p_resid_outs).
const Columns Algorithm = Push + 1

// ColumnsTmpBytes is the tmp buffer the Columns kernel takes on each rank through tmp (its
// ResidualOut not shared) for rows rows of rowVectors 16-byte vectors at worldSize ranks: a
// slot of ceil(rowVectors/worldSize) vectors a row, the most columns a rank owns.
func ColumnsTmpBytes(worldSize, rows, rowVectors int) int64 {
	return int64(rows) * int64((rowVectors+worldSize-1)/worldSize) * VectorBytes
}

// FusedSpec names a fused all-reduce + residual add + RMSNorm kernel: OneShot (every rank
// reduces and norms every row), TwoShot (each rank its band of rows, then an all-gather of
// the finished rows), Columns (each rank a band of every row's columns) or Push (every rank
// sends its rows into every rank's push receive buffer, then reduces and norms every row,
// without a barrier), for one element type, world size, target and barrier scope. Push has no barrier: its kernel is the same in every scope
// (only the name differs), and collective loads the ScopeSystem one.
type FusedSpec struct {
	Algo      Algorithm // OneShot, TwoShot, Columns or Push
	DType     dtype.DType
	WorldSize int
	Target    Target
	Scope     Scope
	// RowCache (OneShot of at most MaxRowCacheRanks ranks) builds the one-shot that keeps
	// each thread's first two vectors of a row in registers from its sum pass to its norm
	// pass, with gamma's loaded during the block sum, so that the norm pass of a row reads
	// nothing back (two trips to memory a row at hidden 8192 of 16-bit elements), and splits
	// its exit barrier: a block arrives after the sum pass of its last row and waits at the
	// end. It is the faster kernel for calls of few rows, a block each, and was slower than
	// the plain one at 2 ranks and 64 to 128 rows on an H200: collective picks it by the
	// call's rows.
	RowCache bool
}

// MaxRowCacheRanks is the most ranks of a fused one-shot with RowCache: past 8 its loads
// leave no registers for the cache (ptxas gives the 16-rank kernel 122 of its 128 without).
const MaxRowCacheRanks = 8

func (s FusedSpec) plain() Spec {
	algo := s.Algo
	if algo == Columns {
		algo = OneShot // the one-shot's sums, in rank order
	}
	return Spec{Algo: algo, DType: s.DType, WorldSize: s.WorldSize, Target: s.Target, Scope: s.Scope}
}

// Validate reports whether the spec names a fused kernel that exists.
func (s FusedSpec) Validate() error {
	if s.Algo != OneShot && s.Algo != TwoShot && s.Algo != Push && s.Algo != Columns {
		return fmt.Errorf("fused kernel spec: unknown algorithm %d: the fused kernels exist for ptx.OneShot, ptx.TwoShot, ptx.Push and ptx.Columns", int(s.Algo))
	}
	if err := s.plain().Validate(); err != nil {
		return fmt.Errorf("fused %w", err)
	}
	if s.RowCache && (s.Algo != OneShot || s.WorldSize > MaxRowCacheRanks) {
		return fmt.Errorf("fused kernel spec: RowCache is for the one-shot of at most %d ranks, not %v of %d", MaxRowCacheRanks, s.Algo, s.WorldSize)
	}
	return nil
}

// EntryName returns the kernel's .entry name, goccl_fused_<algo>_<dtype>_w<ws>, with
// <algo> "oneshot_rc" for RowCache and the scope's suffix appended as Spec.EntryName does.
func (s FusedSpec) EntryName() string {
	algo := s.Algo.String()
	if s.RowCache {
		algo += "_rc"
	}
	return fmt.Sprintf("goccl_fused_%s_%s_w%d%s", algo, s.DType, s.WorldSize, s.Scope.suffix())
}

// Params returns the kernel's parameter list: FusedPushParams for Push, else FusedParams.
func (s FusedSpec) Params() []Param {
	if s.Algo == Push {
		return FusedPushParams(s.WorldSize)
	}
	return FusedParams(s.WorldSize)
}

// Generate returns the PTX module of the kernel, as Spec.Generate does.
func (s FusedSpec) Generate() ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	k := newKernel(s.plain())
	k.Entry = s.EntryName()
	// Columns norms rows it reads back whole, with the one-shot's row cache; push keeps its
	// first vectors of a row in registers the same way
	k.rowCache = s.RowCache || s.Algo == Columns || s.Algo == Push
	return execute("fused_"+s.Algo.String(), k)
}

// NormSpec names the single-rank residual add + RMSNorm kernel: the second kernel of the
// unfused pair (an all-reduce, then this), which the fused kernels are measured against.
type NormSpec struct {
	DType  dtype.DType
	Target Target
}

// EntryName returns "goccl_rmsnorm_<dtype>".
func (s NormSpec) EntryName() string { return fmt.Sprintf("goccl_rmsnorm_%s", s.DType) }

// Generate returns the PTX module of the kernel. Its parameters are FusedParams(1).
func (s NormSpec) Generate() ([]byte, error) {
	if !s.DType.Valid() {
		return nil, fmt.Errorf("rmsnorm kernel spec: unsupported element type %v: use dtype.Float32, dtype.Float16 or dtype.BFloat16", s.DType)
	}
	if !s.Target.valid() {
		return nil, fmt.Errorf("rmsnorm kernel spec: unknown target %d: use ptx.SM80 or ptx.SM90 (see ptx.TargetFor)", int(s.Target))
	}
	k := newKernel(Spec{Algo: OneShot, DType: s.DType, WorldSize: 1, Target: s.Target})
	k.Entry = s.EntryName()
	k.rowCache = true
	return execute("rmsnorm", k)
}

func execute(name string, k *kernel) ([]byte, error) {
	tmpl, err := parsedTemplates()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, name, k); err != nil {
		return nil, fmt.Errorf("generate %s for %s: %w", k.Entry, k.Target, err)
	}
	return squeezeBlankLines(buf.Bytes()), nil
}

// elem is one element of a 16-byte vector: which 32-bit word holds it and which part of
// the word ("lo": the lower-addressed half, "hi", or "all" for f32); E is its index.
type elem struct {
	Word int
	Part string
	E    int
}

// ElemList lists the elements of a vector in address order.
func (k *kernel) ElemList() []elem {
	var es []elem
	for w := range 4 {
		if k.Elems == 4 {
			es = append(es, elem{w, "all", w})
			continue
		}
		es = append(es, elem{w, "lo", 2 * w}, elem{w, "hi", 2*w + 1})
	}
	return es
}

// OWords names the registers %o0..%o3.
func (k *kernel) OWords() []string { return []string{"%o0", "%o1", "%o2", "%o3"} }

// FlagNoNorm is the p_flags bit of FlagNoNorm, for the templates.
func (k *kernel) FlagNoNorm() int { return FlagNoNorm }

// FusedRowSync is FusedRowSyncOffset, for the templates.
func (k *kernel) FusedRowSync() int { return FusedRowSyncOffset }

// FusedSums is FusedSumsOffset, for the templates.
func (k *kernel) FusedSums() int { return FusedSumsOffset }

// MaxPieces is MaxPieces, for the templates: the warp sums of one row in fused_sums.
func (k *kernel) MaxPieces() int { return MaxPieces }

// ThreadsPerBlock is ThreadsPerBlock, for the templates.
func (k *kernel) ThreadsPerBlock() int { return ThreadsPerBlock }

// TreeOffsets are the shfl.down distances of the warp's sum tree, in order.
func (k *kernel) TreeOffsets() []int { return []int{16, 8, 4, 2, 1} }

// blockWarps is the most warps of a block (ThreadsPerBlock / 32): the entries of the kernels'
// shared warp sums (wsum).
const blockWarps = ThreadsPerBlock / 32

// BlockWarps is blockWarps, for the templates.
func (k *kernel) BlockWarps() int { return blockWarps }

// treeAdd is one add of warpsumtree: entry Dst += entry Src.
type treeAdd struct{ Dst, Src int }

// WarpSumTree lists, in order, the adds by which every thread of a block sums the block's
// blockWarps warp sums in registers: TreeOffsets' tree (lane l adds lane l+d) from d = 8 on.
// Its first step, d = 16, adds the reference's +0 padding from 16 to 32 entries, which leaves
// every warp sum as it is (a sum of squares from +0 is never -0, and a NaN that add.rn made is
// already the canonical one), so it has no add here.
func (k *kernel) WarpSumTree() []treeAdd {
	var adds []treeAdd
	for _, d := range k.TreeOffsets() {
		if d >= blockWarps {
			continue
		}
		for l := range d {
			adds = append(adds, treeAdd{l, l + d})
		}
	}
	return adds
}

// WarpSumVectors lists the first entries of wsum's 16-byte vectors, for the loads of
// warpsumtree.
func (k *kernel) WarpSumVectors() []int {
	v := make([]int, 0, blockWarps/4)
	for i := 0; i < blockWarps; i += 4 {
		v = append(v, i)
	}
	return v
}

// PrefetchNext reports whether the row's sum pass pulls each thread's next vector of every
// input and of the residual into L1 while it sums one, for the templates: only in the
// single-rank RMSNorm kernel (the unfused pair's second kernel, and NCCL's route for the fused
// call), whose two loads a vector leave it bound by memory latency; the fused kernels have
// ws+1 loads in flight a vector already, and the prefetch made their two-shot slower on an
// H200 (docs/benchmarks.md, "Loads ahead").
func (k *kernel) PrefetchNext() bool { return k.WS == 1 }

// RowCache lists the vectors u (the thread's vectors tid + u*ntid of a row) that a kernel
// with one block per row keeps in registers from the sum pass to the norm pass, with gamma's
// loaded during the block sum (FusedSpec.RowCache; the single-rank RMSNorm kernel always),
// for the templates; nil for the others.
func (k *kernel) RowCache() []int {
	if !k.rowCache {
		return nil
	}
	return []int{0, 1}
}

// PollAhead reports whether the fused push kernel loads the slots of each thread's second
// vector of a row before it waits for its first, for the templates: up to MaxRowCacheRanks
// ranks, past which the second vector's ws slots would not fit in registers beside the first's.
func (k *kernel) PollAhead() bool { return k.WS <= MaxRowCacheRanks }

// AheadVec is the register list of slot r of the vector PollAhead loads ahead, "{%y8, .., %y11}".
func (k *kernel) AheadVec(r int) string {
	return fmt.Sprintf("{%%y%d, %%y%d, %%y%d, %%y%d}", 4*r, 4*r+1, 4*r+2, 4*r+3)
}

// CacheIndices lists the register indices of a row cache (%rc0 .. %rc<4*len(RowCache)-1>).
func (k *kernel) CacheIndices() []int {
	idx := make([]int, 4*len(k.RowCache()))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// CacheWords names the four registers of vector u of a row cache whose registers are
// prefix<4u> .. prefix<4u+3> (prefix "%rc", "%rd" or gamma's "%gc").
func (k *kernel) CacheWords(prefix string, u int) []string { return vectorWords(prefix, u) }

// PairRows names, for the columns kernel's two rows at once, each row's index register and
// its cache's register prefix: row A (%row, %rc), then row B (%rowb, %rd).
func (k *kernel) PairRows() [][2]string {
	return [][2]string{{"%row", "%rc"}, {"%rowb", "%rd"}}
}

// MaxRegs is the register limit (.maxnreg) of a fused kernel, 0 for none: 64 for the row
// cache's one-shot of 3 and 4 ranks, which would otherwise take 72 under the driver's JIT and
// so fit one block of 512 threads per SM instead of the plain kernels' two, which the ranks
// size their grids by (collective would halve the fused grid). At 2 ranks it takes 62 on its
// own; from 5 ranks the plain kernels fit one block per SM too.
func (k *kernel) MaxRegs() int {
	// (Columns is built on the one-shot's spec, so its k.Algo is "oneshot" too; the fused push,
	// which keeps a row cache as well, needs more than 64 and spills under the cap, so its entry
	// carries no limit)
	if k.rowCache && k.Algo == OneShot.String() && k.WS >= 3 && k.WS <= 4 {
		return 64
	}
	return 0
}
