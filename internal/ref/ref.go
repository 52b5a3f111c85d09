// Package ref is the CPU reference the GPU all-reduce results are compared to,
// bit for bit.
//
// Each reduction follows docs/kernel-abi.md exactly: every element is widened
// to float32, the ranks' values are added with float32 arithmetic in the
// kernel's order (one rounding per add, as add.rn.f32, never fused), and the
// sum is rounded once to the element type with round to nearest, ties to even
// (cvt.rn.bf16x2.f32, cvt.rn.f16x2.f32). The sum starts from the first term in
// that order, not from +0.0: 0.0 + -0.0 is +0.0, so a zero start would turn an
// all -0.0 column into +0.0 and the push algorithm's -0.0 into a different
// answer. Any NaN result is written as the canonical quiet NaN the GPU
// produces. Because the order is part of the result, OneShot, TwoShot and Push
// may differ from each other in the last bit, and each is what its kernel must
// produce on every rank.
//
// Buffers are little-endian element bytes, one []byte per rank, all of the
// same length, a whole number of elements. The kernels work on 16-byte
// vectors; a length that is not a multiple of 16 bytes ends in a partial
// vector, whose elements are reduced like the others (the kernels store only
// the message's part of it).
package ref

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/goccl/goccl/dtype"
)

// VectorBytes is the kernels' unit of work: one 16-byte load or store.
const VectorBytes = 16

// OneShot returns the one-shot (pull) all-reduce of inputs: every element is
// summed in rank order 0, 1, .., ws-1, the same on every rank.
func OneShot(dt dtype.DType, inputs [][]byte) ([]byte, error) {
	return reduce("one-shot", dt, inputs, false, func(int, int) int { return 0 })
}

// TwoShot returns the two-shot all-reduce of inputs. The vectors are split
// into ws shards as the kernel does (part = nvec/ws vectors each, the last
// rank also takes the remainder), and shard s, reduced by rank s, is summed in
// the rotated order s, s+1, .., s-1 (mod ws).
func TwoShot(dt dtype.DType, inputs [][]byte) ([]byte, error) {
	return reduce("two-shot", dt, inputs, false, func(vec, nvec int) int {
		part := nvec / len(inputs)
		if part == 0 {
			return len(inputs) - 1
		}
		return min(vec/part, len(inputs)-1)
	})
}

// Push returns the one-shot push (Lamport) all-reduce of inputs: every +0.0
// input element is sent as -0.0, because all-zero bits mean "not arrived" in
// the receive buffer, then the elements are summed in rank order 0..ws-1. A
// column of zeros therefore sums to -0.0 where OneShot gives +0.0.
func Push(dt dtype.DType, inputs [][]byte) ([]byte, error) {
	return reduce("push", dt, inputs, true, func(int, int) int { return 0 })
}

// reduce sums inputs element-wise; first(vec, nvec) names the rank whose value
// starts the sum of vector vec, the others follow in rank order, wrapping.
// With negZero, +0.0 inputs are read as -0.0.
func reduce(algo string, dt dtype.DType, inputs [][]byte, negZero bool, first func(vec, nvec int) int) ([]byte, error) {
	if err := check(dt, inputs); err != nil {
		return nil, fmt.Errorf("ref: %s all-reduce: %w", algo, err)
	}
	ws, size := len(inputs), dt.Size()
	n := len(inputs[0]) / size
	nvec := (len(inputs[0]) + VectorBytes - 1) / VectorBytes
	out := make([]byte, len(inputs[0]))
	sum := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			r0 := first(i*size/VectorBytes, nvec)
			acc := widen(dt, load(dt, inputs[r0], i), negZero)
			for k := 1; k < ws; k++ {
				// The conversion pins the rounding of every add to float32.
				acc = float32(acc + widen(dt, load(dt, inputs[(r0+k)%ws], i), negZero))
			}
			store(dt, out, i, narrow(dt, acc))
		}
	}
	// Elements are independent: large buffers (the GPU tests reduce up to 16 ranks of 8 MiB)
	// are summed in parallel chunks.
	chunks := min(runtime.GOMAXPROCS(0), n/(1<<16)+1)
	var wg sync.WaitGroup
	for c := range chunks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sum(n*c/chunks, n*(c+1)/chunks)
		}()
	}
	wg.Wait()
	return out, nil
}

// check validates the arguments shared by every reduction.
func check(dt dtype.DType, inputs [][]byte) error {
	if !dt.Valid() {
		return fmt.Errorf("unsupported element type %v: use f32, f16 or bf16", dt)
	}
	if len(inputs) < 1 {
		return fmt.Errorf("no inputs: pass one buffer per rank")
	}
	n := len(inputs[0])
	for r, in := range inputs {
		if len(in) != n {
			return fmt.Errorf("rank %d has %d bytes but rank 0 has %d: every rank must pass the same length", r, len(in), n)
		}
	}
	if n%dt.Size() != 0 {
		return fmt.Errorf("%d bytes is not a whole number of %v elements", n, dt)
	}
	return nil
}

// load returns the bits of element i of buf.
func load(dt dtype.DType, buf []byte, i int) uint64 {
	if dt.Size() == 4 {
		return uint64(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return uint64(binary.LittleEndian.Uint16(buf[2*i:]))
}

// store writes the bits of element i of buf.
func store(dt dtype.DType, buf []byte, i int, bits uint64) {
	if dt.Size() == 4 {
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(bits))
		return
	}
	binary.LittleEndian.PutUint16(buf[2*i:], uint16(bits))
}

// widen converts element bits to float32 exactly, reading +0.0 as -0.0 when
// negZero is set (the push algorithm's sender rule).
func widen(dt dtype.DType, bits uint64, negZero bool) float32 {
	if negZero && bits == 0 {
		bits = signBit(dt)
	}
	return value(dt, bits)
}

// value returns the float32 value of element bits; it is exact.
func value(dt dtype.DType, bits uint64) float32 {
	switch dt {
	case dtype.BFloat16:
		return BF16ToF32(uint16(bits))
	case dtype.Float16:
		return F16ToF32(uint16(bits))
	}
	return math.Float32frombits(uint32(bits))
}

// narrow rounds a float32 sum to element bits as the kernel's final store does.
func narrow(dt dtype.DType, f float32) uint64 {
	switch dt {
	case dtype.BFloat16:
		return uint64(F32ToBF16(f))
	case dtype.Float16:
		return uint64(F32ToF16(f))
	}
	if f != f {
		return canonicalNaN32
	}
	return uint64(math.Float32bits(f))
}

// signBit returns the bits of -0.0 of dt.
func signBit(dt dtype.DType) uint64 { return 1 << (8*dt.Size() - 1) }
