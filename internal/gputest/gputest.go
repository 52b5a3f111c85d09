// Package gputest decides, in one place, whether a test that needs a GPU runs: it skips with
// the reason when this machine has no driver or no device, fails when GOCCL_REQUIRE_GPU=1 says
// that GPU tests must run here (the GPU bundle sets it), and fails on any other driver error,
// which a missing GPU does not explain. It does the same for the C compiler that builds the
// tests' fake libraries (RequireCC). Package driver's own tests have their copy of both: they
// cannot import a package that imports driver.
package gputest

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/goccl/goccl/driver"
)

// RequireEnv is the environment variable that turns a skip for a missing GPU into a failure.
const RequireEnv = "GOCCL_REQUIRE_GPU"

// Require skips tb unless a CUDA driver and at least one device are usable.
func Require(tb testing.TB) {
	tb.Helper()
	err := driver.Init()
	if err == nil {
		n, err2 := driver.DeviceCount()
		if err2 == nil && n > 0 {
			return
		}
		err = err2
	}
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatalf("%s=1 but no GPU is usable: %v", RequireEnv, err)
	}
	if err != nil && !errors.Is(err, driver.ErrNoDriver) && !errors.Is(err, driver.ErrNoDevice) {
		tb.Fatalf("the CUDA driver failed for a reason other than a missing driver or GPU: %v", err)
	}
	tb.Skipf("no GPU: %v", err)
}

// RequireDevices is Require for a test that needs n distinct GPUs: it skips when fewer are
// visible, even under GOCCL_REQUIRE_GPU=1 (a one-GPU machine cannot run it).
func RequireDevices(tb testing.TB, n int) {
	tb.Helper()
	Require(tb)
	if have, err := driver.DeviceCount(); err != nil || have < n {
		tb.Skipf("needs %d GPUs, %d visible (%v)", n, have, err)
	}
}

// ToolsEnv is the environment variable that turns a skip for a missing build tool (a C
// compiler for the fake libraries the tests build, ptxas, Debian's libcuda) into a failure, as
// in CI.
const ToolsEnv = "GOCCL_REQUIRE_TOOLS"

// RequireCC returns the path of the C compiler that builds a test's fake library (what), or
// skips tb without one; under GOCCL_REQUIRE_TOOLS=1 it fails instead.
func RequireCC(tb testing.TB, what string) string {
	tb.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		if os.Getenv(ToolsEnv) == "1" {
			tb.Fatalf("no C compiler but %s=1: %v", ToolsEnv, err)
		}
		tb.Skipf("no C compiler to build %s: %v", what, err)
	}
	return cc
}
