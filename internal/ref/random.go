package ref

import (
	"math/rand/v2"

	"github.com/goccl/goccl/dtype"
)

// Random returns nbytes of random elements of dt for test inputs: finite
// values of both signs, mostly of moderate magnitude (so that sums round in
// interesting ways), with some exact +0.0 and -0.0, subnormals and values near
// the largest finite one (so that some sums overflow to infinity). It never
// produces NaN or infinity. Bytes past the last whole element, and all bytes
// for an invalid dt, are zero. rng must not be nil.
func Random(rng *rand.Rand, dt dtype.DType, nbytes int) []byte {
	buf := make([]byte, nbytes)
	if !dt.Valid() {
		return buf
	}
	for i := range nbytes / dt.Size() {
		store(dt, buf, i, randomBits(rng, dt))
	}
	return buf
}

// randomBits draws one element by its sign, exponent and mantissa fields.
func randomBits(rng *rand.Rand, dt dtype.DType) uint64 {
	expBits, manBits := fields(dt)
	bias := 1<<(expBits-1) - 1
	maxExp := 1<<expBits - 2 // the largest finite exponent field
	sign := rng.Uint64N(2) << (expBits + manBits)
	man := rng.Uint64N(1 << manBits)
	var exp int
	switch x := rng.IntN(64); {
	case x < 4:
		return 0
	case x < 8:
		return signBit(dt)
	case x < 10:
		exp, man = 0, max(man, 1) // subnormal
	case x < 11:
		exp = maxExp - rng.IntN(3)
	default:
		exp = bias - 10 + rng.IntN(21) // within 2^±10 of 1
	}
	return sign | uint64(exp)<<manBits | man
}

// fields returns the widths of the exponent and mantissa fields of dt.
func fields(dt dtype.DType) (expBits, manBits int) {
	switch dt {
	case dtype.BFloat16:
		return 8, 7
	case dtype.Float16:
		return 5, 10
	}
	return 8, 23
}
