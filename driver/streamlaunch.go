package driver

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Launches without cuCtxSetCurrent.
//
// Every hot call binds its context first, since the CUDA API takes the context from the
// calling thread. A launch, though, names its stream, and the stream its context: the drivers
// measured here launch into the stream's context whatever is current on the thread (driver
// 580, scripts/bench/launch.c's probe: with no context and with another context current, the
// kernel ran on its stream). Not binding saves a second cgo call per launch: about 150 ns of
// 3.2 us in the quieter of two runs on an H200 VM; the other was too noisy to show it
// (docs/benchmarks.md). Since the driver documentation does not promise
// it, ProbeStreamLaunch tests it once per process before Launch and LaunchEx rely on it.

// streamLaunch is set once ProbeStreamLaunch has seen launches work without a current
// context; Launch and LaunchEx then skip cuCtxSetCurrent.
var streamLaunch atomic.Bool

var streamLaunchProbe struct {
	once sync.Once
	err  error
}

// probePTX's kernel stores 1 to the u32 its parameter points to.
const probePTX = `.version 7.0
.target sm_70
.address_size 64
.visible .entry goccl_probe_mark(.param .u64 p)
{
	.reg .b64 %a;
	.reg .b32 %v;
	ld.param.u64 %a, [p];
	cvta.to.global.u64 %a, %a;
	mov.u32 %v, 1;
	st.global.u32 [%a], %v;
	ret;
}
`

// ProbeStreamLaunch checks, once per process, whether this driver launches a kernel into its
// stream's context when no context is current on the calling thread (with cuLaunchKernel
// and, where present, cuLaunchKernelEx), using c for the test. If it does, Launch and LaunchEx
// stop binding the context before each launch from then on; if not, or if the probe itself
// fails, they keep binding it and the error says why. Later calls return the first answer.
//
// Call it outside stream capture, before the launches it should speed up (collective does so
// when a communicator is created). Launches are correct either way.
func ProbeStreamLaunch(c *Context) error {
	streamLaunchProbe.once.Do(func() {
		streamLaunchProbe.err = probeStreamLaunch(c)
		streamLaunch.Store(streamLaunchProbe.err == nil)
	})
	return streamLaunchProbe.err
}

// StreamLaunch reports whether Launch and LaunchEx skip binding the context (see
// ProbeStreamLaunch).
func StreamLaunch() bool { return streamLaunch.Load() }

func probeStreamLaunch(c *Context) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("probe of launches without a current context: "+format, args...)
	}
	mod, err := c.LoadModule("goccl_probe", []byte(probePTX))
	if err != nil {
		return fail("%w", err)
	}
	defer mod.Close()
	f, err := mod.Function("goccl_probe_mark")
	if err != nil {
		return fail("%w", err)
	}
	flag, err := c.AllocHost(4)
	if err != nil {
		return fail("%w", err)
	}
	defer flag.Close()
	s, err := c.NewStream()
	if err != nil {
		return fail("%w", err)
	}
	defer s.Close()
	args := new(Args)
	args.Ptr(flag.DevicePtr())
	cfg := &LaunchConfig{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}}
	ex := cuLaunchKernelEx != 0

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Leave the thread as it was found: another library's context may be current on it.
	var prev uintptr
	if err := call(cuCtxGetCurrent, uintptr(unsafe.Pointer(&prev))); err != nil {
		return fail("%w", err)
	}
	defer call(cuCtxSetCurrent, prev)
	for _, useEx := range []bool{false, true} {
		if useEx && !ex {
			continue
		}
		clear(flag.Bytes())
		if err := call(cuCtxSetCurrent, 0); err != nil {
			return fail("%w", err)
		}
		fn, name := cuLaunchKernel, "cuLaunchKernel"
		var r Result
		if useEx {
			fn, name = cuLaunchKernelEx, "cuLaunchKernelEx"
			r = raw(fn, uintptr(args.exConfig(s, cfg, false)), f.handle, uintptr(args.params()), 0)
		} else {
			r = raw(fn, f.handle, 1, 1, 1, 1, 1, 1, 0, s.handle, uintptr(args.params()), 0)
		}
		runtime.KeepAlive(args)
		if r != 0 {
			return fail("%s with no current context: %w", name, newError(fn, r))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.Wait(ctx)
		cancel()
		if err != nil {
			return fail("%s with no current context: %w", name, err)
		}
		if flag.Bytes()[0] != 1 {
			return fail("%s with no current context returned success, but the kernel did not run", name)
		}
	}
	return nil
}
