package ref

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

func f32(bits uint32) float32 { return math.Float32frombits(bits) }

func TestF32ToBF16Known(t *testing.T) {
	for _, c := range []struct {
		in   uint32
		want uint16
	}{
		{0x3F800000, 0x3F80}, // 1.0
		{0xC0200000, 0xC020}, // -2.5
		{0x00000000, 0x0000}, // +0.0
		{0x80000000, 0x8000}, // -0.0
		{0x7F800000, 0x7F80}, // +Inf
		{0xFF800000, 0xFF80}, // -Inf
		{0x7FC00000, 0x7FFF}, // quiet NaN
		{0xFFC00001, 0x7FFF}, // negative NaN with payload
		{0x7F800001, 0x7FFF}, // signalling NaN: truncation would give Inf
		{0x7F7F0000, 0x7F7F}, // max normal bf16
		{0x00010000, 0x0001}, // min subnormal bf16
		{0x00008000, 0x0000}, // half the min subnormal: tie to even zero
		{0x00018000, 0x0002}, // 1.5 min subnormals: tie to even 2
		{0x3F808000, 0x3F80}, // tie, even below: down
		{0x3F818000, 0x3F82}, // tie, odd below: up
		{0x3F808001, 0x3F81}, // just above the tie: up
		{0x3F807FFF, 0x3F80}, // just below the tie: down
		{0xBF818000, 0xBF82}, // negative tie rounds away in magnitude like positive
		{0x7F7F7FFF, 0x7F7F}, // below the overflow tie
		{0x7F7F8000, 0x7F80}, // overflow tie: max bf16 is odd, so Inf
		{0x7F7FFFFF, 0x7F80}, // max float32
	} {
		assert.Equalf(t, c.want, F32ToBF16(f32(c.in)), "F32ToBF16(%#08x)", c.in)
	}
}

func TestF32ToF16Known(t *testing.T) {
	for _, c := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3C00},
		{-2.5, 0xC100},
		{65504, 0x7BFF}, // max normal
		{65519, 0x7BFF}, // below the overflow tie
		{65520, 0x7C00}, // overflow tie: max is odd, so Inf
		{-65520, 0xFC00},
		{1e10, 0x7C00},
		{float32(math.Inf(1)), 0x7C00},
		{float32(math.Inf(-1)), 0xFC00},
		{float32(math.NaN()), 0x7FFF},
		{f32(0xFFC00001), 0x7FFF},
		{0, 0x0000},
		{f32(0x80000000), 0x8000},
		{0x1p-14, 0x0400},          // min normal
		{0x1p-24, 0x0001},          // min subnormal
		{1023 * 0x1p-24, 0x03FF},   // max subnormal
		{1023.5 * 0x1p-24, 0x0400}, // tie, odd below: up into the normals
		{0x1p-25, 0x0000},          // half the min subnormal: tie to even zero
		{f32(0x33000001), 0x0001},  // just above half the min subnormal
		{-0x1p-25, 0x8000},
		{3 * 0x1p-25, 0x0002}, // 1.5 units: tie to even 2
		{5 * 0x1p-25, 0x0002}, // 2.5 units: tie to even 2
		{0x1p-26, 0x0000},
		{f32(0x00000001), 0x0000}, // float32 subnormal
		{-1e-30, 0x8000},
		{1 + 0x1p-11, 0x3C00},    // tie, even below: down
		{1 + 3*0x1p-11, 0x3C02},  // tie, odd below: up
		{2047 * 0x1p-10, 0x3FFF}, // largest value below 2
		{0.33325195, 0x3555},
	} {
		assert.Equalf(t, c.want, F32ToF16(c.in), "F32ToF16(%v = %#08x)", c.in, math.Float32bits(c.in))
	}
}

func TestWidenKnown(t *testing.T) {
	assert.Equal(t, float32(1), BF16ToF32(0x3F80))
	assert.Equal(t, float32(-2.5), BF16ToF32(0xC020))
	assert.Equal(t, uint32(0x80000000), math.Float32bits(BF16ToF32(0x8000)))
	assert.Equal(t, float32(0x1p-133), BF16ToF32(0x0001))
	assert.True(t, math.IsInf(float64(BF16ToF32(0xFF80)), -1))

	assert.Equal(t, float32(1), F16ToF32(0x3C00))
	assert.Equal(t, float32(-2.5), F16ToF32(0xC100))
	assert.Equal(t, float32(65504), F16ToF32(0x7BFF))
	assert.Equal(t, float32(0x1p-24), F16ToF32(0x0001))
	assert.Equal(t, float32(-1023*0x1p-24), F16ToF32(0x83FF))
	assert.Equal(t, float32(0x1p-14), F16ToF32(0x0400))
	assert.Equal(t, uint32(0x80000000), math.Float32bits(F16ToF32(0x8000)))
	assert.True(t, math.IsInf(float64(F16ToF32(0x7C00)), 1))
	assert.True(t, math.IsInf(float64(F16ToF32(0xFC00)), -1))
	assert.Equal(t, uint32(0x7FC02000), math.Float32bits(F16ToF32(0x7E01)), "NaN payload kept")
}

// TestRoundTrip widens and narrows every 16-bit pattern: non-NaN patterns
// must come back unchanged, NaNs as the canonical NaN.
func TestRoundTrip(t *testing.T) {
	for _, c := range []struct {
		dt     dtype.DType
		widen  func(uint16) float32
		narrow func(float32) uint16
	}{
		{dtype.BFloat16, BF16ToF32, F32ToBF16},
		{dtype.Float16, F16ToF32, F32ToF16},
	} {
		nans := 0
		for h := range 1 << 16 {
			f := c.widen(uint16(h))
			got := c.narrow(f)
			if f != f {
				nans++
				require.Equalf(t, uint16(0x7FFF), got, "%v NaN %#04x", c.dt, h)
				continue
			}
			require.Equalf(t, uint16(h), got, "%v %#04x -> %v", c.dt, h, f)
		}
		// 2 signs x (2^mantissa bits - 1) NaN payloads.
		_, manBits := fields(c.dt)
		assert.Equal(t, 2*(1<<manBits-1), nans, c.dt)
	}
}

// slowRounder rounds by searching the sorted table of every non-negative
// finite value of a 16-bit format, an implementation independent of the bit
// tricks in convert.go.
type slowRounder struct {
	values []float64 // values[p] is the value of pattern p, up to the largest finite one
	inf    uint16    // the +Inf pattern, which counts as the next binade's 2^emax+1
}

func newSlowRounder(widen func(uint16) float32, inf uint16, infValue float64) slowRounder {
	s := slowRounder{inf: inf}
	for p := range inf {
		s.values = append(s.values, float64(widen(p)))
	}
	s.values = append(s.values, infValue)
	return s
}

func (s slowRounder) round(x float32) uint16 {
	if x != x {
		return 0x7FFF
	}
	var sign uint16
	if math.Signbit(float64(x)) {
		sign = 0x8000
	}
	a := math.Abs(float64(x))
	i := sort.SearchFloat64s(s.values, a)
	switch {
	case i == len(s.values):
		return sign | s.inf // beyond even the rounded overflow point
	case s.values[i] == a || i == 0:
		return sign | uint16(i)
	}
	// Neighbours lo = i-1 and hi = i. 2a and values[lo]+values[hi] are exact in
	// float64: the two have at most 11 significant bits and adjacent exponents.
	lo := i - 1
	twice, mid := 2*a, s.values[lo]+s.values[i]
	if twice < mid || twice == mid && lo%2 == 0 {
		return sign | uint16(lo)
	}
	return sign | uint16(i)
}

// randomFloat32s returns n float32s: half uniformly random bit patterns, half
// with exponents around the 16-bit formats' ranges, where rounding happens.
func randomFloat32s(rng *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		bits := rng.Uint32()
		if i%2 == 1 {
			exp := uint32(127 - 30 + rng.IntN(50)) // 2^-30 .. 2^19
			bits = bits&0x807FFFFF | exp<<23
		}
		if i%7 == 0 {
			bits &^= 0x1FFF // exact f16 values and ties
			bits |= uint32(rng.IntN(2)) << 12
		}
		out[i] = f32(bits)
	}
	return out
}

func TestF32ToF16AgainstSlowReference(t *testing.T) {
	slow := newSlowRounder(F16ToF32, 0x7C00, 0x1p16)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, x := range randomFloat32s(rng, 200000) {
		want := slow.round(x)
		got := F32ToF16(x)
		if got != want {
			require.Failf(t, "F32ToF16 differs from the slow reference", "x=%v (%#08x): got %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
	}
}

func TestF32ToBF16AgainstSlowReference(t *testing.T) {
	slow := newSlowRounder(BF16ToF32, 0x7F80, 0x1p128)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, x := range randomFloat32s(rng, 200000) {
		want := slow.round(x)
		got := F32ToBF16(x)
		if got != want {
			require.Failf(t, "F32ToBF16 differs from the slow reference", "x=%v (%#08x): got %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
	}
}

// The slow reference itself must agree with the hand-checked values, or the
// comparison above proves nothing.
func TestSlowReferenceKnown(t *testing.T) {
	f16 := newSlowRounder(F16ToF32, 0x7C00, 0x1p16)
	for in, want := range map[float32]uint16{
		65519: 0x7BFF, 65520: 0x7C00, 1 + 0x1p-11: 0x3C00, 1 + 3*0x1p-11: 0x3C02,
		0x1p-25: 0, 3 * 0x1p-25: 2, -2.5: 0xC100,
	} {
		assert.Equal(t, want, f16.round(in), fmt.Sprint(in))
	}
	bf16 := newSlowRounder(BF16ToF32, 0x7F80, 0x1p128)
	assert.Equal(t, uint16(0x3F80), bf16.round(f32(0x3F808000)))
	assert.Equal(t, uint16(0x3F82), bf16.round(f32(0x3F818000)))
	assert.Equal(t, uint16(0xFF80), bf16.round(f32(0xFF7FFFFF)))
}
