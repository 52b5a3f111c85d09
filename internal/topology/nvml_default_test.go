package topology

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These run against whichever NVML the build uses: purego by default, go-nvml under the
// goccl_nvml_cgo tag.

func TestDefaultNVMLMissingLibrary(t *testing.T) {
	t.Setenv("GOCCL_LIBNVML", "/nonexistent/libnvidia-ml.so.1")
	err := defaultNVML().Init()
	require.ErrorIs(t, err, ErrNoNVML)
	assert.Contains(t, err.Error(), "/nonexistent/libnvidia-ml.so.1", "the error says what was looked for")
	assert.Contains(t, err.Error(), "GOCCL_LIBNVML", "and what to do")
}

func TestDefaultNVMLInitWithoutGPU(t *testing.T) {
	requireEnv(t, "GOCCL_LIBNVML")
	nv := defaultNVML()
	err := nv.Init()
	if err == nil {
		require.NoError(t, nv.Shutdown())
		t.Skip("NVML initialised: this machine has an NVIDIA driver loaded")
	}
	var ne *NVMLError
	require.ErrorAs(t, err, &ne, "a real library without a driver fails with an NVML status, not a load error")
	assert.Equal(t, "nvmlInit_v2", ne.Op)
	assert.NotEqual(t, NVMLSuccess, ne.Code)
	assert.NotErrorIs(t, err, ErrNoNVML)
	assert.NotEmpty(t, ne.Message)
	t.Logf("nvmlInit_v2 without a GPU: %v", err)
}
