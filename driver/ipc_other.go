//go:build !amd64 && !arm64

package driver

import (
	"fmt"
	"runtime"
)

// ipcOpen is implemented only where the by-value passing of the 64-byte handle is known
// (ipc_amd64.go, ipc_arm64.go).
func ipcOpen(c *Context, h *IPCMemHandle, flags uint32) (DevicePtr, error) {
	return 0, fmt.Errorf("cuIpcOpenMemHandle_v2 on %s: %w", runtime.GOARCH, ErrNotSupported)
}
