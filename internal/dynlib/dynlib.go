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
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(fields[5], "/") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && uint64(addr) >= start && uint64(addr) < end {
			return fields[5], true
		}
	}
	return "", false
}

// dlopen is purego.Dlopen on one OS thread: dlerror's reason for a failure belongs to the
// thread that called dlopen, and the goroutine could otherwise move between the two calls and
// report an empty reason.
func dlopen(path string, mode int) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(path, mode)
}
