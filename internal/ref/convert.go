package ref

import "math"

// Canonical NaN bit patterns: what the GPU writes for any NaN result of
// add.rn.f32, cvt.rn.bf16x2.f32 and cvt.rn.f16x2.f32.
const (
	canonicalNaN32   = 0x7FFFFFFF
	canonicalNaNBF16 = 0x7FFF
	canonicalNaNF16  = 0x7FFF
)

// BF16ToF32 widens a bfloat16 to float32. It is exact: a bfloat16 is the top
// half of a binary32, so NaN payloads and signs are kept as they are.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds a float32 to bfloat16 with round to nearest, ties to even,
// as cvt.rn.bf16x2.f32 does: subnormals are kept, values past the largest
// finite bfloat16 round to infinity, infinities are kept and every NaN
// becomes the canonical quiet NaN 0x7FFF.
func F32ToBF16(f float32) uint16 {
	if f != f {
		return canonicalNaNBF16
	}
	b := math.Float32bits(f)
	// Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly
	// when the dropped half is above one half, or equal to it with an odd kept
	// half. The sum cannot overflow: the largest non-NaN pattern is 0xFF800000.
	return uint16((b + 0x7FFF + (b>>16)&1) >> 16)
}

// F16ToF32 widens an IEEE 754 binary16 to float32. It is exact, subnormals
// included; a NaN keeps its sign and payload (shifted into the wider mantissa).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1F
	man := uint32(h & 0x3FF)
	switch exp {
	case 0:
		// Subnormal or zero: man * 2^-24 is exact in float64 and in float32.
		f := float32(math.Ldexp(float64(man), -24))
		return math.Float32frombits(math.Float32bits(f) | sign)
	case 0x1F:
		return math.Float32frombits(sign | 0x7F800000 | man<<13)
	}
	// Rebias the exponent from 15 to 127.
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// F32ToF16 rounds a float32 to IEEE 754 binary16 with round to nearest, ties
// to even, as cvt.rn.f16x2.f32 does: results in the subnormal range are
// rounded exactly, values from 65520 up become infinity, infinities are kept
// and every NaN becomes the canonical quiet NaN 0x7FFF.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xFF
	man := b & 0x7FFFFF
	if exp == 0xFF {
		if man != 0 {
			return canonicalNaNF16
		}
		return sign | 0x7C00
	}
	e := exp - 127 + 15 // biased binary16 exponent
	switch {
	case e >= 0x1F:
		return sign | 0x7C00
	case e >= 1:
		// Normal: keep 10 of the 23 mantissa bits. A carry out of the mantissa
		// lands in the exponent, which is what rounding up to the next binade
		// (or to infinity from the top one) must do.
		return sign | (uint16(e<<10) + roundShift(man, 13))
	}
	// Subnormal result: the value is m * 2^(exp-150) with the implicit bit in m,
	// and the unit of a binary16 subnormal is 2^-24, so shift right by 126-exp.
	// Zeros and float32 subnormals (exp 0) land far below half a unit.
	shift := 126 - exp
	if exp == 0 || shift > 24 {
		return sign
	}
	return sign | roundShift(man|0x800000, uint(shift))
}

// roundShift returns m >> shift rounded to nearest, ties to even.
func roundShift(m uint32, shift uint) uint16 {
	q := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || rem == half && q&1 == 1 {
		q++
	}
	return uint16(q)
}
