package dynlib

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOpenNamesEveryPath: when nothing loads, the error names every path with its reason: a
// missing absolute path without asking the loader, a bare name with the loader's reason, and
// a file that exists but is no library with the loader's reason for it.
func TestOpenNamesEveryPath(t *testing.T) {
	missing := "/nonexistent-goccl/lib/libgoccl.so.1"
	bare := "libgoccl-nonexistent.so.1"
	notLib := filepath.Join(t.TempDir(), "libgoccl.so.1")
	require.NoError(t, os.WriteFile(notLib, []byte("not an ELF file"), 0o644))

	_, _, err := Open([]string{missing, bare, notLib})
	require.Error(t, err)
	msg := err.Error()
	assert.Contains(t, msg, "tried "+missing+" (no such file); ")
	assert.Contains(t, msg, bare+" (")
	assert.Contains(t, msg, "cannot open shared object file", "the dynamic loader's reason")
	assert.Contains(t, msg, notLib+" (")
	assert.Contains(t, msg, "file too short", "the reason a file that exists failed")

	_, _, err = Open(nil)
	assert.EqualError(t, err, "no path to try")
}

// TestOpenFirstThatLoads: the first path that loads wins, and MappedFile finds the real file
// of one of its symbols.
func TestOpenFirstThatLoads(t *testing.T) {
	h, path, err := Open([]string{"/nonexistent-goccl/libc.so.6", "libc.so.6", "libm.so.6"})
	require.NoError(t, err)
	assert.Equal(t, "libc.so.6", path)
	sym, err := purego.Dlsym(h, "getpid")
	require.NoError(t, err)
	file, ok := MappedFile(sym)
	require.True(t, ok)
	assert.True(t, filepath.IsAbs(file), file)
	assert.Contains(t, filepath.Base(file), "libc")

	_, ok = MappedFile(0)
	assert.False(t, ok, "no file holds address 0")
}
