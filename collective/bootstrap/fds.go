package bootstrap

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// dupFDs duplicates fds (close-on-exec, so they do not leak into child processes). On failure
// it closes the duplicates it made.
func dupFDs(fds []int) ([]int, error) {
	dups := make([]int, 0, len(fds))
	for _, fd := range fds {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			closeFDs(dups)
			return nil, fmt.Errorf("duplicate fd %d: %w", fd, err)
		}
		dups = append(dups, d)
	}
	return dups, nil
}

// checkFDs fails unless every fd is open, so that a bad descriptor is reported as the
// caller's rather than as a failure of the connection it was to travel on.
func checkFDs(fds []int) error {
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return fmt.Errorf("fd %d passed to AllGatherFDs: %w", fd, err)
		}
	}
	return nil
}

// closeFDs closes descriptors this package created and will not hand out. Errors are ignored:
// nothing useful can be done about a failed close of a descriptor nobody else uses.
func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
