// Package dtype names the element types goccl reduces and their sizes.
//
// It is a leaf package so that the kernel catalog (ptx), the CPU reference
// (internal/ref) and the communicator (collective) share one definition.
package dtype

import (
	"fmt"
	"strings"
)

// DType is an element type of an all-reduce.
type DType int

const (
	// Invalid is the zero value; every operation rejects it.
	Invalid DType = iota
	// Float32 is IEEE 754 binary32.
	Float32
	// Float16 is IEEE 754 binary16.
	Float16
	// BFloat16 is bfloat16: the top 16 bits of a binary32.
	BFloat16
)

// All lists every supported element type, in a fixed order.
var All = []DType{Float32, Float16, BFloat16}

// Size returns the size of one element in bytes, or 0 for an unknown type.
func (t DType) Size() int {
	switch t {
	case Float32:
		return 4
	case Float16, BFloat16:
		return 2
	}
	return 0
}

// Valid reports whether t is one of the supported types.
func (t DType) Valid() bool { return t.Size() != 0 }

// String returns the short name used in kernel names, flags and tables:
// "f32", "f16" or "bf16".
func (t DType) String() string {
	switch t {
	case Float32:
		return "f32"
	case Float16:
		return "f16"
	case BFloat16:
		return "bf16"
	}
	return fmt.Sprintf("dtype(%d)", int(t))
}

// Parse turns a name into a DType. It accepts the short names of String and
// the usual long spellings ("float32", "float", "half", "float16",
// "bfloat16"), in any case.
func Parse(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "f32", "float32", "float", "fp32":
		return Float32, nil
	case "f16", "float16", "half", "fp16":
		return Float16, nil
	case "bf16", "bfloat16":
		return BFloat16, nil
	}
	return Invalid, fmt.Errorf("unknown element type %q: use f32, f16 or bf16", s)
}
