package driver

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// paramBytes returns the bytes that parameter i of a points to, as the driver reads them.
func paramBytes(a *Args, i, size int) []byte {
	ptrs := (*[MaxArgs]unsafe.Pointer)(a.params())
	return unsafe.Slice((*byte)(ptrs[i]), size)
}

func TestArgsPacking(t *testing.T) {
	var a Args
	pair := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	a.U32(0x11223344)
	a.U64(0x0102030405060708)
	a.Bytes(pair, 8)
	a.U32(7)
	a.Ptr(0xdead0000)
	require.NoError(t, a.err)
	require.Equal(t, 5, a.n)
	assert.Equal(t, []uint16{0, 8, 16, 32, 40}, a.offs[:5], "each value at its alignment")
	assert.Equal(t, []uint16{4, 8, 16, 4, 8}, a.sizes[:5])

	assert.Equal(t, uint32(0x11223344), binary.NativeEndian.Uint32(paramBytes(&a, 0, 4)))
	assert.Equal(t, uint64(0x0102030405060708), binary.NativeEndian.Uint64(paramBytes(&a, 1, 8)))
	assert.Equal(t, pair, paramBytes(&a, 2, 16))
	assert.Equal(t, uint32(7), binary.NativeEndian.Uint32(paramBytes(&a, 3, 4)))
	assert.Equal(t, uint64(0xdead0000), binary.NativeEndian.Uint64(paramBytes(&a, 4, 8)))

	// A copy points into itself, not into the original.
	b := a
	b.U32(0)
	bufB := uintptr(unsafe.Pointer(&b.buf[0]))
	ptrs := (*[MaxArgs]unsafe.Pointer)(b.params())
	for i := range b.n {
		p := uintptr(ptrs[i])
		assert.True(t, p >= bufB && p < bufB+MaxArgBytes, "parameter %d points into the copy", i)
	}

	a.Reset()
	assert.Nil(t, a.params())
	a.U64(9)
	assert.Equal(t, uint64(9), binary.NativeEndian.Uint64(paramBytes(&a, 0, 8)))
	var none *Args
	assert.Nil(t, none.params())
}

func TestArgsErrorsSurfaceAtLaunch(t *testing.T) {
	_, s, f := fakeHandles()
	cfg := &LaunchConfig{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{32, 1, 1}}

	var a Args
	for range MaxArgs + 1 {
		a.U32(1)
	}
	err := Launch(s, f, cfg, &a)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "goccl_fake")
	assert.Contains(t, err.Error(), "more than 32 parameters")

	a.Reset()
	a.Bytes(make([]byte, 1000), 8)
	a.Bytes(make([]byte, 100), 8)
	a.U32(1) // after the first error nothing more is added
	err = Launch(s, f, cfg, &a)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "more than 1024 bytes")
	assert.Equal(t, 1, a.n)

	for _, align := range []int{0, 3, 32} {
		a.Reset()
		a.Bytes([]byte{1}, align)
		assert.ErrorContains(t, Launch(s, f, cfg, &a), "not a power of two", "align %d", align)
	}
	a.Reset()
	a.Bytes(nil, 8)
	assert.ErrorContains(t, Launch(s, f, cfg, &a), "empty byte array")
	a.Reset()
	assert.NoError(t, a.err, "Reset clears the error")
}

func TestLaunchChecksBeforeCalling(t *testing.T) {
	c, s, f := fakeHandles()
	cfg := &LaunchConfig{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{32, 1, 1}}
	var a Args

	assert.ErrorContains(t, Launch(s, f, nil, &a), "nil LaunchConfig")
	assert.ErrorIs(t, Launch(&Stream{ctx: c}, f, cfg, &a), ErrInvalidValue, "closed stream")
	assert.ErrorContains(t, Launch(nil, f, cfg, &a), "stream is closed")
	assert.ErrorContains(t, Launch(s, nil, cfg, &a), "kernel (or its module) is closed")
	closedMod := &Function{mod: &Module{ctx: c}, handle: 1, name: "k"}
	assert.ErrorContains(t, Launch(s, closedMod, cfg, &a), "kernel (or its module) is closed")

	// With the kernel's parameter list known, the count and each size must match.
	f.params = []uint16{8, 8, 4}
	a.Ptr(1)
	a.U32(2)
	err := Launch(s, f, cfg, &a)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "2 arguments given, the kernel takes 3")
	a.U32(3)
	err = Launch(s, f, cfg, &a)
	assert.Contains(t, err.Error(), "argument 1 is 4 bytes, the kernel's parameter is 8")
	assert.ErrorContains(t, Launch(s, f, cfg, nil), "0 arguments given")
}

// TestStructLayouts pins the Go mirrors of the C structs to the offsets of cuda.h (x86-64 and
// aarch64 agree). The fake libcuda test checks them against a C compiler as well.
func TestStructLayouts(t *testing.T) {
	var cfg cuLaunchConfig
	assert.EqualValues(t, 56, unsafe.Sizeof(cfg))
	assert.EqualValues(t, 24, unsafe.Offsetof(cfg.sharedMemBytes))
	assert.EqualValues(t, 32, unsafe.Offsetof(cfg.hStream))
	assert.EqualValues(t, 40, unsafe.Offsetof(cfg.attrs))
	assert.EqualValues(t, 48, unsafe.Offsetof(cfg.numAttrs))
	var attr cuLaunchAttribute
	assert.EqualValues(t, 72, unsafe.Sizeof(attr))
	assert.EqualValues(t, 8, unsafe.Offsetof(attr.value))
	assert.EqualValues(t, 8, unsafe.Alignof(attr))

	var prop memAllocationProp
	assert.EqualValues(t, 32, unsafe.Sizeof(prop))
	assert.EqualValues(t, 8, unsafe.Offsetof(prop.location))
	assert.EqualValues(t, 16, unsafe.Offsetof(prop.win32HandleMetaData))
	assert.EqualValues(t, 24, unsafe.Offsetof(prop.allocFlags))
	assert.EqualValues(t, 12, unsafe.Sizeof(memAccessDesc{}))
	assert.EqualValues(t, 64, unsafe.Sizeof(IPCMemHandle{}))

	var a Args
	assert.Zero(t, uintptr(unsafe.Pointer(&a.buf[0]))%8, "argument values are 8-byte aligned")
}
