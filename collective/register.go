package collective

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/ptx"
)

// Registration is a user buffer shared with the peers by Register. Release it when the buffer
// is no longer used by all-reduces (before freeing it); Close of the communicator releases
// every registration.
type Registration struct {
	c     *Comm
	ptr   driver.DevicePtr
	bytes uint64
	slot  int
	keys  []ipcKey // peers' allocations mapped for this registration
	done  bool     // released, or its communicator closed
}

// Ptr returns the registered buffer's address.
func (r *Registration) Ptr() driver.DevicePtr { return r.ptr }

// Bytes returns the registered buffer's size.
func (r *Registration) Bytes() uint64 { return r.bytes }

// Release stops sharing the buffer: later all-reduces that pass it copy it into the staging
// buffer again, and its registration slot and the peers' mappings are given back (a peer's
// allocation stays mapped while another registration or graph uses it). Release first waits
// for this communicator's queued work (bounded like Close), since queued kernels may still
// read the buffer's slot. Unlike Register it is not a collective call: each rank releases its
// own registration, and the ranks need not release in the same order, but a rank must not pass
// the buffer's counterpart as registered once a peer has released its own. Releasing twice, or
// after the communicator's Close, does nothing.
func (r *Registration) Release() error {
	if r == nil || r.c == nil {
		return nil
	}
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.done {
		return nil
	}
	if err := c.drain(); err != nil {
		return fmt.Errorf("collective: rank %d: release registration of %#x: %w", c.rank, uint64(r.ptr), err)
	}
	r.done = true
	delete(c.registered, r.ptr)
	if err := errors.Join(c.table.release(r.slot), c.unopen(r.keys)); err != nil {
		return fmt.Errorf("collective: rank %d: release registration of %#x: %w", c.rank, uint64(r.ptr), err)
	}
	return nil
}

// Register shares a user buffer with the peers so that OneShot and TwoShot all-reduces whose
// src is ptr read it in place, without the copy into the staging buffer, and TwoShot
// all-reduces whose dst is ptr write every rank's share of the sum straight into it (see
// AllReduce for the conditions and the rule that every rank passes its counterpart).
//
// It is a collective call: every rank registers its own buffer of the same size, in the same
// order (ranks of one process call it from separate goroutines). The buffer must be device
// memory of this rank's device (from cuMemAlloc or a pointer into such an allocation), 16-byte
// aligned, and stay allocated until the Registration is released. A rank whose buffer is
// refused still takes part in the exchange, so every rank fails at once with the reason
// (*RefusedError names the refusing ranks), nothing is registered anywhere, and the
// communicator stays usable.
func (c *Comm) Register(ctx context.Context, ptr driver.DevicePtr, bytes uint64) (*Registration, error) {
	if c == nil {
		return nil, errNilComm
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if !c.custom {
		// Every rank knows this alike: no exchange needed.
		return nil, invalid("registration serves goccl's kernels, which do not serve this communicator (%s); NCCL takes its buffers as they are", c.noCustomWhy)
	}
	// Every local refusal is sent to the peers instead of returned at once.
	failure := c.usable()
	if failure == nil {
		failure = c.checkRegister(ptr, bytes)
	}
	slot := -1 // the slot this call holds, -1 while it holds none
	if failure == nil {
		slot, failure = c.table.reserve()
	}
	wrap := func(err error) error {
		return fmt.Errorf("collective: rank %d: register %#x (%d bytes): %w", c.rank, uint64(ptr), bytes, err)
	}
	ptrs, keys, err := c.exchange(ctx, []driver.DevicePtr{ptr}, []uint64{bytes}, nil, failure)
	if err != nil {
		// Nothing was written into the slot: it goes back as it is. Only a slot this call
		// reserved goes back (a full table gave none).
		if slot >= 0 {
			c.table.unreserve(slot)
		}
		return nil, wrap(err)
	}
	if err := c.table.write(slot, ptrs[0]); err != nil {
		// The write may have left part of the pointers: release zeroes the slot before it is
		// handed out again.
		return nil, errors.Join(wrap(err), c.table.release(slot), c.unopen(keys))
	}
	reg := &Registration{c: c, ptr: ptr, bytes: bytes, slot: slot, keys: keys}
	c.registered[ptr] = reg
	return reg, nil
}

// checkRegister is Register's local check of its buffer.
func (c *Comm) checkRegister(ptr driver.DevicePtr, bytes uint64) error {
	switch {
	case ptr == 0 || bytes == 0:
		return invalid("register %#x+%d: the buffer must be non-nil and non-empty", uint64(ptr), bytes)
	case ptr%ptx.VectorBytes != 0:
		return invalid("register %#x: the buffer must be %d-byte aligned", uint64(ptr), ptx.VectorBytes)
	}
	if _, dup := c.registered[ptr]; dup {
		return invalid("buffer %#x is already registered", uint64(ptr))
	}
	return c.checkPointer("registered buffer", ptr, bytes)
}

// exchange gives every rank the pointers of every other rank's buffers, as usable in this
// process: result[i][r] is rank r's i-th buffer. pattern is extra bytes that must be equal on
// every rank (how captured calls use the buffers). A rank with a failure sends it instead of
// its buffers: every rank then fails. Every rank passes the same number of buffers (else an
// error on every rank, never a silent mismatch) with the same sizes. keys are the peers'
// allocations mapped for the result, to be released with unopen; on error nothing stays
// mapped.
func (c *Comm) exchange(ctx context.Context, ptrs []driver.DevicePtr, sizes []uint64, pattern []byte, failure error) (out [][]driver.DevicePtr, keys []ipcKey, err error) {
	var payload []byte
	if failure == nil {
		payload, failure = c.describe(ptrs, sizes, pattern)
	}
	blobs, err := c.boot.AllGather(ctx, withStatus(payload, failure))
	if err != nil {
		return nil, nil, fmt.Errorf("exchange buffers: %w", err)
	}
	payloads, refused := splitStatus(blobs)
	if failure != nil {
		return nil, nil, failure
	}
	if refused != nil {
		return nil, nil, refused
	}
	out, keys, mapErr := c.openAll(payloads, sizes, pattern)
	// Opening can fail on one rank only (a peer's IPC handle that does not open here): the
	// ranks agree on the outcome once more, so that either all of them use the buffers or
	// none does.
	blobs, err = c.boot.AllGather(ctx, withStatus(nil, mapErr))
	if err == nil {
		_, err = splitStatus(blobs)
	}
	if err = errors.Join(mapErr, err); err != nil {
		return nil, nil, errors.Join(err, c.unopen(keys))
	}
	return out, keys, nil
}

// describe encodes this rank's part of an exchange: the pattern, then one descriptor per
// buffer.
func (c *Comm) describe(ptrs []driver.DevicePtr, sizes []uint64, pattern []byte) ([]byte, error) {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint32(len(pattern)))
	b.Write(pattern)
	for i, p := range ptrs {
		d := memory.Descriptor{PID: os.Getpid(), Process: memory.ProcessID(), Kind: memory.LegacyIPC, Ptr: uint64(p), Size: sizes[i]}
		if !c.allLocal {
			var err error
			if d, err = memory.DescribeUser(c.ctx, p, sizes[i]); err != nil {
				return nil, fmt.Errorf("share buffer %#x: %w", uint64(p), err)
			}
		}
		m, err := d.MarshalBinary()
		if err != nil {
			return nil, err
		}
		b.Write(m)
	}
	return b.Bytes(), nil
}

// openAll decodes every rank's part of an exchange and maps the peers' buffers.
func (c *Comm) openAll(payloads [][]byte, sizes []uint64, pattern []byte) (out [][]driver.DevicePtr, keys []ipcKey, err error) {
	out = make([][]driver.DevicePtr, len(sizes))
	for i := range out {
		out[i] = make([]driver.DevicePtr, c.size)
	}
	for r, p := range payloads {
		if len(p) < 4 || uint64(len(p)-4) < uint64(binary.LittleEndian.Uint32(p)) {
			return nil, keys, fmt.Errorf("malformed buffer list from rank %d", r)
		}
		n := binary.LittleEndian.Uint32(p)
		theirPattern, descs := p[4:4+n], p[4+n:]
		if !bytes.Equal(theirPattern, pattern) {
			return nil, keys, invalid("rank %d used its shared buffers in another pattern than rank %d (which calls share a buffer, or which calls read registered buffers in place): every rank must pass its counterparts in the same way", r, c.rank)
		}
		theirs, err := unmarshalDescriptors(descs)
		if err != nil {
			return nil, keys, fmt.Errorf("buffers of rank %d: %w", r, err)
		}
		if len(theirs) != len(sizes) {
			return nil, keys, invalid("rank %d has %d buffers to exchange, rank %d has %d: every rank must register or capture the same all-reduces", r, len(theirs), c.rank, len(sizes))
		}
		for i, d := range theirs {
			if d.Size != sizes[i] {
				return nil, keys, invalid("buffer %d is %d bytes on rank %d and %d bytes on rank %d", i, d.Size, r, sizes[i], c.rank)
			}
			ptr, key, err := c.open(d)
			if err != nil {
				return nil, keys, fmt.Errorf("buffer %d of rank %d: %w", i, r, err)
			}
			if key != nil {
				keys = append(keys, *key)
			}
			out[i][r] = ptr
		}
	}
	return out, keys, nil
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
