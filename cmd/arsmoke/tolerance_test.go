package main

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
)

// roundTo rounds f to the nearest value of dt (ties to even), as NCCL's reduction does after
// each addition.
func roundTo(dt dtype.DType, f float32) float32 {
	switch dt {
	case dtype.BFloat16:
		return ref.BF16ToF32(ref.F32ToBF16(f))
	case dtype.Float16:
		return ref.F16ToF32(ref.F32ToF16(f))
	}
	return f
}

// bitsOf encodes f, already a value of dt, as dt's bits.
func bitsOf(dt dtype.DType, f float32) uint64 {
	switch dt {
	case dtype.BFloat16:
		return uint64(ref.F32ToBF16(f))
	case dtype.Float16:
		return uint64(ref.F32ToF16(f))
	}
	return uint64(math.Float32bits(f))
}

func putBits(dt dtype.DType, buf []byte, i int, bits uint64) {
	if dt.Size() == 4 {
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(bits))
		return
	}
	binary.LittleEndian.PutUint16(buf[2*i:], uint16(bits))
}

// ringSum adds the inputs the way a ring does, starting at rank first and going round,
// rounding in dt after each addition: what NCCL may return.
func ringSum(dt dtype.DType, inputs [][]byte, first int) []byte {
	n := len(inputs[0]) / dt.Size()
	out := make([]byte, len(inputs[0]))
	for i := range n {
		var acc float32
		for k := range inputs {
			x := float32(elementValue(dt, elementBits(dt, inputs[(first+k)%len(inputs)], i)))
			if k == 0 {
				acc = x
			} else {
				acc = roundTo(dt, acc+x)
			}
		}
		putBits(dt, out, i, bitsOf(dt, acc))
	}
	return out
}

func randomInputs(dt dtype.DType, ranks, count int, seed uint64) [][]byte {
	inputs := make([][]byte, ranks)
	for r := range inputs {
		inputs[r] = ref.Random(rand.New(rand.NewPCG(seed, uint64(r))), dt, count*dt.Size())
	}
	return inputs
}

// What NCCL may return passes: a sum rounded at every step, in any ring order, and goccl's
// own result (rounded once), for every type, including the elements whose partial sums
// overflow (ref.Random makes values near the largest finite one).
func TestCheckNCCLPassesRoundedSums(t *testing.T) {
	for _, dt := range dtype.All {
		for _, ranks := range []int{2, 3, 8, 16} {
			inputs := randomInputs(dt, ranks, 20000, uint64(ranks))
			outputs := [][]byte{ringSum(dt, inputs, 0), ringSum(dt, inputs, ranks-1), ringSum(dt, inputs, ranks/2)}
			once, err := ref.OneShot(dt, inputs)
			require.NoError(t, err)
			outputs = append(outputs, once)
			if ranks > 2 {
				differ, _ := ref.Compare(dt, once, outputs[1])
				assert.Positive(t, differ, "%v, %d ranks: rounding at each step must differ from rounding once somewhere, or this test shows nothing", dt, ranks)
			}
			wrong, first := checkNCCL(dt, inputs, outputs, []int{0, 1, 2, 3})
			assert.Zero(t, wrong, "%v, %d ranks: first %+v", dt, ranks, first)
			assert.Nil(t, first)
		}
	}
}

// The tolerance is n * u * sum|x|: a result just inside passes, just outside fails.
func TestCheckNCCLBound(t *testing.T) {
	dt := dtype.Float32
	// Four ranks of 1.5: sum 6, bound 4 * 2^-24 * 6 = 1.43e-6 (plus a negligible subnormal term).
	inputs := make([][]byte, 4)
	for r := range inputs {
		inputs[r] = make([]byte, 8)
		putBits(dt, inputs[r], 0, uint64(math.Float32bits(1.5)))
		putBits(dt, inputs[r], 1, uint64(math.Float32bits(-1.5)))
	}
	bound := 4 * 6 * math.Ldexp(1, -24)
	out := func(v0, v1 float32) []byte {
		b := make([]byte, 8)
		putBits(dt, b, 0, uint64(math.Float32bits(v0)))
		putBits(dt, b, 1, uint64(math.Float32bits(v1)))
		return b
	}
	// Near 6 float32's values are 2^-21 apart: the bound is exactly 3 of them.
	ulp := math.Ldexp(1, -21)
	require.Equal(t, 3*ulp, bound)
	inside, outside := float32(6+3*ulp), float32(6+4*ulp)

	wrong, first := checkNCCL(dt, inputs, [][]byte{out(inside, -inside)}, []int{0})
	assert.Zero(t, wrong)
	assert.Nil(t, first)

	wrong, first = checkNCCL(dt, inputs, [][]byte{out(6, -6), out(6, -outside)}, []int{2, 5})
	assert.Equal(t, int64(1), wrong)
	require.NotNil(t, first)
	assert.Equal(t, Mismatch{Rank: 5, Index: 1, Expected: "-6 ± 1.43051e-06 (NCCL's tolerance)",
		Got: ref.Format(dt, uint64(math.Float32bits(-outside)))}, *first)
}

// NaN never passes, nor an infinity that no order of addition can make; the infinity of a
// sign whose inputs add up past the largest finite value passes even when the exact sum is
// finite, and NaN where both signs can overflow.
func TestCheckNCCLSpecialValues(t *testing.T) {
	dt := dtype.BFloat16
	big := ref.BF16ToF32(0x7f00) // 1.7e38: two of them overflow
	nan, posInf, negInf := uint64(0x7fc0), uint64(0x7f80), uint64(0xff80)
	type elem struct {
		inputs []float32 // one per rank
		got    uint64
		pass   bool
	}
	for name, e := range map[string]elem{
		"NaN for small inputs":               {inputs: []float32{1, 2, 3}, got: nan},
		"poison (all ones) is a NaN":         {inputs: []float32{1, 2, 3}, got: 0xffff},
		"+Inf for small inputs":              {inputs: []float32{1, 2, 3}, got: posInf},
		"+Inf where positives overflow":      {inputs: []float32{big, big, -big}, got: posInf, pass: true},
		"the finite sum there too":           {inputs: []float32{big, big, -big}, got: 0x7f00, pass: true},
		"-Inf where only positives overflow": {inputs: []float32{big, big, -big}, got: negInf},
		"NaN where only positives overflow":  {inputs: []float32{big, big, -big}, got: nan},
		"NaN where both signs overflow":      {inputs: []float32{big, big, -big, -big}, got: nan, pass: true},
		"-Inf where negatives overflow":      {inputs: []float32{-big, -big, 1}, got: negInf, pass: true},
	} {
		t.Run(name, func(t *testing.T) {
			inputs := make([][]byte, len(e.inputs))
			for r, x := range e.inputs {
				inputs[r] = make([]byte, 2)
				putBits(dt, inputs[r], 0, bitsOf(dt, x))
			}
			got := make([]byte, 2)
			putBits(dt, got, 0, e.got)
			wrong, _ := checkNCCL(dt, inputs, [][]byte{got}, []int{0})
			assert.Equal(t, e.pass, wrong == 0)
		})
	}
}

// A wrong element is found wherever it lies, the count covers every rank, and the first
// mismatch is in the first rank's output that has one, at its lowest index, however the
// check splits the message.
func TestCheckNCCLCountsAndFirst(t *testing.T) {
	dt := dtype.Float16
	inputs := randomInputs(dt, 4, 100000, 7)
	good := ringSum(dt, inputs, 1)
	bad := func(at ...int) []byte {
		b := append([]byte(nil), good...)
		for _, i := range at {
			putBits(dt, b, i, 0x7e00) // NaN
		}
		return b
	}
	wrong, first := checkNCCL(dt, inputs, [][]byte{good, bad(99999, 70000), bad(5, 99999)}, []int{0, 1, 2})
	assert.Equal(t, int64(4), wrong)
	require.NotNil(t, first)
	assert.Equal(t, 1, first.Rank)
	assert.Equal(t, int64(70000), first.Index)
	assert.Contains(t, first.Got, "NaN")
}

func TestNCCLToleranceLegend(t *testing.T) {
	assert.Equal(t, "8 x 2^-8", ncclTolerance(dtype.BFloat16, 8))
	assert.Equal(t, "2 x 2^-11", ncclTolerance(dtype.Float16, 2))
	assert.Equal(t, "4 x 2^-24", ncclTolerance(dtype.Float32, 4))
}
