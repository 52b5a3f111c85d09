package driver

import (
	"runtime"
	"testing"

	"github.com/ebitengine/purego"
)

// Launch overhead, measured side by side in one run (go test -bench Launch -benchmem): an empty
// kernel through Launch, and the same cuLaunchKernel through a bare purego.SyscallN. The
// difference is this package's cost per launch (checks, context binding); allocs/op must be 0.

func benchKernel(b *testing.B) (*Stream, *Function) {
	c := requireGPU(b)
	m := loadModule(b, c, "goccl_test", testPTX)
	return newStream(b, c), kernel(b, m, "goccl_test_empty")
}

func BenchmarkLaunch(b *testing.B) {
	s, f := benchKernel(b)
	// The binding path, even if a probe in this process enabled the other one.
	prev := streamLaunch.Swap(false)
	b.Cleanup(func() { streamLaunch.Store(prev) })
	launchLoop(b, s, f)
}

// launchLoop times Launch of the empty kernel f on s.
func launchLoop(b *testing.B, s *Stream, f *Function) {
	cfg := &LaunchConfig{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}}
	args := new(Args)
	b.ReportAllocs()
	for b.Loop() {
		if err := Launch(s, f, cfg, args); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	waitStream(b, s)
}

func BenchmarkLaunchBareSyscall(b *testing.B) {
	s, f := benchKernel(b)
	// Make the context current once, as a C program would; the goroutine stays on this thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := s.ctx.makeCurrent(); err != nil {
		b.Fatal(err)
	}
	// One argument slice for all calls: a fresh one per call would be a heap allocation.
	args := []uintptr{f.handle, 1, 1, 1, 1, 1, 1, 0, s.handle, 0, 0}
	b.ReportAllocs()
	for b.Loop() {
		if r, _, _ := purego.SyscallN(cuLaunchKernel, args...); uint32(r) != 0 {
			b.Fatal(newError(cuLaunchKernel, Result(int32(uint32(r)))))
		}
	}
	b.StopTimer()
	waitStream(b, s)
}

// BenchmarkLaunchStreamContext is BenchmarkLaunch after ProbeStreamLaunch: where the driver
// takes the context from the stream, each launch is one cgo call instead of two.
func BenchmarkLaunchStreamContext(b *testing.B) {
	s, f := benchKernel(b)
	if err := ProbeStreamLaunch(s.ctx); err != nil {
		b.Skip(err)
	}
	launchLoop(b, s, f)
}
