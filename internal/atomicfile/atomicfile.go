// Package atomicfile writes small files that other processes may read at any moment (the
// peer-check cache, tuning tables): the new contents appear whole or not at all.
package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
)

// Write replaces path with data and mode perm: it creates path's folder if needed, writes a
// temporary file named after pattern (as os.CreateTemp takes it) in that folder and renames
// it over path, so that a concurrent reader sees the old contents or the new ones, never
// part of them. On failure nothing is left behind and path is unchanged.
func Write(path, pattern string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	// The mode goes on the open file, not on its name: in a folder others can write, the
	// name may meanwhile point at another file (a symlink), whose mode a chmod by name
	// would change.
	merr := tmp.Chmod(perm)
	cerr := tmp.Close()
	err = errors.Join(werr, merr, cerr)
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
