package driver

import (
	"context"
	_ "embed"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"
)

// requireTool returns the value of env (a tool path from scripts/fetch-tools.sh). Unset, the
// test skips, or fails under GOCCL_REQUIRE_TOOLS=1 (CI).
func requireTool(t testing.TB, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if os.Getenv("GOCCL_REQUIRE_TOOLS") == "1" {
			t.Fatalf("%s is not set but GOCCL_REQUIRE_TOOLS=1: run eval \"$(scripts/fetch-tools.sh)\"", env)
		}
		t.Skipf("%s is not set: run eval \"$(scripts/fetch-tools.sh)\" to run this test", env)
	}
	return v
}

// requireGPU returns the primary context of device 0, closed at the end of the test. Without a
// driver or a GPU the test skips, or fails under GOCCL_REQUIRE_GPU=1 (the GPU machine).
func requireGPU(t testing.TB) *Context {
	t.Helper()
	if err := Init(); err != nil {
		if !errors.Is(err, ErrNoDriver) && !errors.Is(err, ErrNoDevice) {
			t.Fatalf("init: %v", err)
		}
		if os.Getenv("GOCCL_REQUIRE_GPU") == "1" {
			t.Fatalf("GOCCL_REQUIRE_GPU=1 but no usable GPU: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
	d, err := GetDevice(0)
	require.NoError(t, err)
	c, err := PrimaryContext(d)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// gpuTimeout bounds every wait of the GPU tests: a hung kernel fails a test, not the run.
const gpuTimeout = 30 * time.Second

// waitStream waits for s with gpuTimeout.
func waitStream(t testing.TB, s *Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
	defer cancel()
	require.NoError(t, s.Wait(ctx))
}

// libcSymbol returns the address of a libc function.
func libcSymbol(t testing.TB, name string) uintptr {
	t.Helper()
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	fn, err := purego.Dlsym(h, name)
	require.NoError(t, err)
	return fn
}

// swapSymbol points a bound entry at fn for the rest of the test.
func swapSymbol(t testing.TB, slot *uintptr, fn uintptr) {
	t.Helper()
	old := *slot
	*slot = fn
	t.Cleanup(func() { *slot = old })
}

// fakeCUDASource is embedded so that the test binary builds the fake anywhere, also from the
// GPU bundle, away from the source tree.
//
//go:embed testdata/fakecuda.c
var fakeCUDASource []byte

// fakeCUDA builds testdata/fakecuda.c with cc and returns a lookup of its symbols. Without a
// C compiler the test skips (fails under GOCCL_REQUIRE_TOOLS=1).
func fakeCUDA(t testing.TB) func(name string) uintptr {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		if os.Getenv("GOCCL_REQUIRE_TOOLS") == "1" {
			t.Fatalf("no C compiler but GOCCL_REQUIRE_TOOLS=1: %v", err)
		}
		t.Skipf("no C compiler to build the fake libcuda: %v", err)
	}
	dir := t.TempDir()
	src, so := filepath.Join(dir, "fakecuda.c"), filepath.Join(dir, "libfakecuda.so")
	require.NoError(t, os.WriteFile(src, fakeCUDASource, 0o644))
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", so, src).CombinedOutput()
	require.NoError(t, err, "build fake libcuda: %s", out)
	h, err := purego.Dlopen(so, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	return func(name string) uintptr {
		fn, err := purego.Dlsym(h, name)
		require.NoError(t, err)
		return fn
	}
}

// fakeHandles returns a context, stream and function with made-up handles, for running the
// launch path against fake entry points.
func fakeHandles() (*Context, *Stream, *Function) {
	c := &Context{handle: 0xc0, dev: 0}
	s := &Stream{ctx: c, handle: 0x5e}
	m := &Module{ctx: c, handle: 0x3d, name: "fake"}
	return c, s, &Function{mod: m, handle: 0xf0, name: "goccl_fake"}
}
