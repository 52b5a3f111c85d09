package driver

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/goccl/goccl/internal/dynlib"
)

// envLibcuda names the environment variable holding an explicit libcuda path.
const envLibcuda = "GOCCL_LIBCUDA"

// Feature is a group of optional driver entry points; see Has.
type Feature int

// Features that an older driver may lack. A missing one makes the methods that need it return
// an error wrapping ErrNotSupported; the rest of the package works.
const (
	FeatureLaunchEx  Feature = iota // cuLaunchKernelEx: LaunchEx and PDL (CUDA 11.8)
	FeatureVMM                      // cuMemCreate and friends: PhysicalAlloc, Map (CUDA 10.2)
	FeatureGraphs                   // stream capture and graph launch (CUDA 11.4)
	FeatureParamInfo                // cuFuncGetParamInfo: launch arguments checked against the kernel (CUDA 12.4)
	// cuPointerGetAttributes: Context.PointerInfo in one call (CUDA 7.0); without it,
	// PointerInfo makes one cuPointerGetAttribute call per attribute.
	FeaturePointerAttributes
)

// String returns the feature's name.
func (f Feature) String() string {
	switch f {
	case FeatureLaunchEx:
		return "LaunchEx (PDL)"
	case FeatureVMM:
		return "virtual memory management"
	case FeatureGraphs:
		return "graphs"
	case FeatureParamInfo:
		return "kernel parameter info"
	case FeaturePointerAttributes:
		return "pointer attributes in one call"
	}
	return "Feature(" + strconv.Itoa(int(f)) + ")"
}

// SymbolInfo describes one entry of the symbol table, for diagnostics and tests.
type SymbolInfo struct {
	Name     string // exact exported C name, e.g. "cuMemAlloc_v2"
	Optional bool   // a missing optional symbol disables a Feature instead of failing Init
	Resolved bool   // present in the loaded libcuda
}

// state is the process-wide driver state, guarded by mu. Only conclusive answers are kept:
// the library load (found or not, symbols complete or not) and cuInit's result, except
// CUDA_ERROR_SYSTEM_NOT_READY, which a later Init retries.
var state struct {
	mu       sync.Mutex
	loaded   bool // load ran; loadErr is its answer
	loadErr  error
	path     string
	initDone bool // cuInit gave a final answer; initErr is it
	initErr  error
	ready    atomic.Bool // Init succeeded: the fast path of Init
}

// Init loads libcuda, binds the symbol table and calls cuInit(0). Every function of this
// package that needs the driver calls it, so calling it first is only needed to learn early
// whether a GPU is usable. It is safe from many goroutines and cheap after the first success.
//
// Errors: ErrNoDriver (libcuda not found, naming every path tried, or the toolkit's stub),
// ErrNoDevice (the driver sees no GPU), or an error naming the required symbols that an old
// libcuda lacks.
func Init() error {
	if state.ready.Load() {
		return nil
	}
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.initDone {
		return state.initErr
	}
	if err := loadLocked(); err != nil {
		return err
	}
	r := raw(cuInit, 0)
	if r == 0 {
		state.initDone = true
		state.ready.Store(true)
		return nil
	}
	err := initError(newError(cuInit, r))
	if r != 802 {
		state.initDone, state.initErr = true, err
	}
	return err
}

// initError adds what to do about the common cuInit failures.
func initError(e *Error) error {
	hint := ""
	switch e.Code {
	case 100:
		hint = "no CUDA-capable device is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES"
	case 34:
		hint = "this libcuda is the CUDA toolkit's stub, not the driver: install the NVIDIA driver or point " +
			envLibcuda + " at its libcuda.so.1"
	case 802:
		hint = "the system is not ready yet (on NVSwitch machines, check that nvidia-fabricmanager runs)"
	case 803:
		hint = "the loaded kernel module and libcuda come from different driver versions: reload the driver or reboot"
	}
	if hint == "" {
		return fmt.Errorf("init CUDA driver %s: %w", state.path, e)
	}
	return fmt.Errorf("init CUDA driver %s: %w; %s", state.path, e, hint)
}

// DriverVersion returns the CUDA version of the driver (cuDriverGetVersion), e.g. 12020 for
// CUDA 12.2. It needs the library only, not a GPU.
func DriverVersion() (int, error) {
	state.mu.Lock()
	defer state.mu.Unlock()
	if err := loadLocked(); err != nil {
		return 0, err
	}
	return driverVersionLocked()
}

func driverVersionLocked() (int, error) {
	var v int32
	if err := call(cuDriverGetVersion, uintptr(unsafe.Pointer(&v))); err != nil {
		return 0, err
	}
	return int(v), nil
}

// LibraryPath returns the file of the loaded libcuda, or "" when none is loaded.
func LibraryPath() string {
	state.mu.Lock()
	defer state.mu.Unlock()
	return state.path
}

// Has reports whether the loaded libcuda has every entry point of f. It loads the library if
// needed (no GPU needed) and returns false when none can be loaded.
func Has(f Feature) bool {
	state.mu.Lock()
	defer state.mu.Unlock()
	if loadLocked() != nil {
		return false
	}
	return len(missingLocked(f)) == 0
}

// Symbols lists the symbol table and what the loaded libcuda provides. When no library can be
// loaded, every entry is unresolved.
func Symbols() []SymbolInfo {
	state.mu.Lock()
	defer state.mu.Unlock()
	_ = loadLocked() // an unloadable library shows as nothing resolved
	out := make([]SymbolInfo, len(symbolTable))
	for i, s := range symbolTable {
		out[i] = SymbolInfo{Name: s.name, Optional: s.optional, Resolved: *s.fn != 0}
	}
	return out
}

// need returns nil when f is available, else an error wrapping ErrNotSupported that names the
// missing symbols and the driver version they need.
func need(f Feature) error {
	state.mu.Lock()
	defer state.mu.Unlock()
	if err := loadLocked(); err != nil {
		return err
	}
	missing := missingLocked(f)
	if len(missing) == 0 {
		return nil
	}
	since := 0
	for _, s := range symbolTable {
		if s.optional && s.feature == f {
			since = max(since, s.since)
		}
	}
	have := "unknown"
	if v, err := driverVersionLocked(); err == nil {
		have = versionString(v)
	}
	return fmt.Errorf("%v needs %s, missing from %s (CUDA %s; needs a CUDA %s driver): %w",
		f, strings.Join(missing, ", "), state.path, have, versionString(since), ErrNotSupported)
}

func missingLocked(f Feature) []string {
	var missing []string
	for _, s := range symbolTable {
		if s.optional && s.feature == f && *s.fn == 0 {
			missing = append(missing, s.name)
		}
	}
	return missing
}

// versionString turns a cuDriverGetVersion number (12020) into "12.2".
func versionString(v int) string {
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// loadLocked loads the library and binds the table once; state.mu must be held.
func loadLocked() error {
	if state.loaded {
		return state.loadErr
	}
	state.loaded = true
	h, path, err := openLibrary(os.Getenv(envLibcuda))
	if err != nil {
		state.loadErr = err
		return err
	}
	if missing := bind(h, symbolTable); len(missing) > 0 {
		have := "unknown"
		if v, err := driverVersionLocked(); err == nil {
			have = versionString(v)
		}
		bind(0, symbolTable) // leave nothing half bound
		state.loadErr = fmt.Errorf("libcuda %s (CUDA %s) lacks %s: goccl needs a driver of CUDA 11.8 or newer",
			path, have, strings.Join(missing, ", "))
		return state.loadErr
	}
	state.path = path
	if real, ok := dynlib.MappedFile(cuInit); ok {
		state.path = real
	}
	return nil
}

// openLibrary opens libcuda. An explicit path (GOCCL_LIBCUDA) is the only one tried: when a
// user names a library, silently running on another one would hide their mistake (and would
// make CI's stub-library test pass against the wrong file).
func openLibrary(explicit string) (uintptr, string, error) {
	if explicit != "" {
		h, path, err := openFirst([]string{explicit})
		if err != nil {
			return 0, "", fmt.Errorf("load libcuda from %s (other locations are not searched while it is set): %w",
				envLibcuda, err)
		}
		return h, path, nil
	}
	h, path, err := openFirst(defaultCandidates())
	if err != nil {
		return 0, "", fmt.Errorf("load libcuda (install the NVIDIA driver, or set %s to the path of its libcuda.so.1): %w",
			envLibcuda, err)
	}
	return h, path, nil
}

// defaultCandidates is the search order without GOCCL_LIBCUDA: the dynamic loader first (it
// knows ld.so.cache and LD_LIBRARY_PATH), then the folders where drivers install libcuda
// without registering it. The toolkit's stubs folder is left out on purpose: its libcuda is a
// stub that fails cuInit.
func defaultCandidates() []string {
	dirs := []string{"/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib"}
	switch runtime.GOARCH {
	case "amd64":
		dirs = append([]string{"/usr/lib/x86_64-linux-gnu"}, dirs...)
	case "arm64":
		dirs = append([]string{"/usr/lib/aarch64-linux-gnu"}, dirs...)
	}
	paths := []string{"libcuda.so.1"}
	for _, d := range dirs {
		paths = append(paths, filepath.Join(d, "libcuda.so.1"))
	}
	return paths
}

// openFirst dlopens the first path that loads (dynlib.Open). The error wraps ErrNoDriver
// and says, for each path, why it failed.
func openFirst(paths []string) (uintptr, string, error) {
	h, path, err := dynlib.Open(paths)
	if err != nil {
		return 0, "", fmt.Errorf("%w; %w", ErrNoDriver, err)
	}
	return h, path, nil
}

// bind stores the address of every symbol of table found in the library h (0 for the missing
// ones, and for all when h is 0) and returns the names of the missing required ones.
func bind(h uintptr, table []symbol) []string {
	var missing []string
	for _, s := range table {
		*s.fn = 0
		if h == 0 {
			continue
		}
		if addr, err := purego.Dlsym(h, s.name); err == nil {
			*s.fn = addr
		} else if !s.optional {
			missing = append(missing, s.name)
		}
	}
	return missing
}
