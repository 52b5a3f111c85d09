package driver

import (
	"encoding/binary"
	"unsafe"
)

// ipcOpen calls cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned
// Flags), whose handle is a 64-byte struct passed BY VALUE.
//
// The x86-64 System V ABI classifies a struct larger than 16 bytes as MEMORY: it takes no
// register; the caller copies it onto the stack, in argument order, where the callee finds it
// at the first stack argument slot. The integer arguments around it still take the integer
// registers in order: pdptr goes in RDI and Flags in RSI (not RDX: the struct used no register).
// purego.SyscallN puts its arguments 1..6 in RDI, RSI, RDX, RCX, R8, R9 and 7.. in consecutive
// stack slots, so the call is: pdptr, Flags, four unused register slots, then the handle's
// eight words as stack slots 7..14.
func ipcOpen(c *Context, h *IPCMemHandle, flags uint32) (DevicePtr, error) {
	var w [8]uintptr
	for i := range w {
		w[i] = uintptr(binary.LittleEndian.Uint64(h[8*i:]))
	}
	var p DevicePtr
	err := c.call(cuIpcOpenMemHandle_v2, uintptr(unsafe.Pointer(&p)), uintptr(flags), 0, 0, 0, 0,
		w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])
	return p, err
}
