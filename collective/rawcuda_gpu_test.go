package collective_test

import (
	"os"
	"runtime"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/driver"
)

// rawStream creates a stream on ctx the way a foreign library would, by calling libcuda
// itself (cuCtxSetCurrent, cuStreamCreate with CU_STREAM_NON_BLOCKING), and returns its handle
// and a function that destroys it.
func rawStream(t *testing.T, ctx *driver.Context) (uintptr, func()) {
	t.Helper()
	path := os.Getenv("GOCCL_LIBCUDA")
	if path == "" {
		path = "libcuda.so.1"
	}
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	require.NoError(t, err)
	sym := func(name string) uintptr {
		p, err := purego.Dlsym(lib, name)
		require.NoError(t, err, name)
		return p
	}
	setCurrent, create, destroy := sym("cuCtxSetCurrent"), sym("cuStreamCreate"), sym("cuStreamDestroy_v2")
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, _, _ := purego.SyscallN(setCurrent, ctx.Handle())
	require.Zero(t, r, "cuCtxSetCurrent")
	var h uintptr
	r, _, _ = purego.SyscallN(create, uintptr(unsafe.Pointer(&h)), 1)
	require.Zero(t, r, "cuStreamCreate")
	return h, func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		purego.SyscallN(setCurrent, ctx.Handle())
		purego.SyscallN(destroy, h)
	}
}
