package driver

import "unsafe"

// ipcOpen calls cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned
// Flags), whose handle is a 64-byte struct passed BY VALUE.
//
// AAPCS64 passes a composite larger than 16 bytes by reference: the caller makes a copy and
// passes its address in the next integer register. So the call is pdptr (X0), the address of
// a copy of the handle (X1), Flags (X2). The callee may write to the copy, hence a private one.
func ipcOpen(c *Context, h *IPCMemHandle, flags uint32) (DevicePtr, error) {
	tmp := *h
	var p DevicePtr
	err := c.call(cuIpcOpenMemHandle_v2, uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&tmp)), uintptr(flags))
	return p, err
}
