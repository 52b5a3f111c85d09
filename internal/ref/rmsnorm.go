package ref

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"

	"github.com/goccl/goccl/dtype"
)

// FusedAlgo is the order in which a fused kernel sums the ranks' rows.
type FusedAlgo int

const (
	// FusedOneShot sums every row in rank order 0, 1, .., ws-1 (every rank itself).
	FusedOneShot FusedAlgo = iota + 1
	// FusedTwoShot gives rank r the rows [r*rows/ws, (r+1)*rows/ws) (its band), and sums
	// them in the rotated order r, r+1, .., r-1 (mod ws).
	FusedTwoShot
	// FusedPush sums every row in rank order 0, 1, .., ws-1 as FusedOneShot does, but reads
	// every +0.0 input element as -0.0: the push kernel sends +0.0 as -0.0, because all-zero
	// bits mean "not arrived" in its receive slots (Push, the plain all-reduce's reference,
	// does the same). The residual is added as it is. The two orders differ only where every
	// input of an element is +0.0 and its residual is -0.0: FusedOneShot gives +0.0 + -0.0 =
	// +0.0, FusedPush -0.0 + -0.0 = -0.0 (and so a NormOut of the other sign).
	FusedPush
)

// Fused describes one fused all-reduce + residual add + RMSNorm (ptx.FusedSpec, and with one
// input the single-rank kernel ptx.NormSpec), whose results Run reproduces bit for bit.
//
// Where values are rounded, per element of a row: the inputs are widened to f32 (exact; with
// FusedPush, +0.0 as -0.0) and added in the algorithm's order (add.rn each); the residual is
// widened and added (add.rn); the sum is rounded once to the element type: that is
// ResidualOut. The norm reads those rounded values widened again. Thread t of the block
// (Threads of them) sums x*x (mul.rn, then add.rn, from +0) over its vectors t, t+Threads, ..
// of the row, and within a vector over its elements in address order. (The fused two-shot
// may spread a row over several blocks of fewer threads: thread t is then a virtual thread of
// the row, its lanes and warps the same, and the order the same.) The 32 lanes of a warp are added by a tree: for d = 16, 8, 4,
// 2, 1, lane i adds lane i+d (add.rn); lane 0 holds the warp's sum. The warps' sums, padded
// with +0 to 32, go through the same tree. Then mean = sum / hidden (div.rn), + eps (add.rn),
// sqrt (sqrt.rn), inv = 1 / that (div.rn), all in f32; NormOut = (x * inv) * gamma (two
// mul.rn, gamma widened), rounded once to the element type. No step is fused or approximate.
type Fused struct {
	DType   dtype.DType
	Algo    FusedAlgo
	Hidden  int     // elements per row
	Threads int     // the launch's threads per block (ptx.FusedThreads)
	Eps     float32 // added to the mean of the squares
	NoNorm  bool    // ResidualOut only: Run returns a nil NormOut
}

// Run returns ResidualOut and NormOut of the fused call over the ranks' inputs (one buffer
// per rank, rows*Hidden elements each), with the residual and gamma (Hidden elements) that
// every rank passes: the kernels give every rank the same bits only when these are equal.
func (f Fused) Run(inputs [][]byte, residual, gamma []byte) (residOut, normOut []byte, err error) {
	if err := check(f.DType, inputs); err != nil {
		return nil, nil, fmt.Errorf("ref: fused all-reduce: %w", err)
	}
	size := f.DType.Size()
	rowBytes := f.Hidden * size
	switch {
	case f.Algo != FusedOneShot && f.Algo != FusedTwoShot && f.Algo != FusedPush:
		return nil, nil, fmt.Errorf("ref: fused all-reduce: unknown algorithm %d: use FusedOneShot, FusedTwoShot or FusedPush", f.Algo)
	case f.Hidden <= 0 || rowBytes%VectorBytes != 0:
		return nil, nil, fmt.Errorf("ref: fused all-reduce: hidden size %d is not a positive number of 16-byte vectors of %v", f.Hidden, f.DType)
	case f.Threads <= 0 || f.Threads%32 != 0 || f.Threads > 1024:
		// A block holds at most 1024 threads: the block sum has room for its 32 warps.
		return nil, nil, fmt.Errorf("ref: fused all-reduce: %d threads per block: pass a multiple of 32 from 32 to 1024 (ptx.FusedThreads)", f.Threads)
	case len(inputs[0])%rowBytes != 0:
		return nil, nil, fmt.Errorf("ref: fused all-reduce: %d bytes is not a whole number of rows of %d bytes", len(inputs[0]), rowBytes)
	case len(residual) != len(inputs[0]):
		return nil, nil, fmt.Errorf("ref: fused all-reduce: residual of %d bytes, inputs of %d: pass one as long as an input", len(residual), len(inputs[0]))
	case !f.NoNorm && len(gamma) != rowBytes:
		return nil, nil, fmt.Errorf("ref: fused all-reduce: gamma of %d bytes, want one row of %d", len(gamma), rowBytes)
	}
	ws, rows := len(inputs), len(inputs[0])/rowBytes
	residOut = make([]byte, len(inputs[0]))
	if !f.NoNorm {
		normOut = make([]byte, len(inputs[0]))
	}
	// Rows are independent: large cases (the GPU tests check up to 513 rows of 16384 elements
	// from 16 ranks) are computed by one goroutine per CPU, each over its own rows.
	workers := max(1, min(runtime.GOMAXPROCS(0), rows*f.Hidden*ws>>16))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.rows(inputs, residual, gamma, residOut, normOut, w*rows/workers, (w+1)*rows/workers)
		}()
	}
	wg.Wait()
	return residOut, normOut, nil
}

// rows computes rows [from, to) of Run's outputs.
func (f Fused) rows(inputs [][]byte, residual, gamma, residOut, normOut []byte, from, to int) {
	ws, rows := len(inputs), len(residual)/(f.Hidden*f.DType.Size())
	x := make([]float32, f.Hidden) // the rounded ResidualOut row, widened
	negZero := f.Algo == FusedPush
	for row := from; row < to; row++ {
		first := 0
		if f.Algo == FusedTwoShot {
			// the owner r of the row: r*rows/ws <= row < (r+1)*rows/ws
			for first = ws - 1; first > 0 && first*rows/ws > row; first-- {
			}
		}
		for e := range f.Hidden {
			i := row*f.Hidden + e
			acc := widen(f.DType, load(f.DType, inputs[first], i), negZero)
			for k := 1; k < ws; k++ {
				acc = float32(acc + widen(f.DType, load(f.DType, inputs[(first+k)%ws], i), negZero))
			}
			acc = float32(acc + value(f.DType, load(f.DType, residual, i)))
			bits := narrow(f.DType, acc)
			store(f.DType, residOut, i, bits)
			x[e] = value(f.DType, bits)
		}
		if f.NoNorm {
			continue
		}
		inv := f.inv(x)
		for e := range f.Hidden {
			y := float32(x[e] * inv)
			y = float32(y * value(f.DType, load(f.DType, gamma, e)))
			store(f.DType, normOut, row*f.Hidden+e, narrow(f.DType, y))
		}
	}
}

// inv is 1/sqrt(mean(x^2) + eps) of one row, summed in the kernel's order.
func (f Fused) inv(x []float32) float32 {
	elems := VectorBytes / f.DType.Size()
	hvec := f.Hidden / elems
	warps := f.Threads / 32
	lanes := make([]float32, f.Threads)
	for t := range lanes {
		var s float32
		for v := t; v < hvec; v += f.Threads {
			for _, xe := range x[v*elems : (v+1)*elems] {
				s = float32(s + float32(xe*xe))
			}
		}
		lanes[t] = s
	}
	var sums [32]float32
	for w := range warps {
		sums[w] = warpTree(lanes[32*w : 32*w+32])
	}
	total := warpTree(sums[:])
	m := float32(total / float32(f.Hidden))
	m = float32(m + f.Eps)
	// The square root of a float32 computed in float64 and rounded to float32 is the
	// correctly rounded float32 square root (53 >= 2*24+2 bits), as sqrt.rn.f32.
	s := float32(math.Sqrt(float64(m)))
	return float32(1) / s
}

// warpTree adds 32 values as shfl.down does: for d = 16, 8, 4, 2, 1, lane i adds lane i+d.
// It returns lane 0's result and leaves lanes changed.
func warpTree(lanes []float32) float32 {
	for d := 16; d >= 1; d /= 2 {
		for i := range d {
			lanes[i] = float32(lanes[i] + lanes[i+d])
		}
	}
	return lanes[0]
}

// Activations returns count elements of dt drawn uniformly from [-scale, scale] and rounded
// to dt: the finite, moderate values of a layer's activations, for tests of the fused call
// whose norms should be numbers (Random's huge values make rows of infinities).
func Activations(rng *rand.Rand, dt dtype.DType, count int, scale float64) []byte {
	buf := make([]byte, count*dt.Size())
	for i := range count {
		store(dt, buf, i, narrow(dt, float32((2*rng.Float64()-1)*scale)))
	}
	return buf
}
