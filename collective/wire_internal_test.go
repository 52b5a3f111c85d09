package collective

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/memory"
)

// TestExchangeStatus: a rank's refusal travels in front of its blob and reaches every rank
// with the rank's reason; a long reason is cut, never the frame left unbounded.
func TestExchangeStatus(t *testing.T) {
	ok := withStatus([]byte("payload"), nil)
	payloads, err := splitStatus([][]byte{ok, withStatus(nil, nil)})
	require.NoError(t, err)
	assert.Equal(t, [][]byte{[]byte("payload"), {}}, payloads)

	refusal := fmt.Errorf("%w: register 0x8: the buffer must be 16-byte aligned", ErrInvalidArgument)
	_, err = splitStatus([][]byte{ok, withStatus([]byte("ignored"), refusal), ok, withStatus(nil, errors.New("capture failed"))})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	assert.Equal(t, map[int]string{1: refusal.Error(), 3: "capture failed"}, refused.Reasons)
	assert.Equal(t, "rank 1 refused: "+refusal.Error()+"; rank 3 refused: capture failed", err.Error())

	long := withStatus(nil, errors.New(string(make([]byte, 10*maxRefusalBytes))))
	assert.Len(t, long, 1+maxRefusalBytes)

	_, err = splitStatus([][]byte{ok, {}})
	assert.ErrorContains(t, err, "empty exchange blob from rank 1")
	_, err = splitStatus([][]byte{{7}})
	assert.ErrorContains(t, err, "unknown exchange status 7 from rank 0")
}

// TestPointerCache: a buffer inside a checked allocation needs no driver call; one that
// starts inside but runs past it, or lies in a gap, does.
func TestPointerCache(t *testing.T) {
	var pc pointerCache
	pc.add(allocRange{base: 0x2000, size: 0x1000})
	pc.add(allocRange{base: 0x1000, size: 0x100})
	pc.add(allocRange{base: 0x8000, size: 0x4000})
	for _, tc := range []struct {
		p    driver.DevicePtr
		n    uint64
		want bool
	}{
		{0x2000, 0x1000, true}, {0x2800, 0x10, true}, {0x2ff0, 0x10, true},
		{0x2ff0, 0x20, false}, // runs past its allocation
		{0x1100, 0x10, false}, // the gap after the first allocation
		{0x0ff0, 0x10, false}, {0x1000, 0x100, true}, {0xbff0, 0x10, true}, {0xc000, 0x10, false},
	} {
		assert.Equal(t, tc.want, pc.find(tc.p, tc.n), "%#x+%#x", uint64(tc.p), tc.n)
	}
	pc.add(allocRange{base: 0x2000, size: 0x2000}) // the range was freed and allocated again, larger
	assert.True(t, pc.find(0x3000, 0x10))
	assert.Len(t, pc.ranges, 3)
}

// TestCapturePattern: a buffer used by several captured calls takes one slot, and the
// pattern of uses, which every rank must share, says which calls share it.
func TestCapturePattern(t *testing.T) {
	table := &slotTable{slots: 8}
	c := &Comm{table: table}
	cs := newCaptureState()
	for _, use := range []struct {
		ptr   driver.DevicePtr
		bytes uint64
	}{{0x1000, 64}, {0x2000, 64}, {0x1000, 128}, {0x2000, 32}, {0x3000, 16}} {
		_, err := cs.share(c, use.ptr, use.bytes)
		require.NoError(t, err)
	}
	assert.Equal(t, []driver.DevicePtr{0x1000, 0x2000, 0x3000}, cs.bufs)
	assert.Equal(t, []uint64{128, 64, 16}, cs.sizes, "each buffer's largest use")
	assert.Equal(t, []int{0, 1, 2}, cs.slots)
	assert.Equal(t, 3, table.inUse())
	assert.Equal(t, []byte{0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0}, cs.pattern())
}

// TestSlotTableReuse: released slots are handed out again before new ones, and a full table
// says how to make room.
func TestSlotTableReuse(t *testing.T) {
	table := &slotTable{slots: 3}
	for want := range 3 {
		slot, err := table.reserve()
		require.NoError(t, err)
		assert.Equal(t, want, slot)
	}
	_, err := table.reserve()
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "close graphs that are no longer used")
	table.free = append(table.free, 1) // what release does after zeroing the slot
	slot, err := table.reserve()
	require.NoError(t, err)
	assert.Equal(t, 1, slot)
	assert.Equal(t, 3, table.inUse())
}

// TestRegisterRefusesWrappingSize: a registration whose end wraps around the address space is
// refused, also for a buffer inside an allocation already checked: its wrapped end would pass
// the allocation's bounds, and the registration would claim more bytes than the allocation
// has, which every peer's kernels then trust as the room of this rank's buffer.
func TestRegisterRefusesWrappingSize(t *testing.T) {
	const p = 0x7f0000000000
	c := &Comm{registered: map[driver.DevicePtr]*Registration{}}
	c.pointers.add(allocRange{base: p, size: 1 << 20})
	require.NoError(t, c.checkRegister(p, 1<<20), "the allocation itself, from the cache")
	for _, n := range []uint64{math.MaxUint64 - 15, math.MaxUint64 - p + 16} {
		err := c.checkRegister(p+16, n)
		assert.ErrorIs(t, err, ErrInvalidArgument, "%d bytes", n)
	}
	err := c.checkRegister(p+16, math.MaxUint64-15)
	assert.ErrorContains(t, err, "wraps around the address space")
}

// TestCheckArena: a peer's arena descriptor is used only if it describes an arena laid out as
// this rank's: the same sharing kind, exactly the layout's bytes from the allocation's start,
// and a VMM mapping that covers them. Anything else would have this rank's kernels index
// past the peer's arena, or the ranks disagree on whether file descriptors travel next.
func TestCheckArena(t *testing.T) {
	o, err := Options{}.withDefaults()
	require.NoError(t, err)
	total := newArenaLayout(o, 4).total
	legacy := memory.Descriptor{Kind: memory.LegacyIPC, Ptr: 0x7f0000000000, Size: total}
	vmm := memory.Descriptor{Kind: memory.VMM, Ptr: 0x7f0000000000, Size: total, Mapped: total + 4096}
	require.NoError(t, checkArena(1, 0, legacy, memory.LegacyIPC, total))
	require.NoError(t, checkArena(1, 0, vmm, memory.VMM, total))
	with := func(d memory.Descriptor, f func(d *memory.Descriptor)) memory.Descriptor { f(&d); return d }
	for _, tc := range []struct {
		name string
		d    memory.Descriptor
		kind memory.Kind
		want string
	}{
		{"other IPC kind", legacy, memory.VMM, "Options.IPC"},
		{"smaller arena", with(legacy, func(d *memory.Descriptor) { d.Size = total - 16 }), memory.LegacyIPC, "same goccl version"},
		{"larger arena", with(legacy, func(d *memory.Descriptor) { d.Size = total + 16 }), memory.LegacyIPC, "same goccl version"},
		{"offset", with(legacy, func(d *memory.Descriptor) { d.Offset = 4096 }), memory.LegacyIPC, "offset 4096"},
		{"VMM mapping short", with(vmm, func(d *memory.Descriptor) { d.Mapped = total / 2 }), memory.VMM, "maps"},
	} {
		err := checkArena(1, 0, tc.d, tc.kind, total)
		assert.ErrorContains(t, err, tc.want, tc.name)
		assert.ErrorContains(t, err, "rank 1", tc.name)
	}
	assert.ErrorIs(t, checkArena(1, 0, legacy, memory.VMM, total), ErrInvalidArgument, "mismatched options are the caller's")
}
