package dynlib

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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

// mapFile maps the first page of a new file at path read-only and returns the mapping's
// address; the mapping is removed when the test ends.
func mapFile(t *testing.T, path string) uintptr {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, make([]byte, os.Getpagesize()), 0o644))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close() // the mapping keeps the file
	mem, err := unix.Mmap(int(f.Fd()), 0, os.Getpagesize(), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return uintptr(unsafe.Pointer(&mem[0]))
}

// TestMappedFileKeepsSpacesInPaths: the path is the rest of the maps line after the inode,
// not a whitespace field, so a library under a folder with a space in its name (a home
// directory, "Program Files"-style installs) is reported whole, not cut at the space.
func TestMappedFileKeepsSpacesInPaths(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dir with space", "lib  two spaces.so.1")
	addr := mapFile(t, path)
	got, ok := MappedFile(addr)
	require.True(t, ok)
	assert.Equal(t, path, got)
	got, ok = MappedFile(addr + uintptr(os.Getpagesize()) - 1)
	require.True(t, ok, "the last byte of the mapping")
	assert.Equal(t, path, got)
}

// TestMappedFileOfARemovedFile: the kernel marks a file removed after it was mapped with
// " (deleted)"; that mark is not part of the path MappedFile returns.
func TestMappedFileOfARemovedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gone", "libgone.so.1")
	addr := mapFile(t, path)
	require.NoError(t, os.Remove(path))
	got, ok := MappedFile(addr)
	require.True(t, ok)
	assert.Equal(t, path, got)
}
