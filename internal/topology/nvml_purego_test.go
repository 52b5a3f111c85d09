//go:build !goccl_nvml_cgo

package topology

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nvmlBuild names the NVML binding this build uses, for the GPU test's output.
const nvmlBuild = "purego"

func TestPuregoResolvesEverySymbol(t *testing.T) {
	path := requireEnv(t, "GOCCL_LIBNVML")
	n := &puregoNVML{path: path}
	require.NoError(t, n.load())
	for _, s := range n.symbols() {
		assert.NotZero(t, *s.fn, s.name)
	}
	assert.Len(t, n.symbols(), 12)
}

func TestPuregoErrorStringFromLibrary(t *testing.T) {
	n := &puregoNVML{path: requireEnv(t, "GOCCL_LIBNVML")}
	require.NoError(t, n.load())
	err := n.check("nvmlDeviceGetP2PStatus", uintptr(NVMLErrorNotSupported)|0xdead_0000_0000)
	require.EqualError(t, err, "nvmlDeviceGetP2PStatus: NVML_ERROR_NOT_SUPPORTED (3): Not Supported",
		"only the low 32 bits of the return register count; the text comes from nvmlErrorString")
	assert.NoError(t, n.check("nvmlInit_v2", 0))
}

func TestPuregoMissingSymbol(t *testing.T) {
	// libc opens but has no NVML symbols: a clear error naming the first missing one.
	n := &puregoNVML{path: "libc.so.6"}
	err := n.load()
	require.ErrorContains(t, err, "symbol nvmlErrorString")
	assert.NotErrorIs(t, err, ErrNoNVML)
}

func TestPuregoPciInfoLayout(t *testing.T) {
	assert.Equal(t, uintptr(68), unsafe.Sizeof(nvmlPciInfo{}), "sizeof(nvmlPciInfo_t)")
	assert.Equal(t, uintptr(36), unsafe.Offsetof(nvmlPciInfo{}.busID), "offsetof(nvmlPciInfo_t, busId)")
}
