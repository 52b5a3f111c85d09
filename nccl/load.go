package nccl

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/goccl/goccl/internal/dynlib"
)

// envLibnccl names the environment variable holding an explicit libnccl path.
const envLibnccl = "GOCCL_LIBNCCL"

// libName is the soname every NCCL 2 release installs.
const libName = "libnccl.so.2"

// SymbolInfo describes one entry of the symbol table, for diagnostics and tests.
type SymbolInfo struct {
	Name     string  // exact exported C name, e.g. "ncclCommInitRankConfig"
	Optional bool    // a missing optional symbol turns off a Feature instead of failing the load
	Since    Version // optional symbols: the first NCCL release that exports it
	Resolved bool    // present in the loaded libnccl
}

// state is the process-wide library, loaded once: the answer (a library or an error) is
// conclusive, since nothing in the process can make a missing library appear.
var state struct {
	mu     sync.Mutex
	loaded bool
	lib    *library
	err    error
}

// load returns the process's libnccl, loading it on the first call.
func load() (*library, error) {
	state.mu.Lock()
	defer state.mu.Unlock()
	if !state.loaded {
		state.lib, state.err = openLibrary(os.Getenv(envLibnccl), os.Getenv)
		state.loaded = true
	}
	return state.lib, state.err
}

// Load loads libnccl and checks its version. Every function of this package that needs NCCL
// calls it, so calling it first is only needed to learn early whether NCCL is usable. It is
// safe from many goroutines; the answer is kept for the life of the process.
//
// Errors: ErrNotFound (no library, naming every path tried), ErrVersion (older than
// MinVersion, or a library lacking required entry points).
func Load() error {
	_, err := load()
	return err
}

// LibraryVersion returns the version of the loaded libnccl (ncclGetVersion).
func LibraryVersion() (Version, error) {
	l, err := load()
	if err != nil {
		return Version{}, err
	}
	return l.version, nil
}

// LibraryPath returns the file of the loaded libnccl, or "" when none is loaded.
func LibraryPath() string {
	l, err := load()
	if err != nil {
		return ""
	}
	return l.path
}

// Has reports whether the loaded libnccl has every entry point of f. It loads the library if
// needed and returns false when none can be loaded.
func Has(f Feature) bool {
	l, err := load()
	return err == nil && l.need(f) == nil
}

// Symbols lists the symbol table and what the loaded libnccl provides. When no library can be
// loaded, every entry is unresolved.
func Symbols() []SymbolInfo {
	l, err := load()
	if err != nil {
		l = &library{}
	}
	table := l.symbols()
	out := make([]SymbolInfo, len(table))
	for i, s := range table {
		out[i] = SymbolInfo{Name: s.name, Optional: s.optional, Since: s.since, Resolved: *s.fn != 0}
	}
	return out
}

// need returns nil when l has every entry point of f, else an error wrapping ErrNotSupported
// that names the missing ones and the release that has them.
func (l *library) need(f Feature) error {
	var missing []string
	var since Version
	for _, s := range l.symbols() {
		if s.optional && s.feature == f && *s.fn == 0 {
			missing = append(missing, s.name)
			if since.Less(s.since) {
				since = s.since
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%v needs %s, missing from %s (NCCL %v; needs NCCL %d.%d or newer): %w",
		f, strings.Join(missing, ", "), l.path, l.version, since.Major, since.Minor, ErrNotSupported)
}

// openLibrary finds, opens, binds and checks libnccl. An explicit path (GOCCL_LIBNCCL) is the
// only one tried: when a user names a library, silently running on another one would hide
// their mistake.
func openLibrary(explicit string, getenv func(string) string) (*library, error) {
	if explicit != "" {
		h, path, err := openFirst([]string{explicit})
		if err != nil {
			return nil, fmt.Errorf("load libnccl from %s (other locations are not searched while it is set): %w",
				envLibnccl, err)
		}
		return bindLibrary(h, path)
	}
	h, path, err := openFirst(candidates(getenv))
	if err != nil {
		return nil, fmt.Errorf("load libnccl (install NCCL 2.18 or newer: the libnccl2 package, or pip's nvidia-nccl-cu12 or -cu13 in the active environment; or set %s to the path of its %s): %w",
			envLibnccl, libName, err)
	}
	return bindLibrary(h, path)
}

// bindLibrary binds the symbol table of the library h and checks its version.
func bindLibrary(h uintptr, path string) (*library, error) {
	l := &library{path: path}
	missing := bind(h, l.symbols())
	if l.getVersion != 0 {
		if real, ok := dynlib.MappedFile(l.getVersion); ok {
			l.path = real
		}
		var code int32
		if r := raw(l.getVersion, uintptr(unsafe.Pointer(&code))); r != 0 {
			return nil, fmt.Errorf("libnccl %s: ncclGetVersion: %w", l.path, r)
		}
		l.version = versionFromCode(int(code))
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("libnccl %s (NCCL %v) lacks %s: goccl needs NCCL %d.%d or newer: %w",
			l.path, l.version, strings.Join(missing, ", "), MinVersion.Major, MinVersion.Minor, ErrVersion)
	}
	if l.version.Less(MinVersion) {
		return nil, fmt.Errorf("libnccl %s is NCCL %v; goccl needs NCCL %d.%d or newer (set %s to a newer libnccl.so.2): %w",
			l.path, l.version, MinVersion.Major, MinVersion.Minor, envLibnccl, ErrVersion)
	}
	return l, nil
}

// candidates is the search order without GOCCL_LIBNCCL:
//
//  1. the dynamic loader (it knows ld.so.cache and LD_LIBRARY_PATH, where a user who set it
//     wants the library from);
//  2. the active Python environment's NCCL wheel (nvidia-nccl-cu12 or -cu13, both installed as
//     <site-packages>/nvidia/nccl/lib/libnccl.so.2) through VIRTUAL_ENV, CONDA_PREFIX
//     (whose lib folder also holds conda's own nccl package) and PYTHONPATH: an activated
//     environment is the user's choice, and PyTorch in it uses that NCCL;
//  3. the system library folders, for a library not in the loader's cache;
//  4. the wheels of the system's and the user's Python installations.
func candidates(getenv func(string) string) []string {
	paths := []string{libName}
	wheel := func(site string) string { return filepath.Join(site, "nvidia", "nccl", "lib", libName) }
	sitePackages := func(prefix string) []string {
		var sites []string
		for _, lib := range []string{"lib", "lib64"} {
			for _, kind := range []string{"site-packages", "dist-packages"} {
				m, _ := filepath.Glob(filepath.Join(prefix, lib, "python3*", kind))
				sites = append(sites, m...)
			}
		}
		return sites
	}
	if venv := getenv("VIRTUAL_ENV"); venv != "" {
		for _, s := range sitePackages(venv) {
			paths = append(paths, wheel(s))
		}
	}
	if conda := getenv("CONDA_PREFIX"); conda != "" {
		paths = append(paths, filepath.Join(conda, "lib", libName))
		for _, s := range sitePackages(conda) {
			paths = append(paths, wheel(s))
		}
	}
	for _, entry := range filepath.SplitList(getenv("PYTHONPATH")) {
		if entry != "" {
			paths = append(paths, wheel(entry))
		}
	}
	for _, d := range systemDirs() {
		paths = append(paths, filepath.Join(d, libName))
	}
	for _, prefix := range []string{"/usr/local", "/usr"} {
		for _, s := range sitePackages(prefix) {
			paths = append(paths, wheel(s))
		}
	}
	if home := getenv("HOME"); home != "" {
		for _, s := range sitePackages(filepath.Join(home, ".local")) {
			paths = append(paths, wheel(s))
		}
	}
	return dedupe(paths)
}

// systemDirs lists the folders where NCCL's packages and the CUDA toolkit install libnccl.
func systemDirs() []string {
	triplet := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu",
		"ppc64le": "powerpc64le-linux-gnu"}[runtime.GOARCH]
	target := map[string]string{"amd64": "x86_64-linux", "arm64": "sbsa-linux"}[runtime.GOARCH]
	var dirs []string
	if triplet != "" {
		dirs = append(dirs, "/usr/lib/"+triplet)
	}
	dirs = append(dirs, "/usr/lib64", "/usr/lib", "/usr/local/lib", "/usr/local/cuda/lib64")
	if target != "" {
		dirs = append(dirs, "/usr/local/cuda/targets/"+target+"/lib")
	}
	return dirs
}

func dedupe(paths []string) []string {
	seen := make(map[string]bool, len(paths))
	out := paths[:0]
	for _, p := range paths {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// openFirst dlopens the first path that loads (dynlib.Open). The error wraps ErrNotFound
// and says, for each path, why it failed.
func openFirst(paths []string) (uintptr, string, error) {
	h, path, err := dynlib.Open(paths)
	if err != nil {
		return 0, "", fmt.Errorf("%w; %w", ErrNotFound, err)
	}
	return h, path, nil
}

// bind stores the address of every symbol of table found in the library h (0 for the missing
// ones) and returns the names of the missing required ones.
func bind(h uintptr, table []symbol) []string {
	var missing []string
	for _, s := range table {
		*s.fn = 0
		if addr, err := purego.Dlsym(h, s.name); err == nil {
			*s.fn = addr
		} else if !s.optional {
			missing = append(missing, s.name)
		}
	}
	return missing
}
