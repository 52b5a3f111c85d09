// Package dynlib opens shared libraries at run time through purego, for the packages that
// bind one (driver: libcuda, nccl: libnccl): the first of a list of candidate paths that
// loads, with the reason each other candidate failed, and the file a loaded symbol came from.
// It knows nothing of the libraries' functions; binding their symbols stays with the package
// that knows their ABI.
package dynlib

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/ebitengine/purego"
)

// Open dlopens the first of paths that loads and returns its handle and path. An absolute
// path that does not exist is passed over as "no such file" without asking the dynamic
// loader; a bare name is left to the loader's search. If none loads, the error says for each
// path why: "tried a (reason); b (reason)". The library is opened RTLD_NOW, so that a missing
// dependency fails here rather than at a first call, and RTLD_LOCAL, so that its symbols
// neither leak into nor clash with another copy that some other library of the process loaded.
func Open(paths []string) (uintptr, string, error) {
	var tried []string
	for _, p := range paths {
		if filepath.IsAbs(p) {
			if _, err := os.Stat(p); err != nil {
				reason := err.Error()
				if errors.Is(err, fs.ErrNotExist) {
					reason = "no such file"
				}
				tried = append(tried, fmt.Sprintf("%s (%s)", p, reason))
				continue
			}
		}
		h, err := dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err == nil {
			return h, p, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%v)", p, err))
	}
	if len(tried) == 0 {
		return 0, "", errors.New("no path to try")
	}
	return 0, "", errors.New("tried " + strings.Join(tried, "; "))
}

// MappedFile returns the file mapped at addr in this process, from /proc/self/maps: it turns
// the name the dynamic loader resolved ("libcuda.so.1") into the real path of the library
// that an entry point's address lies in. False where the maps cannot be read or no file
// holds addr.
func MappedFile(addr uintptr) (string, bool) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		start, end, path, ok := parseMapsLine(sc.Text())
		if ok && uint64(addr) >= start && uint64(addr) < end {
			return path, true
		}
	}
	return "", false
}

// parseMapsLine reads one line of /proc/self/maps, "start-end perms offset dev inode path",
// and returns its address range and path; false for a line without a file (anonymous memory,
// [heap], [stack]). The path is the rest of the line after the inode, not a whitespace field:
// it may hold spaces. The kernel pads the inode with spaces and marks a file removed since it
// was mapped with " (deleted)", which is not part of its name.
func parseMapsLine(line string) (start, end uint64, path string, ok bool) {
	var fields [5]string
	rest := line
	for i := range fields {
		var found bool
		fields[i], rest, found = strings.Cut(strings.TrimLeft(rest, " "), " ")
		if !found {
			return 0, 0, "", false
		}
	}
	path = strings.TrimSuffix(strings.TrimLeft(rest, " "), " (deleted)")
	if !strings.HasPrefix(path, "/") {
		return 0, 0, "", false
	}
	lo, hi, found := strings.Cut(fields[0], "-")
	if !found {
		return 0, 0, "", false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, "", false
	}
	return start, end, path, true
}

// dlopen is purego.Dlopen on one OS thread: dlerror's reason for a failure belongs to the
// thread that called dlopen, and the goroutine could otherwise move between the two calls and
// report an empty reason.
func dlopen(path string, mode int) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(path, mode)
}
