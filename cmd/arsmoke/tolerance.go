package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"

	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
)

// NCCL's results are not bitwise predictable: it adds the ranks' values in the order of its
// ring or tree and rounds in the element type after each addition. Each of those at most n-1
// roundings errs by at most u times the partial sum (u: the unit roundoff of the type), and
// every partial sum is at most sum_r |x_r|, so a correct result lies within
// n * u * sum_r |x_r| of the exact sum. Near zero a rounding errs by up to half the smallest
// subnormal instead, which adds n times that.
//
// Overflow depends on the order too: a partial sum made of the positive inputs can overflow
// to +Inf, even when the exact sum is finite, once those inputs add up past the largest finite
// value (likewise -Inf with the negative inputs; and +Inf plus -Inf gives NaN). So ±Inf passes
// where the inputs of that sign could overflow, and NaN only where both signs could; nowhere
// else.

// ncclTolerance describes the tolerance of dt for the legend: "8 x 2^-8".
func ncclTolerance(dt dtype.DType, ranks int) string {
	return fmt.Sprintf("%d x 2^%d", ranks, unitRoundoffExp(dt))
}

// unitRoundoffExp is the exponent of the unit roundoff u of dt: half the distance from 1 to
// the next value.
func unitRoundoffExp(dt dtype.DType) int {
	switch dt {
	case dtype.BFloat16:
		return -8
	case dtype.Float16:
		return -11
	}
	return -24
}

// halfSubnormal is half the smallest positive subnormal of dt: the largest error of a
// rounding near zero.
func halfSubnormal(dt dtype.DType) float64 {
	switch dt {
	case dtype.BFloat16:
		return math.Ldexp(1, -134)
	case dtype.Float16:
		return math.Ldexp(1, -25)
	}
	return math.Ldexp(1, -150)
}

// maxFinite is the largest finite value of dt.
func maxFinite(dt dtype.DType) float64 {
	switch dt {
	case dtype.BFloat16:
		return float64(ref.BF16ToF32(0x7f7f))
	case dtype.Float16:
		return 65504
	}
	return math.MaxFloat32
}

// elementBits returns the bits of element i of buf, little-endian.
func elementBits(dt dtype.DType, buf []byte, i int) uint64 {
	if dt.Size() == 4 {
		return uint64(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return uint64(binary.LittleEndian.Uint16(buf[2*i:]))
}

// elementValue decodes element bits of dt.
func elementValue(dt dtype.DType, bits uint64) float64 {
	switch dt {
	case dtype.BFloat16:
		return float64(ref.BF16ToF32(uint16(bits)))
	case dtype.Float16:
		return float64(ref.F16ToF32(uint16(bits)))
	}
	return float64(math.Float32frombits(uint32(bits)))
}

// checkNCCL counts the elements of outputs (the results of an all-reduce of inputs through
// NCCL, one output per rank, ranks[j] being the rank of outputs[j]) that lie outside the
// tolerance, and returns the first of them: in the first output that has one, its lowest
// index. It computes the reference element by element, in parallel over slices of the
// message, so that it holds no more than the buffers it is given.
func checkNCCL(dt dtype.DType, inputs, outputs [][]byte, ranks []int) (wrong int64, first *Mismatch) {
	n := len(inputs[0]) / dt.Size()
	parts := max(1, min(runtime.GOMAXPROCS(0), n/4096))
	type part struct {
		wrong int64
		first []*Mismatch // per output
	}
	res := make([]part, parts)
	var wg sync.WaitGroup
	for p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[p].first = make([]*Mismatch, len(outputs))
			for i := p * n / parts; i < (p+1)*n/parts; i++ {
				want, bound, pos, neg := ncclElement(dt, inputs, i)
				for j, out := range outputs {
					bits := elementBits(dt, out, i)
					if withinNCCL(elementValue(dt, bits), want, bound, pos, neg) {
						continue
					}
					res[p].wrong++
					if res[p].first[j] == nil {
						res[p].first[j] = &Mismatch{Rank: ranks[j], Index: int64(i),
							Expected: fmt.Sprintf("%s ± %s (NCCL's tolerance)", formatFloat(want), formatFloat(bound)),
							Got:      ref.Format(dt, bits)}
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, r := range res {
		wrong += r.wrong
	}
	for j := range outputs {
		for _, r := range res { // parts in index order
			if r.first[j] != nil {
				return wrong, r.first[j]
			}
		}
	}
	return wrong, nil
}

// ncclElement returns, for element i of an all-reduce of inputs, the exact sum (float64's own
// rounding errs far below the tolerance), the largest distance from it that NCCL may be off,
// and whether the positive (pos) or negative (neg) inputs could overflow in some order.
func ncclElement(dt dtype.DType, inputs [][]byte, i int) (want, bound float64, pos, neg bool) {
	var p, m float64
	for _, in := range inputs {
		x := elementValue(dt, elementBits(dt, in, i))
		want += x
		if x > 0 {
			p += x
		} else {
			m -= x
		}
	}
	ranks := float64(len(inputs))
	bound = ranks * (math.Ldexp(p+m, unitRoundoffExp(dt)) + halfSubnormal(dt))
	top := maxFinite(dt)
	return want, bound, p > top, m > top
}

// withinNCCL reports whether got passes for an element with ncclElement's want, bound, pos
// and neg.
func withinNCCL(got, want, bound float64, pos, neg bool) bool {
	switch {
	case math.IsNaN(got):
		return pos && neg
	case math.IsInf(got, 1):
		return pos
	case math.IsInf(got, -1):
		return neg
	}
	return math.Abs(got-want) <= bound
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', 6, 64) }
