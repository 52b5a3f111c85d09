package driver

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Result is a CUresult, the status code every driver call returns. Its String and Error give
// the CUDA_ERROR_* name.
type Result int32

// resultNames names the CUresult codes, so that a Result prints well even when no driver is
// loaded. A test compares it with cuGetErrorName of a real libcuda.
var resultNames = map[Result]string{
	0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
	3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED",
	5: "CUDA_ERROR_PROFILER_DISABLED", 6: "CUDA_ERROR_PROFILER_NOT_INITIALIZED",
	7: "CUDA_ERROR_PROFILER_ALREADY_STARTED", 8: "CUDA_ERROR_PROFILER_ALREADY_STOPPED",
	34: "CUDA_ERROR_STUB_LIBRARY", 36: "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED", 200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT", 202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
	205: "CUDA_ERROR_MAP_FAILED", 206: "CUDA_ERROR_UNMAP_FAILED", 207: "CUDA_ERROR_ARRAY_IS_MAPPED",
	208: "CUDA_ERROR_ALREADY_MAPPED", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	210: "CUDA_ERROR_ALREADY_ACQUIRED", 211: "CUDA_ERROR_NOT_MAPPED",
	212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", 213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE", 215: "CUDA_ERROR_UNSUPPORTED_LIMIT",
	216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", 217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	218: "CUDA_ERROR_INVALID_PTX", 219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
	220: "CUDA_ERROR_NVLINK_UNCORRECTABLE", 221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
	224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", 225: "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
	226: "CUDA_ERROR_CONTAINED",
	300: "CUDA_ERROR_INVALID_SOURCE", 301: "CUDA_ERROR_FILE_NOT_FOUND",
	302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", 303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM", 400: "CUDA_ERROR_INVALID_HANDLE",
	401: "CUDA_ERROR_ILLEGAL_STATE", 402: "CUDA_ERROR_LOSSY_QUERY", 500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", 704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", 708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
	709: "CUDA_ERROR_CONTEXT_IS_DESTROYED", 710: "CUDA_ERROR_ASSERT", 711: "CUDA_ERROR_TOO_MANY_PEERS",
	712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", 713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	714: "CUDA_ERROR_HARDWARE_STACK_ERROR", 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716: "CUDA_ERROR_MISALIGNED_ADDRESS", 717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	718: "CUDA_ERROR_INVALID_PC", 719: "CUDA_ERROR_LAUNCH_FAILED",
	720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", 721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED", 802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	805: "CUDA_ERROR_MPS_CONNECTION_FAILED", 806: "CUDA_ERROR_MPS_RPC_FAILURE",
	807: "CUDA_ERROR_MPS_SERVER_NOT_READY", 808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
	809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", 810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
	811: "CUDA_ERROR_CDP_NOT_SUPPORTED", 812: "CUDA_ERROR_CDP_VERSION_MISMATCH",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE", 903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 909: "CUDA_ERROR_TIMEOUT",
	910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 911: "CUDA_ERROR_EXTERNAL_DEVICE",
	912: "CUDA_ERROR_INVALID_CLUSTER_SIZE", 913: "CUDA_ERROR_FUNCTION_NOT_LOADED",
	914: "CUDA_ERROR_INVALID_RESOURCE_TYPE", 915: "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
	916: "CUDA_ERROR_KEY_ROTATION", 917: "CUDA_ERROR_STREAM_DETACHED",
	918: "CUDA_ERROR_GRAPH_RECAPTURE_FAILURE", 999: "CUDA_ERROR_UNKNOWN",
}

// String returns the CUDA_ERROR_* name of r, or CUresult(N) for a code this package does not know.
func (r Result) String() string {
	if name, ok := resultNames[r]; ok {
		return name
	}
	return "CUresult(" + strconv.Itoa(int(r)) + ")"
}

// Error returns the CUDA_ERROR_* name of r.
func (r Result) Error() string { return r.String() }

// Sentinel errors. Compare with errors.Is: an *Error matches the sentinel of its code, and the
// package wraps the others where they apply.
var (
	// ErrNoDriver: libcuda could not be loaded, or it is the toolkit's stub library. The error
	// names every path that was tried and why each failed.
	ErrNoDriver = errors.New("CUDA driver library libcuda.so.1 not found")
	// ErrNoDevice: the driver sees no CUDA device (CUDA_ERROR_NO_DEVICE).
	ErrNoDevice = errors.New("no CUDA device")
	// ErrNotSupported: the driver or device lacks the feature (a missing optional symbol, or
	// CUDA_ERROR_NOT_SUPPORTED).
	ErrNotSupported = errors.New("not supported")
	// ErrInvalidValue: an argument was rejected, by the driver or by this package before the call.
	ErrInvalidValue = errors.New("invalid value")
	// ErrOutOfMemory: CUDA_ERROR_OUT_OF_MEMORY.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrInvalidContext: CUDA_ERROR_INVALID_CONTEXT, or a Context that was closed.
	ErrInvalidContext = errors.New("invalid context")
	// ErrInvalidPTX: the PTX JIT compiler rejected a module (CUDA_ERROR_INVALID_PTX).
	ErrInvalidPTX = errors.New("invalid PTX")
	// ErrUnsupportedPTXVersion: the driver is older than the PTX ISA version of a module.
	ErrUnsupportedPTXVersion = errors.New("unsupported PTX version")
	// ErrPeerAccessUnsupported: two devices have no peer-to-peer path.
	ErrPeerAccessUnsupported = errors.New("peer access unsupported")
	// ErrPeerAccessAlreadyEnabled: CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED.
	ErrPeerAccessAlreadyEnabled = errors.New("peer access already enabled")
	// ErrIllegalAddress: a kernel touched memory it may not (CUDA_ERROR_ILLEGAL_ADDRESS). The
	// context is lost: the error also matches ErrContextLost.
	ErrIllegalAddress = errors.New("illegal address")
	// ErrLaunchFailed: a kernel faulted (CUDA_ERROR_LAUNCH_FAILED). The context is lost: the
	// error also matches ErrContextLost.
	ErrLaunchFailed = errors.New("launch failed")
	// ErrContextLost: the CUDA context is dead. A kernel faulted (illegal address or
	// instruction, misaligned address, device-side assert, hardware stack error, ...), the
	// GPU contained a hardware or NVLink error, or the MPS server dropped the process. The
	// driver keeps the error: every later call on the context, and on every object made in it
	// (streams, events, memory, modules, and the same primary context in PyTorch or NCCL),
	// fails with the same code, and device memory contents are lost. Nothing in the process
	// can repair it: stop issuing work, report the error, and restart the process to use the
	// GPU again. Codes: CUDA_ERROR_ILLEGAL_ADDRESS (700), LAUNCH_TIMEOUT (702), ASSERT (710),
	// HARDWARE_STACK_ERROR (714), ILLEGAL_INSTRUCTION (715), MISALIGNED_ADDRESS (716),
	// INVALID_ADDRESS_SPACE (717), INVALID_PC (718), LAUNCH_FAILED (719),
	// TENSOR_MEMORY_LEAK (721), CONTAINED (226), MPS_CLIENT_TERMINATED (810) and
	// EXTERNAL_DEVICE (911): those that cuda.h describes as requiring the process to be
	// terminated and relaunched. Context.Health reports it without waiting for work.
	ErrContextLost = errors.New("CUDA context lost (restart the process to use the GPU again)")
	// ErrNotDeviceMemory: the driver knows no allocation at an address (Context.PointerInfo):
	// pageable host memory (Go or C heap, stack), a freed allocation, or a made-up address.
	ErrNotDeviceMemory = errors.New("not memory known to CUDA")
	// ErrLaunchOutOfResources: too many registers, threads or shared memory for one launch.
	ErrLaunchOutOfResources = errors.New("launch out of resources")
	// ErrNotReady: CUDA_ERROR_NOT_READY (Query turns it into done == false).
	ErrNotReady = errors.New("not ready")
	// ErrNotFound: a named object, such as a kernel in a module, does not exist.
	ErrNotFound = errors.New("not found")
	// ErrStreamCapture: any stream-capture error (CUDA_ERROR_STREAM_CAPTURE_*, CAPTURED_EVENT).
	ErrStreamCapture = errors.New("stream capture error")
	// ErrTimeout: a wait with a deadline expired (Stream.Wait, Event.Wait), or CUDA_ERROR_TIMEOUT.
	ErrTimeout = errors.New("timeout")
	// ErrMPSLimit: the MPS server has no room for another client process or for its hardware
	// queues (CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED).
	ErrMPSLimit = errors.New("MPS client or connection limit reached")
)

// sentinel returns the sentinel error that code r matches, or nil.
func sentinel(r Result) error {
	switch {
	case r == 34:
		return ErrNoDriver
	case r == 100:
		return ErrNoDevice
	case r == 801:
		return ErrNotSupported
	case r == 1:
		return ErrInvalidValue
	case r == 2:
		return ErrOutOfMemory
	case r == 201:
		return ErrInvalidContext
	case r == 218:
		return ErrInvalidPTX
	case r == 222:
		return ErrUnsupportedPTXVersion
	case r == 217:
		return ErrPeerAccessUnsupported
	case r == 704:
		return ErrPeerAccessAlreadyEnabled
	case r == 700:
		return ErrIllegalAddress
	case r == 719:
		return ErrLaunchFailed
	case r == 701:
		return ErrLaunchOutOfResources
	case r == 600:
		return ErrNotReady
	case r == 500:
		return ErrNotFound
	case r >= 900 && r <= 908:
		return ErrStreamCapture
	case r == 909:
		return ErrTimeout
	case r == 808 || r == 809:
		return ErrMPSLimit
	}
	return nil
}

// contextLost reports whether r leaves its context unusable: the codes that cuda.h documents
// with "To continue using CUDA, the process must be terminated and relaunched" (or, for
// CUDA_ERROR_ASSERT, "the context cannot be used anymore").
func contextLost(r Result) bool {
	switch r {
	case 226, 700, 702, 710, 714, 715, 716, 717, 718, 719, 721, 810, 911:
		return true
	}
	return false
}

// Error is a failed driver call.
type Error struct {
	Op      string // the C function, e.g. "cuMemAlloc_v2"
	Code    Result // the CUresult it returned
	Name    string // cuGetErrorName, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Message string // cuGetErrorString, e.g. "out of memory"
}

// Error formats e as "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", followed
// by what to do for a code that matches ErrContextLost.
func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = e.Code.String()
	}
	s := fmt.Sprintf("%s: %s (%d)", e.Op, name, int32(e.Code))
	if e.Message != "" {
		s += ": " + e.Message
	}
	if contextLost(e.Code) {
		s += lostHint
	}
	return s
}

// lostHint ends the message of every error that matches ErrContextLost.
const lostHint = " (the CUDA context is lost: every later call on it fails; restart the process to use the GPU again)"

// Is reports whether target is the sentinel of e's code (see the Err* variables), or
// ErrContextLost for a code that leaves the context unusable.
func (e *Error) Is(target error) bool {
	if target == ErrContextLost {
		return contextLost(e.Code)
	}
	s := sentinel(e.Code)
	return s != nil && s == target
}

// JITError is a PTX module that the driver could not load. It keeps the JIT compiler's logs.
type JITError struct {
	Kernel  string   // the module name given to LoadModule
	Err     *Error   // the cuModuleLoadDataEx failure
	Log     []string // the error log, one entry per line
	InfoLog []string // the info log (verbose), one entry per line
}

// Error returns the failure and the last line or two of the error log; %+v prints every line.
func (e *JITError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "load module %s: %v", e.Kernel, e.unwrap())
	tail := e.Log
	if len(tail) > 2 {
		tail = tail[len(tail)-2:]
	}
	if len(tail) > 0 {
		b.WriteString(": ")
		b.WriteString(strings.Join(tail, ": "))
	}
	switch omitted := len(e.Log) - len(tail); omitted {
	case 0:
	case 1:
		b.WriteString(" (1 line omitted)")
	default:
		fmt.Fprintf(&b, " (%d lines omitted)", omitted)
	}
	return b.String()
}

// Format prints Error() for %v and %s, and the failure followed by both logs in full for %+v.
func (e *JITError) Format(f fmt.State, verb rune) {
	if verb != 'v' || !f.Flag('+') {
		fmt.Fprint(f, e.Error())
		return
	}
	fmt.Fprintf(f, "load module %s: %v", e.Kernel, e.unwrap())
	for _, log := range []struct {
		title string
		lines []string
	}{{"error log", e.Log}, {"info log", e.InfoLog}} {
		if len(log.lines) == 0 {
			continue
		}
		fmt.Fprintf(f, "\n%s:", log.title)
		for _, l := range log.lines {
			fmt.Fprintf(f, "\n\t%s", l)
		}
	}
}

// Unwrap returns Err, so that errors.Is(err, ErrInvalidPTX) works.
func (e *JITError) Unwrap() error { return e.unwrap() }

// unwrap keeps a nil *Error from becoming a non-nil error interface.
func (e *JITError) unwrap() error {
	if e.Err == nil {
		return nil
	}
	return e.Err
}

// logLines splits a NUL-terminated JIT log buffer into lines, without empty ones.
func logLines(buf []byte) []string {
	if i := strings.IndexByte(string(buf), 0); i >= 0 {
		buf = buf[:i]
	}
	var lines []string
	for _, l := range strings.Split(string(buf), "\n") {
		if l = strings.TrimRight(l, " \r\t"); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}
