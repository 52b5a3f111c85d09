package bootstrap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// SocketDir returns a directory for bootstrap sockets that only this user can enter:
// $XDG_RUNTIME_DIR/goccl when XDG_RUNTIME_DIR is set and usable (an absolute path to a
// directory, not a symbolic link, owned by this user and closed to others, as the XDG spec
// requires), else os.TempDir()/goccl-<uid>. It creates the goccl directory with mode 0700
// where missing, and refuses one that exists but is a symbolic link, belongs to another user
// or has another mode: someone could then watch or take its sockets. The error says how to
// fix it.
//
// Sockets in it cannot be reached, or replaced, by other users; processes of the same user
// can, which is what the job token (TokenEnv) is for.
func SocketDir() (string, error) {
	return socketDir(os.Getenv("XDG_RUNTIME_DIR"), os.TempDir(), os.Getuid())
}

func socketDir(runtimeDir, tempDir string, uid int) (string, error) {
	if runtimeDir != "" && filepath.IsAbs(runtimeDir) && checkPrivate(runtimeDir, uid, false) == nil {
		return privateDir(filepath.Join(runtimeDir, "goccl"), uid)
	}
	return privateDir(filepath.Join(tempDir, "goccl-"+strconv.Itoa(uid)), uid)
}

// privateDir makes dir (mode 0700) if it is missing and checks that it is private to uid.
func privateDir(dir string, uid int) (string, error) {
	err := os.Mkdir(dir, 0o700)
	switch {
	case err == nil:
		// The umask may have taken bits away; nobody else can have entered it since.
		if err := os.Chmod(dir, 0o700); err != nil {
			return "", fmt.Errorf("socket directory %s: %w", dir, err)
		}
	case !errors.Is(err, fs.ErrExist):
		return "", fmt.Errorf("make the socket directory %s: %w (set TMPDIR to a writable directory, or %s to a socket path)", dir, err, SocketEnv)
	}
	if err := checkPrivate(dir, uid, true); err != nil {
		return "", err
	}
	return dir, nil
}

// checkPrivate fails unless dir is a directory (not a symbolic link) owned by uid that no
// other user can enter: with exact, its mode must be 0700, else any mode without group and
// other bits.
func checkPrivate(dir string, uid int, exact bool) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, &fs.PathError{Op: "lstat", Path: dir, Err: err})
	}
	mode := st.Mode & 0o7777
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("socket directory %s is a symbolic link: refusing it (another user may have planted it); remove it, or set TMPDIR elsewhere", dir)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("socket directory %s is not a directory: remove it, or set TMPDIR elsewhere", dir)
	case int(st.Uid) != uid:
		return fmt.Errorf("socket directory %s belongs to uid %d, not to this user (uid %d): refusing it (another user may have planted it); remove it, or set TMPDIR elsewhere",
			dir, st.Uid, uid)
	case exact && mode != 0o700, !exact && mode&0o077 != 0:
		return fmt.Errorf("socket directory %s has mode %#o, want 0700 (only its owner may enter it): run chmod 700 %s, or remove it", dir, mode, dir)
	}
	return nil
}
