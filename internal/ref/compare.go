package ref

import (
	"fmt"
	"strconv"

	"github.com/goccl/goccl/dtype"
)

// Mismatch is one element where a result differs from the reference.
type Mismatch struct {
	// Index is the element index (not the byte offset).
	Index int
	// Want and Got are the raw element bits of the reference and the result;
	// an element missing from a shorter buffer reads as 0.
	Want, Got uint64
}

// Compare compares want and got element by element, bitwise, except that any
// two NaNs count as equal (the payload is not part of the contract). It
// returns the number of differing elements and the first of them, or 0 and
// nil when they are equal. Elements that only the longer buffer has count as
// differing. An invalid dt compares single bytes.
func Compare(dt dtype.DType, want, got []byte) (count int, first *Mismatch) {
	size := dt.Size()
	if size == 0 {
		size = 1
	}
	nw, ng := len(want)/size, len(got)/size
	for i := range max(nw, ng) {
		var w, g uint64
		if i < nw {
			w = elem(size, want, i)
		}
		if i < ng {
			g = elem(size, got, i)
		}
		if w == g && i < nw && i < ng || isNaN(dt, w) && isNaN(dt, g) {
			continue
		}
		count++
		if first == nil {
			first = &Mismatch{Index: i, Want: w, Got: g}
		}
	}
	return count, first
}

// elem returns the bits of element i of buf with elements of size bytes.
func elem(size int, buf []byte, i int) uint64 {
	switch size {
	case 4:
		return load(dtype.Float32, buf, i)
	case 2:
		return load(dtype.Float16, buf, i)
	}
	return uint64(buf[i])
}

// isNaN reports whether bits are a NaN of dt.
func isNaN(dt dtype.DType, bits uint64) bool {
	if !dt.Valid() {
		return false
	}
	f := value(dt, bits)
	return f != f
}

// Format renders element bits of dt as its shortest decimal value and its hex
// bits, e.g. "-2.5 (0xc020)", for error messages.
func Format(dt dtype.DType, bits uint64) string {
	if !dt.Valid() {
		return fmt.Sprintf("0x%x", bits)
	}
	v := strconv.FormatFloat(float64(value(dt, bits)), 'g', -1, 32)
	return fmt.Sprintf("%s (0x%0*x)", v, 2*dt.Size(), bits)
}
