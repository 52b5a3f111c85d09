package driver

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"
)

// Capacity of Args: goccl's kernels take 9 parameters and under 300 bytes.
const (
	MaxArgs     = 32   // parameters per launch
	MaxArgBytes = 1024 // bytes of parameter values per launch
)

// Args is a reusable, fixed-capacity kernel argument list. The values and the void* array
// that cuLaunchKernel reads both live inside it, so a launch allocates nothing. Fill it in the
// order of the kernel's .param list; Reset and refill it for the next launch.
//
// Adding past the capacity, or a bad alignment, is reported by the next launch rather than by
// the adding method, so that filling an Args stays a list of plain statements. Not safe for
// concurrent use: an Args also holds the CUlaunchConfig of LaunchEx.
type Args struct {
	// buf is the first field of a struct holding pointers, so it is 8-byte aligned.
	buf   [MaxArgBytes]byte
	offs  [MaxArgs]uint16
	sizes [MaxArgs]uint16
	// ptrs is rebuilt from offs at each launch, so that a copied Args points into itself.
	ptrs [MaxArgs]unsafe.Pointer
	n    int   // parameters added
	used int   // bytes of buf used
	err  error // first packing error, reported by the launch

	ex launchEx
}

// Reset empties the list.
func (a *Args) Reset() { a.n, a.used, a.err = 0, 0, nil }

// U32 adds a .u32 / .s32 / .f32 (bits) parameter.
func (a *Args) U32(v uint32) {
	if b := a.next(4, 4); b != nil {
		binary.NativeEndian.PutUint32(b, v)
	}
}

// U64 adds a .u64 / .s64 / .f64 (bits) parameter.
func (a *Args) U64(v uint64) {
	if b := a.next(8, 8); b != nil {
		binary.NativeEndian.PutUint64(b, v)
	}
}

// Ptr adds a device pointer (.u64) parameter.
func (a *Args) Ptr(p DevicePtr) { a.U64(uint64(p)) }

// Bytes adds a by-value byte array parameter, such as `.param .align 8 .b8 p[64]`. align is
// the .align of the declaration (a power of two up to 16).
func (a *Args) Bytes(b []byte, align int) {
	if align < 1 || align > 16 || align&(align-1) != 0 {
		a.fail(fmt.Errorf("kernel argument %d: alignment %d is not a power of two up to 16: %w", a.n, align, ErrInvalidValue))
		return
	}
	if len(b) == 0 {
		a.fail(fmt.Errorf("kernel argument %d: empty byte array: %w", a.n, ErrInvalidValue))
		return
	}
	if dst := a.next(len(b), align); dst != nil {
		copy(dst, b)
	}
}

// next reserves size bytes aligned to align for the next parameter and returns them, or nil
// after recording an error.
func (a *Args) next(size, align int) []byte {
	if a.err != nil {
		return nil
	}
	if a.n == MaxArgs {
		a.fail(fmt.Errorf("kernel arguments: more than %d parameters: %w", MaxArgs, ErrInvalidValue))
		return nil
	}
	off := (a.used + align - 1) &^ (align - 1)
	if off+size > MaxArgBytes {
		a.fail(fmt.Errorf("kernel arguments: more than %d bytes: %w", MaxArgBytes, ErrInvalidValue))
		return nil
	}
	a.offs[a.n], a.sizes[a.n] = uint16(off), uint16(size)
	a.n++
	a.used = off + size
	return a.buf[off : off+size]
}

func (a *Args) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// params points the void* array at the values and returns it (nil for no parameters).
//
// The launch passes this address to the driver as a uintptr, which a moving goroutine stack
// would invalidate; storing pointers to a into a itself makes the compiler keep every Args
// that reaches a launch on the heap, which does not move.
func (a *Args) params() unsafe.Pointer {
	if a == nil || a.n == 0 {
		return nil
	}
	for i := range a.n {
		a.ptrs[i] = unsafe.Pointer(&a.buf[a.offs[i]])
	}
	return unsafe.Pointer(&a.ptrs[0])
}

// LaunchConfig is the launch geometry of a kernel.
type LaunchConfig struct {
	Grid, Block [3]uint32 // blocks per grid and threads per block, x y z
	SharedMem   uint32    // dynamic shared memory per block, bytes
}

// Launch queues f on s with cuLaunchKernel. args may be nil for a kernel without parameters.
// It allocates nothing. When the driver can list the kernel's parameters (FeatureParamInfo),
// a count or size that does not match is an error instead of a kernel reading garbage.
func Launch(s *Stream, f *Function, cfg *LaunchConfig, args *Args) error {
	if err := checkLaunch(s, f, cfg, args); err != nil {
		return err
	}
	err := s.ctx.launch(cuLaunchKernel, f.handle,
		uintptr(cfg.Grid[0]), uintptr(cfg.Grid[1]), uintptr(cfg.Grid[2]),
		uintptr(cfg.Block[0]), uintptr(cfg.Block[1]), uintptr(cfg.Block[2]),
		uintptr(cfg.SharedMem), s.handle, uintptr(args.params()), 0)
	runtime.KeepAlive(args) // the driver read the values and the void* array in it
	return err
}

// LaunchEx queues f on s with cuLaunchKernelEx. With pdl, the launch carries
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the kernel may start while the
// previous kernel of s still runs, and must wait for it with griddepcontrol.wait (sm_90). args
// is required (it holds the launch configuration) even for a kernel without parameters. It
// allocates nothing. Without FeatureLaunchEx it returns an error wrapping ErrNotSupported.
func LaunchEx(s *Stream, f *Function, cfg *LaunchConfig, args *Args, pdl bool) error {
	if cuLaunchKernelEx == 0 {
		return need(FeatureLaunchEx)
	}
	if args == nil {
		return fmt.Errorf("LaunchEx needs an *Args, even an empty one: it holds the launch configuration: %w", ErrInvalidValue)
	}
	if err := checkLaunch(s, f, cfg, args); err != nil {
		return err
	}
	err := s.ctx.launch(cuLaunchKernelEx, uintptr(args.exConfig(s, cfg, pdl)), f.handle, uintptr(args.params()), 0)
	runtime.KeepAlive(args) // the driver read the configuration, attribute and values in it
	return err
}

// exConfig fills the CUlaunchConfig (and PDL attribute) of a launch on s into a and returns
// its address.
func (a *Args) exConfig(s *Stream, cfg *LaunchConfig, pdl bool) unsafe.Pointer {
	x := &a.ex
	x.config = cuLaunchConfig{
		gridDimX: cfg.Grid[0], gridDimY: cfg.Grid[1], gridDimZ: cfg.Grid[2],
		blockDimX: cfg.Block[0], blockDimY: cfg.Block[1], blockDimZ: cfg.Block[2],
		sharedMemBytes: cfg.SharedMem,
		hStream:        s.handle,
	}
	if pdl {
		x.attr = cuLaunchAttribute{id: launchAttributeProgrammaticStreamSerialization}
		x.attr.value[0] = 1 // programmaticStreamSerializationAllowed: an int at offset 0 (little-endian)
		x.config.attrs, x.config.numAttrs = &x.attr, 1
	}
	return unsafe.Pointer(&x.config)
}

// checkLaunch validates a launch before any driver call, allocating only when it fails.
func checkLaunch(s *Stream, f *Function, cfg *LaunchConfig, args *Args) error {
	if err := s.live(); err != nil {
		return err
	}
	if err := f.live(); err != nil {
		return err
	}
	if f.mod.ctx.handle != s.ctx.handle {
		return fmt.Errorf("launch %s: its module is loaded in CUDA context %#x (device %d), the stream belongs to %#x (device %d): load the module in the stream's context (Stream.Context): %w",
			f.name, f.mod.ctx.handle, f.mod.ctx.dev, s.ctx.handle, s.ctx.dev, ErrInvalidValue)
	}
	if cfg == nil {
		return fmt.Errorf("launch %s: nil LaunchConfig: %w", f.name, ErrInvalidValue)
	}
	n := 0
	if args != nil {
		if args.err != nil {
			return fmt.Errorf("launch %s: %w", f.name, args.err)
		}
		n = args.n
	}
	if f.params == nil {
		return nil
	}
	if n != len(f.params) {
		return fmt.Errorf("launch %s: %d arguments given, the kernel takes %d: %w", f.name, n, len(f.params), ErrInvalidValue)
	}
	for i, size := range f.params {
		if args.sizes[i] != size {
			return fmt.Errorf("launch %s: argument %d is %d bytes, the kernel's parameter is %d: %w",
				f.name, i, args.sizes[i], size, ErrInvalidValue)
		}
	}
	return nil
}

// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (CUlaunchAttributeID).
const launchAttributeProgrammaticStreamSerialization = 6

// cuLaunchConfig mirrors CUlaunchConfig (cuda.h, CUDA 11.8 and later):
//
//	typedef struct CUlaunchConfig_st {
//	    unsigned int gridDimX, gridDimY, gridDimZ;
//	    unsigned int blockDimX, blockDimY, blockDimZ;
//	    unsigned int sharedMemBytes;
//	    CUstream hStream;              // offset 32 after 4 bytes of padding
//	    CUlaunchAttribute *attrs;      // offset 40
//	    unsigned int numAttrs;         // offset 48; sizeof = 56
//	} CUlaunchConfig;
type cuLaunchConfig struct {
	gridDimX, gridDimY, gridDimZ    uint32
	blockDimX, blockDimY, blockDimZ uint32
	sharedMemBytes                  uint32
	_                               uint32
	hStream                         uintptr
	attrs                           *cuLaunchAttribute
	numAttrs                        uint32
	_                               uint32
}

// cuLaunchAttribute mirrors CUlaunchAttribute:
//
//	typedef struct CUlaunchAttribute_st {
//	    CUlaunchAttributeID id;                     // 4 bytes
//	    char pad[8 - sizeof(CUlaunchAttributeID)];
//	    CUlaunchAttributeValue value;               // union of 64 bytes, 8-byte aligned
//	} CUlaunchAttribute;                            // sizeof = 72
type cuLaunchAttribute struct {
	id    uint32
	_     uint32
	value [8]uint64
}

// launchEx is the memory LaunchEx hands to the driver, kept in Args so that it neither
// allocates nor moves during the call.
type launchEx struct {
	config cuLaunchConfig
	attr   cuLaunchAttribute
}
