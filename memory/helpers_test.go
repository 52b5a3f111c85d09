package memory

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/internal/gputest"
)

// The one allocation of testdata/fakecuda.c.
const (
	fakeAllocBase = 0x10000000
	fakeAllocSize = 1 << 20
)

// fakeDriverEnv marks the child process in which withFakeDriver runs a test.
const fakeDriverEnv = "GOCCL_MEMORY_TEST_FAKE_DRIVER"

// fakeCUDASource is embedded so that the test binary builds the fake anywhere.
//
//go:embed testdata/fakecuda.c
var fakeCUDASource []byte

// withFakeDriver runs check with a primary context of a fake libcuda (testdata/fakecuda.c),
// for the functions of this package that ask the driver about memory. The driver loads its
// library once per process, so the test runs itself again in a child process with
// GOCCL_LIBCUDA naming the fake, where check runs; the parent fails with the child's output if
// the child fails. Without a C compiler the test skips (fails under GOCCL_REQUIRE_TOOLS=1).
func withFakeDriver(t *testing.T, check func(t *testing.T, ctx *driver.Context)) {
	t.Helper()
	if os.Getenv(fakeDriverEnv) == "1" {
		require.NoError(t, driver.Init())
		require.Contains(t, driver.LibraryPath(), "libfakecuda", "the child runs on the fake")
		ctx, err := driver.PrimaryContext(0)
		require.NoError(t, err)
		defer ctx.Close()
		check(t, ctx)
		return
	}
	so := buildFakeCUDA(t)
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), fakeDriverEnv+"=1", "GOCCL_LIBCUDA="+so)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the test failed against the fake driver:\n%s", out)
	require.Contains(t, string(out), "--- PASS: "+t.Name(), "the child did not run the test:\n%s", out)
}

// buildFakeCUDA builds testdata/fakecuda.c, with a stub that returns CUDA_SUCCESS for every
// other required symbol of driver's table (so that driver.Init binds it), and returns the
// library's path.
func buildFakeCUDA(t *testing.T) string {
	t.Helper()
	cc := gputest.RequireCC(t, "the fake libcuda")
	var stubs strings.Builder
	for _, s := range driver.Symbols() {
		if !s.Optional {
			// Weak: the definitions of fakecuda.c win at link time.
			fmt.Fprintf(&stubs, "__attribute__((weak)) int %s(void) { return 0; }\n", s.Name)
		}
	}
	dir := t.TempDir()
	src, stub, so := filepath.Join(dir, "fakecuda.c"), filepath.Join(dir, "stubs.c"), filepath.Join(dir, "libfakecuda.so")
	require.NoError(t, os.WriteFile(src, fakeCUDASource, 0o644))
	require.NoError(t, os.WriteFile(stub, []byte(stubs.String()), 0o644))
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", so, src, stub).CombinedOutput()
	require.NoError(t, err, "build fake libcuda: %s", out)
	return so
}
