package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOpenFirstNamesEveryPath: the error wraps ErrNoDriver and carries, from internal/dynlib,
// every path tried with its reason.
func TestOpenFirstNamesEveryPath(t *testing.T) {
	missing := "/nonexistent-goccl/lib/libcuda.so.1"
	bare := "libgoccl-nonexistent.so.1"
	_, _, err := openFirst([]string{missing, bare})
	require.ErrorIs(t, err, ErrNoDriver)
	assert.Contains(t, err.Error(), "; tried "+missing+" (no such file); "+bare+" (")
	assert.Contains(t, err.Error(), "cannot open shared object file", "the dynamic loader's reason")
}

func TestOpenLibraryExplicitPathOnly(t *testing.T) {
	p := "/nonexistent-goccl/libcuda.so.1"
	_, _, err := openLibrary(p)
	require.ErrorIs(t, err, ErrNoDriver)
	assert.Contains(t, err.Error(), "GOCCL_LIBCUDA")
	assert.Contains(t, err.Error(), "other locations are not searched")
	assert.Contains(t, err.Error(), p+" (no such file)")
	assert.NotContains(t, err.Error(), "/usr/lib64", "no fall back to the default locations")
}

func TestDefaultCandidates(t *testing.T) {
	c := defaultCandidates()
	require.NotEmpty(t, c)
	assert.Equal(t, "libcuda.so.1", c[0], "the dynamic loader goes first")
	for _, want := range []string{"/usr/lib64/libcuda.so.1", "/usr/lib/libcuda.so.1",
		"/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/wsl/lib/libcuda.so.1"} {
		assert.Contains(t, c, want)
	}
	for _, p := range c {
		assert.NotContains(t, p, "stubs")
	}
}

func TestBindMissingSymbols(t *testing.T) {
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	var present, absent, optional uintptr
	table := []symbol{
		req("sched_yield", &present),
		req("cuGocclNoSuchSymbol", &absent),
		opt("cuGocclNoSuchOptional", &optional, FeatureVMM, 10020),
	}
	assert.Equal(t, []string{"cuGocclNoSuchSymbol"}, bind(h, table), "only missing required symbols fail")
	assert.NotZero(t, present)
	assert.Zero(t, absent)
	assert.Zero(t, optional)

	assert.Empty(t, bind(0, table))
	assert.Zero(t, present, "bind(0) unbinds everything")
}

func TestSymbolTable(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range symbolTable {
		assert.False(t, seen[s.name], "%s listed twice", s.name)
		seen[s.name] = true
		assert.True(t, strings.HasPrefix(s.name, "cu"), s.name)
		if s.optional {
			assert.NotZero(t, s.since, "%s: optional symbols record their driver version", s.name)
		}
	}
	for _, f := range []Feature{FeatureLaunchEx, FeatureVMM, FeatureGraphs, FeatureParamInfo, FeaturePointerAttributes} {
		n := 0
		for _, s := range symbolTable {
			if s.optional && s.feature == f {
				n++
			}
		}
		assert.NotZero(t, n, "feature %v has symbols", f)
	}
}

// loadedLibrary loads libcuda (GOCCL_LIBCUDA or the default search) and returns its version.
// It skips without a library unless GOCCL_REQUIRE_TOOLS=1.
func loadedLibrary(t *testing.T) int {
	t.Helper()
	v, err := DriverVersion()
	if errors.Is(err, ErrNoDriver) && os.Getenv(envLibcuda) == "" {
		requireTool(t, envLibcuda) // skips, or fails in CI
	}
	require.NoError(t, err)
	return v
}

// TestSymbolsResolve checks the table against a real libcuda: Debian's 535 in CI (through
// GOCCL_LIBCUDA), the installed driver on a GPU machine.
func TestSymbolsResolve(t *testing.T) {
	version := loadedLibrary(t)
	t.Logf("libcuda %s, CUDA %s", LibraryPath(), versionString(version))
	infos := Symbols()
	require.Len(t, infos, len(symbolTable))
	var missing []string
	for i, s := range symbolTable {
		info := infos[i]
		require.Equal(t, s.name, info.Name)
		require.Equal(t, s.optional, info.Optional)
		if !s.optional {
			assert.True(t, info.Resolved, "required %s missing", s.name)
			continue
		}
		assert.Equal(t, version >= s.since, info.Resolved, "optional %s (since %s) on CUDA %s",
			s.name, versionString(s.since), versionString(version))
		if !info.Resolved {
			missing = append(missing, s.name)
		}
	}
	t.Logf("%d symbols, optional ones missing here: %v", len(infos), missing)

	for _, f := range []Feature{FeatureLaunchEx, FeatureVMM, FeatureGraphs, FeatureParamInfo, FeaturePointerAttributes} {
		err := need(f)
		assert.Equal(t, err == nil, Has(f), "%v", f)
		if err != nil {
			assert.ErrorIs(t, err, ErrNotSupported)
			assert.Contains(t, err.Error(), "needs a CUDA")
			t.Logf("%v", err)
		}
	}
}

// TestResultNamesMatchDriver checks the package's CUresult names against cuGetErrorName. Codes
// of a driver newer than the table are listed, not failed: Error.Name comes from the driver.
func TestResultNamesMatchDriver(t *testing.T) {
	loadedLibrary(t)
	matched := 0
	var unknown []string
	for code := Result(0); code < 1100; code++ {
		name := newError(cuInit, code).Name // the driver's name, or the table's without one
		switch {
		case resultNames[code] == "" && name != code.String():
			unknown = append(unknown, fmt.Sprintf("%d %s", code, name))
		case resultNames[code] != "":
			if assert.Equal(t, name, resultNames[code], "name of CUresult %d", code) {
				matched++
			}
		}
	}
	assert.Greater(t, matched, 90)
	if len(unknown) > 0 {
		t.Logf("codes this driver names that the package's table lacks: %v", unknown)
	}
}

// TestInitNoDevice runs Init on a real libcuda without a GPU (CI: Debian's libcuda1, whose
// cuInit returns CUDA_ERROR_NO_DEVICE).
func TestInitNoDevice(t *testing.T) {
	lib := requireTool(t, envLibcuda)
	err := Init()
	if err == nil {
		t.Skip("a CUDA device is visible; this test needs a driver without a GPU")
	}
	require.ErrorIs(t, err, ErrNoDevice)
	assert.NotErrorIs(t, err, ErrNoDriver)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "cuInit", e.Op)
	assert.Equal(t, Result(100), e.Code)
	assert.Equal(t, "CUDA_ERROR_NO_DEVICE", e.Name)
	assert.Contains(t, err.Error(), "no CUDA-capable device is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES")
	t.Logf("Init: %v", err)

	real, err2 := filepath.EvalSymlinks(lib)
	require.NoError(t, err2)
	assert.Equal(t, real, LibraryPath())
	assert.Contains(t, err.Error(), real, "the error names the library")

	// The answer is kept: later calls neither retry nor change it.
	assert.Equal(t, err, Init())
	_, err = DeviceCount()
	assert.ErrorIs(t, err, ErrNoDevice)
	_, err = PrimaryContext(0)
	assert.ErrorIs(t, err, ErrNoDevice)
}
