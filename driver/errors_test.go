package driver

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestErrorFormat(t *testing.T) {
	e := &Error{Op: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Message: "out of memory"}
	assert.Equal(t, "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", e.Error())

	// Without the driver's strings, the name comes from the package's table.
	e = &Error{Op: "cuInit", Code: 100}
	assert.Equal(t, "cuInit: CUDA_ERROR_NO_DEVICE (100)", e.Error())

	e = &Error{Op: "cuStreamSynchronize", Code: 700, Name: "CUDA_ERROR_ILLEGAL_ADDRESS", Message: "an illegal memory access was encountered"}
	assert.Equal(t, "cuStreamSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered"+
		" (the CUDA context is lost: every later call on it fails; restart the process to use the GPU again)", e.Error())

	assert.Equal(t, "CUresult(4242)", Result(4242).String())
	assert.Equal(t, "CUDA_ERROR_INVALID_PTX", Result(218).Error())
}

func TestErrorIs(t *testing.T) {
	cases := map[Result][]error{
		34: {ErrNoDriver}, 100: {ErrNoDevice}, 801: {ErrNotSupported}, 1: {ErrInvalidValue},
		2: {ErrOutOfMemory}, 201: {ErrInvalidContext}, 218: {ErrInvalidPTX}, 222: {ErrUnsupportedPTXVersion},
		217: {ErrPeerAccessUnsupported}, 704: {ErrPeerAccessAlreadyEnabled},
		700: {ErrIllegalAddress, ErrContextLost}, 719: {ErrLaunchFailed, ErrContextLost},
		701: {ErrLaunchOutOfResources}, 600: {ErrNotReady}, 500: {ErrNotFound},
		900: {ErrStreamCapture}, 904: {ErrStreamCapture}, 907: {ErrStreamCapture}, 908: {ErrStreamCapture},
		909: {ErrTimeout}, 808: {ErrMPSLimit}, 809: {ErrMPSLimit},
		// The codes after which cuda.h says the process must restart to use CUDA.
		226: {ErrContextLost}, 702: {ErrContextLost}, 710: {ErrContextLost}, 714: {ErrContextLost},
		715: {ErrContextLost}, 716: {ErrContextLost}, 717: {ErrContextLost}, 718: {ErrContextLost},
		721: {ErrContextLost}, 810: {ErrContextLost}, 911: {ErrContextLost},
		// Failures that leave the context usable.
		720: nil, 999: nil, 214: nil, 709: nil,
	}
	all := []error{ErrNoDriver, ErrNoDevice, ErrNotSupported, ErrInvalidValue, ErrOutOfMemory,
		ErrInvalidContext, ErrInvalidPTX, ErrUnsupportedPTXVersion, ErrPeerAccessUnsupported,
		ErrPeerAccessAlreadyEnabled, ErrIllegalAddress, ErrLaunchFailed, ErrLaunchOutOfResources,
		ErrNotReady, ErrNotFound, ErrStreamCapture, ErrTimeout, ErrContextLost, ErrNotDeviceMemory,
		ErrMPSLimit}
	for code, want := range cases {
		err := fmt.Errorf("context: %w", &Error{Op: "cuX", Code: code})
		for _, s := range all {
			assert.Equal(t, slices.Contains(want, s), errors.Is(err, s), "code %d against %v", code, s)
		}
	}
	for code := Result(0); code < 1000; code++ {
		if errors.Is(&Error{Op: "cuX", Code: code}, ErrContextLost) {
			assert.NotNil(t, cases[code], "code %d matches ErrContextLost but is not listed here", code)
		}
	}
	assert.False(t, errors.Is(&Error{Op: "cuX", Code: 999}, ErrInvalidValue))
	assert.False(t, errors.Is(&Error{Op: "cuX", Code: 910}, ErrStreamCapture))
}

func TestJITErrorFormat(t *testing.T) {
	base := &Error{Op: "cuModuleLoadDataEx", Code: 218, Name: "CUDA_ERROR_INVALID_PTX",
		Message: "a PTX JIT compilation failed"}
	e := &JITError{
		Kernel: "goccl_test",
		Err:    base,
		Log: []string{"ptxas warning: one", "ptxas warning: two", "ptxas warning: three",
			"ptxas application ptx input, line 6; error   : Unknown symbol 'x'",
			"ptxas fatal   : Ptx assembly aborted due to errors"},
		InfoLog: []string{"ptxas info    : 0 bytes gmem"},
	}
	assert.Equal(t, "load module goccl_test: cuModuleLoadDataEx: CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation failed: "+
		"ptxas application ptx input, line 6; error   : Unknown symbol 'x': "+
		"ptxas fatal   : Ptx assembly aborted due to errors (3 lines omitted)", e.Error())
	assert.Equal(t, e.Error(), fmt.Sprintf("%v", e))
	assert.Equal(t, e.Error(), fmt.Sprintf("%s", e))

	full := fmt.Sprintf("%+v", e)
	for _, l := range append(e.Log, e.InfoLog...) {
		assert.Contains(t, full, "\t"+l, "every line in %%+v")
	}
	assert.True(t, strings.HasPrefix(full, "load module goccl_test: cuModuleLoadDataEx"))
	assert.Contains(t, full, "\nerror log:\n\tptxas warning: one\n")
	assert.Contains(t, full, "\ninfo log:\n\tptxas info    : 0 bytes gmem")
	assert.NotContains(t, full, "omitted")

	e.Log = e.Log[1:4]
	assert.True(t, strings.HasSuffix(e.Error(), " (1 line omitted)"), e.Error())
	e.Log = nil
	assert.Equal(t, "load module goccl_test: "+base.Error(), e.Error())

	var err error = fmt.Errorf("setup: %w", e)
	assert.ErrorIs(t, err, ErrInvalidPTX)
	var je *JITError
	require.ErrorAs(t, err, &je)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, Result(218), ce.Code)

	assert.NoError(t, (&JITError{Kernel: "k"}).Unwrap(), "a nil Err unwraps to a nil error")
}

func TestLogLines(t *testing.T) {
	buf := make([]byte, 64)
	copy(buf, "line one\r\n\n  \nline two\n")
	copy(buf[40:], "garbage after the NUL")
	assert.Equal(t, []string{"line one", "line two"}, logLines(buf))
	assert.Nil(t, logLines(make([]byte, 8)))
	assert.Equal(t, []string{"no NUL"}, logLines([]byte("no NUL")))
}
