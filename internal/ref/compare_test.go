package ref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

func TestCompare(t *testing.T) {
	dt := dtype.BFloat16
	want := column(dt, 1, 0x3F80)[0]
	n, first := Compare(dt, want, want)
	assert.Zero(t, n)
	assert.Nil(t, first)

	got := append([]byte{}, want...)
	store(dt, got, 3, 0x3F81)
	store(dt, got, 5, 0xBF80)
	n, first = Compare(dt, want, got)
	assert.Equal(t, 2, n)
	assert.Equal(t, &Mismatch{Index: 3, Want: 0x3F80, Got: 0x3F81}, first)

	// +0.0 and -0.0 are different bits; two different NaNs are equal.
	a, b := column(dt, 1, 0)[0], column(dt, 1, 0x8000)[0]
	n, _ = Compare(dt, a, b)
	assert.Equal(t, 8, n)
	n, _ = Compare(dt, column(dt, 1, 0x7FFF)[0], column(dt, 1, 0xFFC1)[0])
	assert.Zero(t, n)
	n, first = Compare(dt, column(dt, 1, 0x7FFF)[0], column(dt, 1, 0x7F80)[0])
	assert.Equal(t, 8, n, "NaN is not Inf")
	assert.Equal(t, uint64(0x7F80), first.Got)

	// A short result: the missing elements differ.
	n, first = Compare(dt, want, want[:10])
	assert.Equal(t, 3, n)
	assert.Equal(t, &Mismatch{Index: 5, Want: 0x3F80, Got: 0}, first)

	// float32 elements are compared as 32-bit words.
	w32 := column(dtype.Float32, 1, uint64(math.Float32bits(1)))[0]
	g32 := append([]byte{}, w32...)
	store(dtype.Float32, g32, 2, uint64(math.Float32bits(1))+1)
	n, first = Compare(dtype.Float32, w32, g32)
	assert.Equal(t, 1, n)
	assert.Equal(t, &Mismatch{Index: 2, Want: 0x3F800000, Got: 0x3F800001}, first)
}

func TestFormat(t *testing.T) {
	assert.Equal(t, "-2.5 (0xc020)", Format(dtype.BFloat16, 0xC020))
	assert.Equal(t, "1 (0x3c00)", Format(dtype.Float16, 0x3C00))
	assert.Equal(t, "5.9604645e-08 (0x0001)", Format(dtype.Float16, 0x0001))
	assert.Equal(t, "-0 (0x8000)", Format(dtype.Float16, 0x8000))
	assert.Equal(t, "+Inf (0x7c00)", Format(dtype.Float16, 0x7C00))
	assert.Equal(t, "NaN (0x7fff)", Format(dtype.BFloat16, 0x7FFF))
	assert.Equal(t, "1.0000001 (0x3f800001)", Format(dtype.Float32, 0x3F800001))
	assert.Equal(t, "0x2a", Format(dtype.Invalid, 42))
}

func TestRandom(t *testing.T) {
	for _, dt := range dtype.All {
		rng := rand.New(rand.NewPCG(9, uint64(dt)))
		const nbytes = 1 << 16
		buf := Random(rng, dt, nbytes)
		require.Len(t, buf, nbytes)
		var pos, neg, posZero, negZero, subnormal, huge int
		distinct := map[uint64]bool{}
		maxFinite := map[dtype.DType]float64{dtype.Float32: math.MaxFloat32, dtype.Float16: 65504, dtype.BFloat16: 0x1.fep127}[dt]
		for i := range nbytes / dt.Size() {
			bits := load(dt, buf, i)
			distinct[bits] = true
			f := float64(value(dt, bits))
			require.False(t, math.IsNaN(f) || math.IsInf(f, 0), "%v element %d is %v", dt, i, f)
			expBits, manBits := fields(dt)
			exp := bits >> manBits & (1<<expBits - 1)
			switch {
			case bits == 0:
				posZero++
			case bits == signBit(dt):
				negZero++
			case exp == 0:
				subnormal++
			case math.Abs(f) > maxFinite/8:
				huge++
			}
			if f > 0 {
				pos++
			} else if f < 0 {
				neg++
			}
		}
		for name, n := range map[string]int{"positive": pos, "negative": neg, "+0.0": posZero, "-0.0": negZero, "subnormal": subnormal, "huge": huge} {
			assert.Positive(t, n, "%v: no %s values", dt, name)
		}
		assert.Greater(t, len(distinct), 4000, "%v: values barely vary", dt)

		again := Random(rand.New(rand.NewPCG(9, uint64(dt))), dt, nbytes)
		assert.Equal(t, buf, again, "the same seed gives the same data")
	}
	assert.Equal(t, []byte{0, 0, 0}, Random(rand.New(rand.NewPCG(1, 1)), dtype.Invalid, 3))
	odd := Random(rand.New(rand.NewPCG(1, 1)), dtype.Float32, 7)
	assert.Equal(t, []byte{0, 0, 0}, odd[4:], "a partial trailing element stays zero")
}
