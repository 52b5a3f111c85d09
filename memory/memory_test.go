package memory

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/driver"
)

func TestDescriptorRoundTrip(t *testing.T) {
	d := Descriptor{PID: 4242, Process: 0x0123456789abcdef, Kind: VMM, Ptr: 0x7f1234560000, Size: 8 << 20, Mapped: 10 << 20, Offset: 4096}
	for i := range d.Handle {
		d.Handle[i] = byte(i * 3)
	}
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	require.Len(t, b, DescriptorBytes)
	var back Descriptor
	require.NoError(t, back.UnmarshalBinary(b))
	assert.Equal(t, d, back)

	err = back.UnmarshalBinary(b[:DescriptorBytes-1])
	assert.ErrorContains(t, err, "different goccl versions")
}

// TestDescriptorLocal: the process identity decides, not the process id, which a process in
// another PID namespace (another container) may share.
func TestDescriptorLocal(t *testing.T) {
	assert.True(t, Descriptor{PID: os.Getpid() + 1, Process: ProcessID()}.Local())
	assert.False(t, Descriptor{PID: os.Getpid(), Process: ProcessID() + 1}.Local())
	assert.False(t, Descriptor{PID: os.Getpid()}.Local(), "a descriptor without a process identity is no one's")
	assert.NotZero(t, ProcessID())
	assert.Equal(t, ProcessID(), ProcessID(), "drawn once")
}

func TestOpenLocalUsesThePointer(t *testing.T) {
	// A buffer of this process needs no driver call: Open returns its pointer, Close nothing.
	m, err := Open(nil, Descriptor{PID: os.Getpid(), Process: ProcessID(), Kind: LegacyIPC, Ptr: 0x7f0000001000}, -1)
	require.NoError(t, err)
	assert.Equal(t, uint64(0x7f0000001000), uint64(m.Ptr()))
	assert.NoError(t, m.Close())
}

func TestKindString(t *testing.T) {
	assert.Equal(t, "ipc", LegacyIPC.String())
	assert.Equal(t, "vmm", VMM.String())
	assert.Equal(t, "memory.Kind(7)", Kind(7).String())
}

func TestRoundUp(t *testing.T) {
	assert.Equal(t, uint64(2<<20), roundUp(1, 2<<20))
	assert.Equal(t, uint64(2<<20), roundUp(2<<20, 2<<20))
	assert.Equal(t, uint64(4<<20), roundUp(2<<20+1, 2<<20))
}

// TestDescribeUserRefusesSizesThatWrap: a buffer must end within its allocation. A size so
// large that ptr+size wraps around the address space must be refused like any other buffer
// that runs past the end, not slip through a sum that wrapped to a small number and hand peers
// a descriptor of nearly 2^64 bytes of a 1 MiB allocation.
func TestDescribeUserRefusesSizesThatWrap(t *testing.T) {
	withFakeDriver(t, func(t *testing.T, ctx *driver.Context) {
		const ptr = fakeAllocBase + 16
		d, err := DescribeUser(ctx, ptr, fakeAllocSize-16)
		require.NoError(t, err, "a buffer up to the allocation's last byte")
		assert.Equal(t, uint64(16), d.Offset)
		assert.Equal(t, uint64(fakeAllocSize-16), d.Size)
		assert.Equal(t, byte(0xab), d.Handle[0], "the handle of the whole allocation")

		for _, size := range []uint64{
			fakeAllocSize - 15,    // one byte past the end
			fakeAllocSize + 1,     // more than the whole allocation
			^uint64(0) - ptr + 16, // ptr+size wraps to 15
			^uint64(0),            // ptr+size wraps to ptr-1
			1 << 63,               // no wrap, far past the end
		} {
			_, err := DescribeUser(ctx, ptr, size)
			assert.ErrorContains(t, err, "runs past its allocation", "size %#x", size)
		}
	})
}

// TestOpenClosesTheFDOfEveryKind: Open takes ownership of the descriptor it is given, so it
// must close it whatever the descriptor's kind and whether or not it succeeds: a LegacyIPC or
// unknown kind (from a corrupt or foreign peer) that arrives with a descriptor must not leak
// it. The descriptor is the write end of a pipe: once it is closed, the read end sees EOF,
// which no reuse of the descriptor's number can fake.
func TestOpenClosesTheFDOfEveryKind(t *testing.T) {
	remote, local := ProcessID()+1, ProcessID()
	for _, d := range []Descriptor{
		{PID: 1, Process: remote, Kind: LegacyIPC},
		{PID: 1, Process: remote, Kind: VMM},
		{PID: 1, Process: remote, Kind: Kind(7)},
		{PID: os.Getpid(), Process: local, Kind: LegacyIPC, Ptr: 0x7f0000001000},
		{PID: os.Getpid(), Process: local, Kind: VMM, Ptr: 0x7f0000001000},
		{PID: os.Getpid(), Process: local, Kind: Kind(7), Ptr: 0x7f0000001000},
	} {
		name := fmt.Sprintf("%v local=%v", d.Kind, d.Local())
		var p [2]int
		require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK))
		// No driver here (a nil context): the remote kinds fail, and must close fd anyway.
		m, err := Open(nil, d, p[1])
		if err == nil {
			assert.NoError(t, m.Close())
		}
		n, rerr := unix.Read(p[0], make([]byte, 1))
		if rerr == unix.EAGAIN {
			unix.Close(p[1]) // still open, so still this test's
		}
		assert.True(t, n == 0 && rerr == nil, "%s: Open left its descriptor open (read: %d, %v)", name, n, rerr)
		unix.Close(p[0])
	}
}
