package memory

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
