package nccl

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestResultNames(t *testing.T) {
	want := []string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
		"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"}
	for i, w := range want {
		assert.Equal(t, w, Result(i).String())
		assert.Equal(t, w, Result(i).Error())
	}
	assert.Equal(t, "ncclResult_t(8)", Result(8).String())
	assert.Equal(t, "ncclResult_t(-1)", Result(-1).String())
}

// TestErrorIs: an *Error matches the sentinel of its code and no other, also wrapped.
func TestErrorIs(t *testing.T) {
	codes := []Result{ErrUnhandledCudaError, ErrSystemError, ErrInternalError, ErrInvalidArgument,
		ErrInvalidUsage, ErrRemoteError, ErrInProgress}
	for i, code := range codes {
		assert.Equal(t, Result(i+1), code)
		err := fmt.Errorf("context: %w", &Error{Op: "ncclAllReduce", Code: code, Message: "m"})
		for _, other := range codes {
			assert.Equal(t, other == code, errors.Is(err, other), "%v is %v", code, other)
		}
		for _, s := range []error{ErrNotFound, ErrVersion, ErrNotSupported, ErrClosed, ErrTimeout} {
			assert.NotErrorIs(t, err, s)
		}
	}
	assert.Equal(t, "ncclCommAbort: ncclRemoteError (6)", (&Error{Op: "ncclCommAbort", Code: 6}).Error())
}

func TestMessage(t *testing.T) {
	assert.Equal(t, "a: b", message("a", "b"))
	assert.Equal(t, "a", message("a", ""))
	assert.Equal(t, "a", message("a", "a"))
	assert.Equal(t, "b", message("", "b"))
}

func TestVersion(t *testing.T) {
	for code, v := range map[int]Version{21803: {2, 18, 3}, 22703: {2, 27, 3}, 2804: {2, 8, 4},
		21700: {2, 17, 0}, 30001: {3, 0, 1}} {
		assert.Equal(t, v, versionFromCode(code), "%d", code)
		assert.Equal(t, code, v.code(), "%v", v)
	}
	assert.Equal(t, "2.18.3", Version{2, 18, 3}.String())
	assert.True(t, Version{2, 17, 9}.Less(MinVersion))
	assert.False(t, MinVersion.Less(MinVersion))
	assert.True(t, Version{2, 18, 0}.Less(Version{2, 18, 1}))
	assert.False(t, Version{3, 0, 0}.Less(Version{2, 30, 0}))
}

func TestTypeNames(t *testing.T) {
	assert.Equal(t, "ncclBfloat16", BFloat16.String())
	assert.Equal(t, uint64(2), BFloat16.Size())
	assert.Equal(t, uint64(4), Float32.Size())
	assert.Equal(t, uint64(2), Float16.Size())
	assert.Equal(t, uint64(8), Float64.Size())
	assert.Equal(t, "ncclDataType_t(42)", DataType(42).String())
	assert.Zero(t, DataType(42).Size())
	assert.Equal(t, "ncclAvg", Avg.String())
	assert.Equal(t, "ncclRedOp_t(9)", RedOp(9).String())
	assert.Equal(t, "symmetric memory windows", FeatureWindow.String())
	assert.Equal(t, "Feature(9)", Feature(9).String())
}
