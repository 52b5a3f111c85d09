package collective

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/driver"
)

// TestInputSlot checks where a pull kernel reads its inputs, and when its input must go
// through the staging buffer (slot 0): exactly when the peers cannot read src itself. AllReduce
// lets the OneShot kernel stage then (ptx.FlagStageInput); every other staged call gets a copy
// before its kernel.
func TestInputSlot(t *testing.T) {
	const base = driver.DevicePtr(0x7000_0000)
	src, dst, other := driver.DevicePtr(0x1000_0000), driver.DevicePtr(0x2000_0000), driver.DevicePtr(0x3000_0000)
	const n = 4096
	newComm := func() *Comm {
		c := &Comm{table: &slotTable{base: base, slots: 8}, registered: map[driver.DevicePtr]*Registration{}}
		c.table.next = 3 // slot 0 (staging) and two registrations taken
		c.registered[src] = &Registration{ptr: src, bytes: n, slot: 1}
		c.registered[dst] = &Registration{ptr: dst, bytes: n, slot: 2}
		return c
	}
	staging, srcSlot := base, base+driver.DevicePtr(slotBytes)
	cases := []struct {
		name     string
		algo     Algorithm
		dst, src driver.DevicePtr
		bytes    uint64
		slot     driver.DevicePtr
		staged   bool
	}{
		{"oneshot unregistered", OneShot, dst, other, n, staging, true},
		{"oneshot unregistered in place", OneShot, other, other, n, staging, true},
		{"oneshot registered", OneShot, dst, src, n, srcSlot, false},
		// the kernel overwrites src while slower peers may still read it
		{"oneshot registered in place", OneShot, src, src, n, staging, true},
		{"oneshot registered, larger than the registration", OneShot, dst, src, n + 16, staging, true},
		{"twoshot unregistered", TwoShot, dst, other, n, staging, true},
		{"twoshot registered in place", TwoShot, src, src, n, srcSlot, false},
		{"twoshot registered", TwoShot, dst, src, n, srcSlot, false},
	}
	for _, tc := range cases {
		c := newComm()
		slot, staged, err := c.inputSlot(tc.algo, tc.dst, tc.src, tc.bytes)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.slot, slot, tc.name)
		assert.Equal(t, tc.staged, staged, tc.name)
	}

	// Under Capture: in place, OneShot stages (in its kernel) and shares nothing; otherwise the
	// buffer gets a slot of its own, the same for every use, filled after capture.
	c := newComm()
	c.capture = newCaptureState()
	slot, staged, err := c.inputSlot(OneShot, src, src, n)
	require.NoError(t, err)
	assert.Equal(t, [2]any{staging, true}, [2]any{slot, staged})
	assert.Empty(t, c.capture.uses, "an in-place call shares no buffer")
	first, staged, err := c.inputSlot(OneShot, dst, other, n)
	require.NoError(t, err)
	assert.False(t, staged)
	assert.Equal(t, base+3*slotBytes, first, "the next free slot")
	again, staged, err := c.inputSlot(TwoShot, other, other, n/2)
	require.NoError(t, err)
	assert.False(t, staged)
	assert.Equal(t, first, again, "one slot per captured buffer")
	assert.Equal(t, []uint32{0, 0}, c.capture.uses)
	assert.Equal(t, []uint64{n}, c.capture.sizes)
}
