package driver

import (
	"errors"
	"fmt"
	"unsafe"
)

// CUjit_option values passed to cuModuleLoadDataEx.
const (
	jitInfoLogBuffer           = 3
	jitInfoLogBufferSizeBytes  = 4
	jitErrorLogBuffer          = 5
	jitErrorLogBufferSizeBytes = 6
	jitLogVerbose              = 12
)

// jitLogBytes is the size of each JIT log buffer; ptxas logs of goccl's kernels are a few
// hundred bytes, and a truncated log still ends in a NUL.
const jitLogBytes = 32 << 10

// jitCall holds everything cuModuleLoadDataEx reads or writes besides the image. It lives on
// the heap (see LoadModule) because optionValues points into it: the driver writes the logs
// into the buffers and the filled sizes back into the values.
type jitCall struct {
	errLog  [jitLogBytes]byte
	infoLog [jitLogBytes]byte
	options [5]uint32
	values  [5]uintptr
}

// Module is PTX loaded into a context (a CUmodule). Close unloads it, which invalidates its
// Functions.
type Module struct {
	ctx     *Context
	handle  uintptr // CUmodule; 0 once closed
	name    string
	infoLog []string
}

// Function is a kernel of a Module (a CUfunction). It needs no closing of its own.
type Function struct {
	mod    *Module
	handle uintptr // CUfunction
	name   string
	// params holds the size of each kernel parameter when the driver can tell
	// (FeatureParamInfo), so that launches check their arguments; nil otherwise.
	params []uint16
}

// FunctionAttribute is a CUfunction_attribute, for Function.Attribute.
type FunctionAttribute int32

// Function attributes (values of CUfunction_attribute).
const (
	FuncMaxThreadsPerBlock FunctionAttribute = 0
	FuncSharedSizeBytes    FunctionAttribute = 1
	FuncConstSizeBytes     FunctionAttribute = 2
	FuncLocalSizeBytes     FunctionAttribute = 3
	FuncNumRegs            FunctionAttribute = 4
	FuncPTXVersion         FunctionAttribute = 5
	FuncBinaryVersion      FunctionAttribute = 6
)

// LoadModule JIT-compiles PTX text and loads it into c (cuModuleLoadDataEx with the error and
// info logs, verbose). name labels the module in errors. A module the JIT rejects returns a
// *JITError carrying both logs; errors.Is(err, ErrInvalidPTX) holds for syntax errors.
func (c *Context) LoadModule(name string, ptx []byte) (*Module, error) {
	image := ptx
	if len(image) == 0 || image[len(image)-1] != 0 {
		// The driver reads PTX as a C string.
		image = make([]byte, len(ptx)+1)
		copy(image, ptx)
	}
	j := &jitCall{
		options: [5]uint32{jitErrorLogBuffer, jitErrorLogBufferSizeBytes, jitInfoLogBuffer,
			jitInfoLogBufferSizeBytes, jitLogVerbose},
	}
	// The log buffers are in j, which the call below keeps alive and in place; the driver
	// takes the sizes as integers stored in the pointer-sized slots.
	j.values = [5]uintptr{uintptr(unsafe.Pointer(&j.errLog[0])), jitLogBytes,
		uintptr(unsafe.Pointer(&j.infoLog[0])), jitLogBytes, 1}
	var h uintptr
	err := c.call(cuModuleLoadDataEx, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&image[0])),
		uintptr(len(j.options)), uintptr(unsafe.Pointer(&j.options[0])), uintptr(unsafe.Pointer(&j.values[0])))
	info := logLines(j.infoLog[:])
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			return nil, fmt.Errorf("load module %s: %w", name, err)
		}
		return nil, &JITError{Kernel: name, Err: e, Log: logLines(j.errLog[:]), InfoLog: info}
	}
	return &Module{ctx: c, handle: h, name: name, infoLog: info}, nil
}

// InfoLog returns the JIT's info log of the module (registers, spills: the log is verbose).
func (m *Module) InfoLog() []string { return m.infoLog }

// Function looks up the kernel called name (its .entry in the PTX).
func (m *Module) Function(name string) (*Function, error) {
	if m == nil || m.handle == 0 {
		return nil, errClosed("module")
	}
	var h uintptr
	cname := cBytes(name)
	if err := m.ctx.call(cuModuleGetFunction, uintptr(unsafe.Pointer(&h)), m.handle, uintptr(unsafe.Pointer(&cname[0]))); err != nil {
		return nil, fmt.Errorf("kernel %s in module %s: %w", name, m.name, err)
	}
	f := &Function{mod: m, handle: h, name: name}
	f.params = paramSizes(m.ctx, h)
	return f, nil
}

// paramSizes returns the size of each parameter of the kernel f, or nil when the driver
// cannot tell (no cuFuncGetParamInfo, or an unexpected error: launches are then unchecked).
// The driver has no parameter count, so this asks for indexes until one is out of range.
func paramSizes(c *Context, f uintptr) []uint16 {
	if cuFuncGetParamInfo == 0 {
		return nil
	}
	sizes := []uint16{}
	for i := 0; i <= MaxArgs; i++ {
		var off, size uint64
		err := c.call(cuFuncGetParamInfo, f, uintptr(i), uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&size)))
		switch {
		case err == nil:
			sizes = append(sizes, uint16(size))
		case isCode(err, 1):
			return sizes
		default:
			return nil
		}
	}
	return sizes // more than MaxArgs: no Args can match, and the launch says so
}

// Close unloads the module (cuModuleUnload). Calling it again does nothing.
func (m *Module) Close() error {
	if m == nil || m.handle == 0 {
		return nil
	}
	h := m.handle
	m.handle = 0
	return m.ctx.call(cuModuleUnload, h)
}

// live returns nil when f can be used: its CUfunction dies with its module's Close, and the
// driver must not be handed a dangling one.
func (f *Function) live() error {
	if f == nil || f.handle == 0 || f.mod == nil || f.mod.handle == 0 {
		return errClosed("kernel (or its module)")
	}
	return nil
}

// Name returns the kernel's name.
func (f *Function) Name() string { return f.name }

// Attribute returns a kernel attribute (cuFuncGetAttribute).
func (f *Function) Attribute(a FunctionAttribute) (int, error) {
	if err := f.live(); err != nil {
		return 0, err
	}
	var v int32
	if err := f.mod.ctx.call(cuFuncGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), f.handle); err != nil {
		return 0, fmt.Errorf("kernel %s attribute %d: %w", f.name, a, err)
	}
	return int(v), nil
}

// MaxActiveBlocksPerSM returns how many blocks of blockSize threads with dynamicSmem bytes of
// dynamic shared memory fit on one SM at once (cuOccupancyMaxActiveBlocksPerMultiprocessor):
// the bound for kernels whose blocks wait for each other.
func (f *Function) MaxActiveBlocksPerSM(blockSize, dynamicSmem int) (int, error) {
	if err := f.live(); err != nil {
		return 0, err
	}
	var n int32
	if err := f.mod.ctx.call(cuOccupancyMaxActiveBlocksPerMultiprocessor, uintptr(unsafe.Pointer(&n)), f.handle,
		uintptr(blockSize), uintptr(dynamicSmem)); err != nil {
		return 0, fmt.Errorf("occupancy of kernel %s: %w", f.name, err)
	}
	return int(n), nil
}
