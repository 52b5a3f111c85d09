package driver

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// IPCMemHandle is a legacy CUDA IPC handle (CUipcMemHandle): 64 opaque bytes naming a whole
// cuMemAlloc allocation, for another process on the same node to map it.
type IPCMemHandle [64]byte

// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: let the importer map memory of another device of the
// node without enabling peer access to that whole context first.
const ipcMemLazyEnablePeerAccess = 0x1

// ipcExported remembers the handles this process created: the driver refuses to open them
// here, and its error (CUDA_ERROR_INVALID_CONTEXT) does not say why.
var ipcExported sync.Map // IPCMemHandle -> struct{}

// IPCGetMemHandle returns the IPC handle of the allocation at p (cuIpcGetMemHandle), which
// must be the base of a cuMemAlloc allocation (see PointerRange).
func (c *Context) IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error) {
	var h IPCMemHandle
	if err := c.call(cuIpcGetMemHandle, uintptr(unsafe.Pointer(&h)), uintptr(p)); err != nil {
		return IPCMemHandle{}, fmt.Errorf("IPC handle of %#x: %w", p, err)
	}
	ipcExported.Store(h, struct{}{})
	return h, nil
}

// IPCOpenMemHandle maps the allocation that another process exported with IPCGetMemHandle
// (cuIpcOpenMemHandle_v2, with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) and returns its address
// here. Close it with IPCCloseMemHandle. A handle created by this process cannot be opened
// here: the error says so, and the exporter's pointer is the one to use.
func (c *Context) IPCOpenMemHandle(h IPCMemHandle) (DevicePtr, error) {
	p, err := ipcOpen(c, &h, ipcMemLazyEnablePeerAccess)
	if err == nil {
		return p, nil
	}
	var e *Error
	if _, mine := ipcExported.Load(h); mine && errors.As(err, &e) {
		e.Message += ": IPC handles cannot be opened in the process that created them (use the exporter's pointer instead)"
		return 0, e
	}
	return 0, err
}

// IPCCloseMemHandle unmaps memory from IPCOpenMemHandle (cuIpcCloseMemHandle).
func (c *Context) IPCCloseMemHandle(p DevicePtr) error {
	return c.call(cuIpcCloseMemHandle, uintptr(p))
}
