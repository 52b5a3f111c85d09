package collective

import (
	"context"
	"fmt"
	"os"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/memory"
)

// Register shares a user buffer with the peers so that OneShot and TwoShot all-reduces whose
// src is ptr read it in place, without the copy into the staging buffer, and TwoShot
// all-reduces whose dst is ptr write every rank's share of the sum straight into it (see
// AllReduce for the conditions and the rule that every rank passes its counterpart). It is a
// collective call: every rank registers its own buffer of the same size, in the same order
// (ranks of one process call it from separate goroutines). The buffer must stay allocated
// until Close. Only memory from cuMemAlloc (or pointers into it) can be registered.
func (c *Comm) Register(ctx context.Context, ptr driver.DevicePtr, bytes uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return err
	}
	if ptr == 0 || ptr%16 != 0 || bytes == 0 || bytes%16 != 0 {
		return invalid("register %#x+%d: the buffer must be non-nil, 16-byte aligned and a multiple of 16 bytes", uint64(ptr), bytes)
	}
	if _, dup := c.registered[ptr]; dup {
		return invalid("buffer %#x is already registered", uint64(ptr))
	}
	ptrs, err := c.exchange(ctx, []driver.DevicePtr{ptr}, []uint64{bytes})
	if err != nil {
		return fmt.Errorf("collective: rank %d: register: %w", c.rank, err)
	}
	slot, err := c.table.fill(ptrs[0])
	if err != nil {
		return fmt.Errorf("collective: rank %d: register: %w", c.rank, err)
	}
	c.registered[ptr] = registration{slot: slot, bytes: bytes}
	return nil
}

// exchange gives every rank the pointers of every other rank's buffers, as usable in this
// process: result[i][r] is rank r's i-th buffer. Every rank passes the same number of buffers
// (else an error on every rank, never a silent mismatch) with the same sizes.
func (c *Comm) exchange(ctx context.Context, ptrs []driver.DevicePtr, sizes []uint64) ([][]driver.DevicePtr, error) {
	descs := make([]memory.Descriptor, len(ptrs))
	for i, p := range ptrs {
		if c.allLocal {
			// Same address space: the pointer is all a peer needs.
			descs[i] = memory.Descriptor{PID: os.Getpid(), Kind: memory.LegacyIPC, Ptr: uint64(p), Size: sizes[i]}
			continue
		}
		d, err := memory.DescribeUser(c.ctx, p, sizes[i])
		if err != nil {
			return nil, err
		}
		descs[i] = d
	}
	blob, err := marshalDescriptors(descs)
	if err != nil {
		return nil, err
	}
	blobs, err := c.boot.AllGather(ctx, blob)
	if err != nil {
		return nil, fmt.Errorf("exchange buffers: %w", err)
	}
	out := make([][]driver.DevicePtr, len(ptrs))
	for i := range out {
		out[i] = make([]driver.DevicePtr, c.size)
	}
	for r, b := range blobs {
		theirs, err := unmarshalDescriptors(b)
		if err != nil {
			return nil, fmt.Errorf("buffers of rank %d: %w", r, err)
		}
		if len(theirs) != len(ptrs) {
			return nil, fmt.Errorf("%w: rank %d has %d buffers to exchange, rank %d has %d: every rank must register or capture the same number of all-reduces",
				ErrInvalidArgument, r, len(theirs), c.rank, len(ptrs))
		}
		for i, d := range theirs {
			if d.Size != sizes[i] {
				return nil, fmt.Errorf("%w: buffer %d is %d bytes on rank %d and %d bytes on rank %d", ErrInvalidArgument, i, d.Size, r, sizes[i], c.rank)
			}
			if out[i][r], err = c.open(d); err != nil {
				return nil, fmt.Errorf("buffer %d of rank %d: %w", i, r, err)
			}
		}
	}
	return out, nil
}

// open maps a peer's user buffer, reusing an earlier mapping of the same allocation: an IPC
// handle may be opened only once per process.
func (c *Comm) open(d memory.Descriptor) (driver.DevicePtr, error) {
	if d.Local() {
		return driver.DevicePtr(d.Ptr), nil
	}
	key := ipcKey{pid: d.PID, handle: d.Handle}
	m, ok := c.opened[key]
	if !ok {
		base := d
		base.Offset = 0
		var err error
		if m, err = memory.Open(c.ctx, base, -1); err != nil {
			return 0, err
		}
		c.opened[key] = m
	}
	return m.Ptr() + driver.DevicePtr(d.Offset), nil
}

func marshalDescriptors(ds []memory.Descriptor) ([]byte, error) {
	var out []byte
	for _, d := range ds {
		b, err := d.MarshalBinary()
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
	return out, nil
}

func unmarshalDescriptors(b []byte) ([]memory.Descriptor, error) {
	n := memory.DescriptorBytes
	if len(b)%n != 0 {
		return nil, fmt.Errorf("descriptor list of %d bytes is not a multiple of %d", len(b), n)
	}
	ds := make([]memory.Descriptor, len(b)/n)
	for i := range ds {
		if err := ds[i].UnmarshalBinary(b[i*n : (i+1)*n]); err != nil {
			return nil, err
		}
	}
	return ds, nil
}
