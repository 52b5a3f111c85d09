// Package memory allocates device memory that the ranks of a communicator share, describes it
// so that peers can reach it, and maps peers' memory into this process.
//
// Two kinds of shareable allocation exist:
//   - LegacyIPC: cuMemAlloc plus a 64-byte cuIpcGetMemHandle handle, opened by peers with
//     cuIpcOpenMemHandle. Works everywhere; cannot be opened in the process that made it.
//   - VMM: cuMemCreate with a POSIX file descriptor handle, passed between processes with
//     SCM_RIGHTS and mapped by peers with cuMemImportFromShareableHandle and cuMemMap. Needed
//     to share buffers that come from VMM allocators.
//
// A peer in the same process (virtual ranks, or NewGroup over several GPUs) never opens a
// handle: it uses the pointer itself. Descriptor carries the owner's ProcessID so that Open can
// tell: a process id (PID) cannot, since processes in different PID namespaces (containers)
// may share one.
//
// Ownership: a Buffer is freed by its Close; a Mapping is released by its Close. Neither is safe
// for concurrent Close.
package memory

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/goccl/goccl/driver"
)

// Kind selects how a Buffer is allocated and shared with other processes.
type Kind int

const (
	// LegacyIPC allocates with cuMemAlloc and shares with cuIpcGetMemHandle.
	LegacyIPC Kind = iota
	// VMM allocates with cuMemCreate and shares a POSIX file descriptor.
	VMM
)

// String returns "ipc" or "vmm".
func (k Kind) String() string {
	switch k {
	case LegacyIPC:
		return "ipc"
	case VMM:
		return "vmm"
	}
	return fmt.Sprintf("memory.Kind(%d)", int(k))
}

// Buffer is zero-filled device memory that peers can map.
type Buffer struct {
	ctx  *driver.Context
	ptr  driver.DevicePtr
	size uint64 // bytes the user asked for
	kind Kind

	// VMM only: the physical allocation and the mapped (granularity-rounded) size.
	phys   *driver.PhysicalAlloc
	mapped uint64
}

// Alloc allocates size bytes of zeroed, shareable device memory on ctx's device.
func Alloc(ctx *driver.Context, size uint64, kind Kind) (*Buffer, error) {
	if size == 0 {
		return nil, errors.New("memory: allocation of 0 bytes")
	}
	b := &Buffer{ctx: ctx, size: size, kind: kind}
	switch kind {
	case LegacyIPC:
		p, err := ctx.Alloc(size)
		if err != nil {
			return nil, fmt.Errorf("memory: allocate %d bytes: %w", size, err)
		}
		b.ptr = p
	case VMM:
		if err := b.allocVMM(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("memory: unknown kind %d", int(kind))
	}
	if err := ctx.MemsetD8(b.ptr, 0, size); err != nil {
		b.Close()
		return nil, fmt.Errorf("memory: zero %d bytes: %w", size, err)
	}
	return b, nil
}

func (b *Buffer) allocVMM() error {
	gran, err := b.ctx.VMMGranularity()
	if err != nil {
		return fmt.Errorf("memory: VMM granularity: %w", err)
	}
	b.mapped = roundUp(b.size, gran)
	phys, err := b.ctx.CreatePhysical(b.mapped)
	if err != nil {
		return fmt.Errorf("memory: create %d bytes of VMM memory: %w", b.mapped, err)
	}
	ptr, err := mapPhysical(b.ctx, phys, b.mapped, gran)
	if err != nil {
		phys.Release()
		return err
	}
	b.phys, b.ptr = phys, ptr
	return nil
}

// mapPhysical reserves an address range, maps phys there and grants ctx's device access.
func mapPhysical(ctx *driver.Context, phys *driver.PhysicalAlloc, size, align uint64) (driver.DevicePtr, error) {
	ptr, err := ctx.ReserveAddress(size, align)
	if err != nil {
		return 0, fmt.Errorf("memory: reserve %d bytes of address space: %w", size, err)
	}
	if err := ctx.Map(ptr, size, phys); err != nil {
		ctx.FreeAddress(ptr, size)
		return 0, fmt.Errorf("memory: map %d bytes: %w", size, err)
	}
	return ptr, nil
}

// Ptr returns the device address of the buffer in this process.
func (b *Buffer) Ptr() driver.DevicePtr { return b.ptr }

// Size returns the usable size in bytes.
func (b *Buffer) Size() uint64 { return b.size }

// Kind returns how the buffer is shared.
func (b *Buffer) Kind() Kind { return b.kind }

// Describe returns what a peer needs to map the buffer. For VMM buffers it also exports a new
// file descriptor that the caller must pass to the peers (bootstrap.AllGatherFDs) and close;
// for legacy buffers fd is -1.
func (b *Buffer) Describe() (d Descriptor, fd int, err error) {
	d = Descriptor{PID: os.Getpid(), Process: ProcessID(), Kind: b.kind, Ptr: uint64(b.ptr), Size: b.size}
	switch b.kind {
	case LegacyIPC:
		h, err := b.ctx.IPCGetMemHandle(b.ptr)
		if err != nil {
			return d, -1, fmt.Errorf("memory: IPC handle: %w", err)
		}
		d.Handle = h
		return d, -1, nil
	default:
		fd, err := b.phys.ExportFD()
		if err != nil {
			return d, -1, fmt.Errorf("memory: export VMM file descriptor: %w", err)
		}
		d.Mapped = b.mapped
		return d, fd, nil
	}
}

// Close frees the buffer. Peers must have closed their mappings first.
func (b *Buffer) Close() error {
	if b == nil || b.ptr == 0 {
		return nil
	}
	var err error
	switch b.kind {
	case LegacyIPC:
		err = b.ctx.Free(b.ptr)
	case VMM:
		err = errors.Join(b.ctx.Unmap(b.ptr, b.mapped), b.ctx.FreeAddress(b.ptr, b.mapped), b.phys.Release())
	}
	b.ptr = 0
	if err != nil {
		return fmt.Errorf("memory: free: %w", err)
	}
	return nil
}

// Descriptor tells a peer how to reach one buffer of another rank. It is plain data that
// travels through the bootstrap (MarshalBinary); a VMM buffer's file descriptor travels beside
// it.
type Descriptor struct {
	PID     int                 // process id of the owner, for messages
	Process uint64              // ProcessID of the owner: whether the buffer is this process's
	Kind    Kind                // how to open it from another process
	Ptr     uint64              // address in the owner's process
	Size    uint64              // usable bytes
	Mapped  uint64              // VMM: bytes of the physical allocation
	Offset  uint64              // legacy: offset of Ptr inside the allocation Handle names
	Handle  driver.IPCMemHandle // legacy: the allocation's IPC handle
}

// DescriptorBytes is the size of a marshalled Descriptor: seven 64-bit words and the IPC
// handle.
const DescriptorBytes = 8*7 + len(driver.IPCMemHandle{})

// ProcessID identifies this process among the processes that may share memory with it: a
// random 64-bit value drawn once per process, never 0. The process id (PID) does not: two
// processes in different PID namespaces (two containers on one host) may have the same one,
// and a peer's buffer taken for one of this process would be used through a pointer that
// means nothing here.
func ProcessID() uint64 { return processID() }

var processID = sync.OnceValue(func() uint64 {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand: it ends the program instead)
	return max(1, binary.LittleEndian.Uint64(b[:]))
})

// MarshalBinary encodes d in a fixed-size little-endian form.
func (d Descriptor) MarshalBinary() ([]byte, error) {
	out := make([]byte, DescriptorBytes)
	le := binary.LittleEndian
	le.PutUint64(out[0:], uint64(d.PID))
	le.PutUint64(out[8:], uint64(d.Kind))
	le.PutUint64(out[16:], d.Ptr)
	le.PutUint64(out[24:], d.Size)
	le.PutUint64(out[32:], d.Mapped)
	le.PutUint64(out[40:], d.Offset)
	le.PutUint64(out[48:], d.Process)
	copy(out[56:], d.Handle[:])
	return out, nil
}

// UnmarshalBinary decodes what MarshalBinary wrote.
func (d *Descriptor) UnmarshalBinary(b []byte) error {
	if len(b) != DescriptorBytes {
		return fmt.Errorf("memory: descriptor of %d bytes, want %d (peers run different goccl versions?)", len(b), DescriptorBytes)
	}
	le := binary.LittleEndian
	d.PID = int(le.Uint64(b[0:]))
	d.Kind = Kind(le.Uint64(b[8:]))
	d.Ptr = le.Uint64(b[16:])
	d.Size = le.Uint64(b[24:])
	d.Mapped = le.Uint64(b[32:])
	d.Offset = le.Uint64(b[40:])
	d.Process = le.Uint64(b[48:])
	copy(d.Handle[:], b[56:])
	return nil
}

// Local reports whether the buffer lives in this process, so its pointer can be used as is.
func (d Descriptor) Local() bool { return d.Process == ProcessID() }

// DescribeUser describes memory the user allocated (cuMemAlloc) so that peers can map it:
// the IPC handle names the whole allocation, so the descriptor records the offset of ptr in it.
func DescribeUser(ctx *driver.Context, ptr driver.DevicePtr, size uint64) (Descriptor, error) {
	d := Descriptor{PID: os.Getpid(), Process: ProcessID(), Kind: LegacyIPC, Ptr: uint64(ptr), Size: size}
	base, rangeSize, err := ctx.PointerRange(ptr)
	if err != nil {
		return d, fmt.Errorf("memory: find the allocation of %#x: %w", uint64(ptr), err)
	}
	// Compared without sums, which a huge size would wrap past the end of the address space
	// and let through. (Were ptr below base, ptr-base would wrap to a huge offset, refused too.)
	if size > rangeSize || uint64(ptr-base) > rangeSize-size {
		return d, fmt.Errorf("memory: buffer %#x+%d runs past its allocation (%#x+%d)", uint64(ptr), size, uint64(base), rangeSize)
	}
	h, err := ctx.IPCGetMemHandle(base)
	if err != nil {
		return d, fmt.Errorf("memory: IPC handle of user buffer %#x (memory from a VMM allocator is not supported for registration yet): %w", uint64(ptr), err)
	}
	d.Handle, d.Offset = h, uint64(ptr-base)
	return d, nil
}

// Mapping is a peer's buffer made addressable in this process.
type Mapping struct {
	ctx    *driver.Context
	ptr    driver.DevicePtr // start of the peer's buffer here
	base   driver.DevicePtr // what to release: IPC base or VMM reservation
	mapped uint64
	phys   *driver.PhysicalAlloc
	kind   Kind
	local  bool
}

// Open maps a peer's buffer into ctx. fd is the file descriptor received for a VMM buffer
// (Open takes ownership of it and closes it, whatever the descriptor's kind and whether or
// not it succeeds), -1 otherwise. A buffer of this same process is
// used directly; the caller enables peer access between different devices.
func Open(ctx *driver.Context, d Descriptor, fd int) (*Mapping, error) {
	m := &Mapping{ctx: ctx, kind: d.Kind}
	if fd >= 0 && (d.Local() || d.Kind != VMM) {
		// Only a VMM import uses the descriptor; whatever else came is closed here, as the
		// caller handed it over (a corrupt or foreign peer may send one with any kind).
		closeFD(fd)
	}
	if d.Local() {
		m.ptr, m.local = driver.DevicePtr(d.Ptr), true
		return m, nil
	}
	switch d.Kind {
	case LegacyIPC:
		base, err := ctx.IPCOpenMemHandle(d.Handle)
		if err != nil {
			return nil, fmt.Errorf("memory: open IPC handle of process %d: %w", d.PID, err)
		}
		m.base, m.ptr = base, base+driver.DevicePtr(d.Offset)
		return m, nil
	case VMM:
		if fd < 0 {
			return nil, fmt.Errorf("memory: VMM buffer of process %d arrived without a file descriptor", d.PID)
		}
		phys, err := ctx.ImportPhysicalFD(fd)
		closeFD(fd) // the import holds its own reference
		if err != nil {
			return nil, fmt.Errorf("memory: import VMM file descriptor of process %d: %w", d.PID, err)
		}
		gran, err := ctx.VMMGranularity()
		if err != nil {
			phys.Release()
			return nil, fmt.Errorf("memory: VMM granularity: %w", err)
		}
		ptr, err := mapPhysical(ctx, phys, d.Mapped, gran)
		if err != nil {
			phys.Release()
			return nil, err
		}
		m.base, m.ptr, m.mapped, m.phys = ptr, ptr, d.Mapped, phys
		return m, nil
	}
	return nil, fmt.Errorf("memory: descriptor of unknown kind %d", int(d.Kind))
}

// Ptr returns the address of the peer's buffer in this process.
func (m *Mapping) Ptr() driver.DevicePtr { return m.ptr }

// Close unmaps the peer's buffer. A local mapping has nothing to release.
func (m *Mapping) Close() error {
	if m == nil || m.local || m.base == 0 {
		return nil
	}
	var err error
	switch m.kind {
	case LegacyIPC:
		err = m.ctx.IPCCloseMemHandle(m.base)
	case VMM:
		err = errors.Join(m.ctx.Unmap(m.base, m.mapped), m.ctx.FreeAddress(m.base, m.mapped), m.phys.Release())
	}
	m.base = 0
	if err != nil {
		return fmt.Errorf("memory: close peer mapping: %w", err)
	}
	return nil
}

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }
