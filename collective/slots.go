package collective

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/ptx"
)

// slotTable is the registration table in device memory: slot i holds the world-size pointers
// (rank order) that a pull kernel reads through p_inputs or p_outputs. It is this rank's own,
// never shared: the pointers are the peers' buffers as mapped in this process, so slot numbers
// need not agree across ranks. Slots are zeroed at creation and when released, so a kernel
// that meets a slot that is not filled records ErrCodeUnfilledSlot instead of dereferencing 0.
type slotTable struct {
	ctx   *driver.Context
	base  driver.DevicePtr
	slots int
	next  int   // slots below next have been handed out at least once
	free  []int // released slots, reused first
}

// slotBytes is the size of one slot: room for MaxRanks pointers keeps slot addresses
// independent of the world size.
const slotBytes = 8 * ptx.MaxRanks

func newSlotTable(ctx *driver.Context, slots, worldSize int) (*slotTable, error) {
	size := uint64(slots) * slotBytes
	base, err := ctx.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("registration table (%d slots): %w", slots, err)
	}
	if err := ctx.MemsetD8(base, 0, size); err != nil {
		ctx.Free(base)
		return nil, fmt.Errorf("registration table: %w", err)
	}
	return &slotTable{ctx: ctx, base: base, slots: slots}, nil
}

// inUse is the number of slots held.
func (t *slotTable) inUse() int { return t.next - len(t.free) }

// reserve takes a free slot without filling it (graph capture fills it later). A full table
// returns -1, never a slot number: a caller that kept 0 and gave it back on its error path
// would put the staging slot, which every eager pull all-reduce reads through, on the free
// list for the next registration to overwrite.
func (t *slotTable) reserve() (int, error) {
	if n := len(t.free); n > 0 {
		slot := t.free[n-1]
		t.free = t.free[:n-1]
		return slot, nil
	}
	if t.next == t.slots {
		return -1, fmt.Errorf("%w: the registration table is full (%d slots held by registered buffers and captured graphs): release registrations and close graphs that are no longer used, or raise Options.MaxSlots", ErrInvalidArgument, t.slots)
	}
	t.next++
	return t.next - 1, nil
}

// fill takes a free slot and writes ptrs into it; it returns -1 on error.
func (t *slotTable) fill(ptrs []driver.DevicePtr) (int, error) {
	slot, err := t.reserve()
	if err != nil {
		return -1, err
	}
	if err := t.write(slot, ptrs); err != nil {
		// A failed write may have left part of the pointers in the slot: it is only handed
		// out again once zeroed.
		return -1, errors.Join(err, t.release(slot))
	}
	return slot, nil
}

// unreserve gives back slots that reserve handed out and that were never written, so they
// are still zero: the capture or registration that reserved them failed before filling them.
// It makes no driver call, so it also serves while a panic unwinds.
func (t *slotTable) unreserve(slots ...int) {
	if len(slots) > 0 { // a communicator without custom kernels has no table
		t.free = append(t.free, slots...)
	}
}

// write stores ptrs (rank order) into slot. It is synchronous: it runs at init, Register and
// the end of Capture, never on the all-reduce path.
func (t *slotTable) write(slot int, ptrs []driver.DevicePtr) error {
	var buf [slotBytes]byte
	for r, p := range ptrs {
		binary.LittleEndian.PutUint64(buf[8*r:], uint64(p))
	}
	if err := t.ctx.CopyHtoD(t.addr(slot), buf[:]); err != nil {
		return fmt.Errorf("write registration slot %d: %w", slot, err)
	}
	return nil
}

// release zeroes slots and makes them free again. The caller makes sure that no queued kernel
// still reads them.
func (t *slotTable) release(slots ...int) error {
	for _, slot := range slots {
		if err := t.write(slot, nil); err != nil {
			return err
		}
		t.free = append(t.free, slot)
	}
	return nil
}

// addr is the device address of slot, the value of p_inputs.
func (t *slotTable) addr(slot int) driver.DevicePtr {
	return t.base + driver.DevicePtr(slot*slotBytes)
}

func (t *slotTable) close() error {
	if t.base == 0 {
		return nil
	}
	err := t.ctx.Free(t.base)
	t.base = 0
	return err
}
