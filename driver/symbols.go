package driver

// The symbol table: every libcuda function this package calls, by its exact exported name.
// Versioned names (_v2) are bound explicitly: the unversioned export keeps the old ABI for old
// binaries (e.g. cuMemAlloc with 32-bit sizes), and cuda.h only maps the name to _v2 at
// compile time, which a dlsym caller never sees.
//
// Each variable holds the address that bind filled in, 0 until then or when the symbol is
// missing. A missing required symbol fails Init; a missing optional one turns its Feature off.

// Entry points, named exactly as exported; see the table below for their prototypes.
var (
	cuInit, cuDriverGetVersion, cuGetErrorName, cuGetErrorString uintptr

	cuDeviceGet, cuDeviceGetCount, cuDeviceGetName, cuDeviceGetAttribute, cuDeviceGetPCIBusId uintptr
	cuDeviceGetUuid_v2, cuDeviceTotalMem_v2, cuDeviceCanAccessPeer                            uintptr
	cuDeviceGetP2PAttribute                                                                   uintptr

	cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease_v2, cuCtxSetCurrent, cuCtxSynchronize uintptr
	cuCtxGetCurrent, cuCtxGetDevice                                                           uintptr
	cuCtxEnablePeerAccess, cuMemGetInfo_v2                                                    uintptr

	cuMemAlloc_v2, cuMemFree_v2, cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer_v2 uintptr
	cuPointerGetAttribute                                                                    uintptr
	cuMemcpyHtoD_v2, cuMemcpyDtoH_v2, cuMemcpyDtoD_v2                                        uintptr
	cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2, cuMemcpyDtoDAsync_v2                         uintptr
	cuMemsetD8_v2, cuMemsetD32_v2, cuMemsetD8Async, cuMemsetD32Async                         uintptr

	cuStreamCreate, cuStreamDestroy_v2, cuStreamSynchronize, cuStreamQuery, cuStreamWaitEvent uintptr
	cuStreamGetCtx                                                                            uintptr
	cuEventCreate, cuEventRecord, cuEventSynchronize, cuEventQuery, cuEventElapsedTime        uintptr
	cuEventDestroy_v2                                                                         uintptr

	cuModuleLoadDataEx, cuModuleGetFunction, cuModuleUnload, cuFuncGetAttribute uintptr
	cuOccupancyMaxActiveBlocksPerMultiprocessor, cuLaunchKernel                 uintptr

	cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle uintptr

	// Optional.
	cuLaunchKernelEx, cuFuncGetParamInfo, cuPointerGetAttributes                   uintptr
	cuMemGetAllocationGranularity, cuMemCreate, cuMemRelease                       uintptr
	cuMemExportToShareableHandle, cuMemImportFromShareableHandle                   uintptr
	cuMemAddressReserve, cuMemAddressFree, cuMemMap, cuMemUnmap, cuMemSetAccess    uintptr
	cuStreamBeginCapture_v2, cuStreamEndCapture, cuStreamIsCapturing               uintptr
	cuStreamGetCaptureInfo_v2                                                      uintptr
	cuThreadExchangeStreamCaptureMode                                              uintptr
	cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphExecDestroy, cuGraphDestroy uintptr
)

// symbol is one entry of the table.
type symbol struct {
	name     string   // exact exported name
	fn       *uintptr // where bind stores its address
	optional bool     // missing: disable feature instead of failing Init
	feature  Feature  // optional symbols: the feature they belong to
	since    int      // optional symbols: first driver version (cuDriverGetVersion) exporting it
}

func req(name string, fn *uintptr) symbol { return symbol{name: name, fn: fn} }

func opt(name string, fn *uintptr, f Feature, since int) symbol {
	return symbol{name: name, fn: fn, optional: true, feature: f, since: since}
}

var symbolTable = []symbol{
	// CUresult cuInit(unsigned int Flags);
	req("cuInit", &cuInit),
	// CUresult cuDriverGetVersion(int *driverVersion);
	req("cuDriverGetVersion", &cuDriverGetVersion),
	// CUresult cuGetErrorName(CUresult error, const char **pStr);
	req("cuGetErrorName", &cuGetErrorName),
	// CUresult cuGetErrorString(CUresult error, const char **pStr);
	req("cuGetErrorString", &cuGetErrorString),

	// CUresult cuDeviceGet(CUdevice *device, int ordinal);
	req("cuDeviceGet", &cuDeviceGet),
	// CUresult cuDeviceGetCount(int *count);
	req("cuDeviceGetCount", &cuDeviceGetCount),
	// CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
	req("cuDeviceGetName", &cuDeviceGetName),
	// CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
	req("cuDeviceGetAttribute", &cuDeviceGetAttribute),
	// CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);
	req("cuDeviceGetPCIBusId", &cuDeviceGetPCIBusId),
	// CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
	req("cuDeviceGetUuid_v2", &cuDeviceGetUuid_v2),
	// CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
	req("cuDeviceTotalMem_v2", &cuDeviceTotalMem_v2),
	// CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev);
	req("cuDeviceCanAccessPeer", &cuDeviceCanAccessPeer),
	// CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice srcDevice, CUdevice dstDevice);
	req("cuDeviceGetP2PAttribute", &cuDeviceGetP2PAttribute),

	// CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
	req("cuDevicePrimaryCtxRetain", &cuDevicePrimaryCtxRetain),
	// CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
	req("cuDevicePrimaryCtxRelease_v2", &cuDevicePrimaryCtxRelease_v2),
	// CUresult cuCtxSetCurrent(CUcontext ctx);
	req("cuCtxSetCurrent", &cuCtxSetCurrent),
	// CUresult cuCtxGetCurrent(CUcontext *pctx);
	req("cuCtxGetCurrent", &cuCtxGetCurrent),
	// CUresult cuCtxGetDevice(CUdevice *device);
	req("cuCtxGetDevice", &cuCtxGetDevice),
	// CUresult cuCtxSynchronize(void);
	req("cuCtxSynchronize", &cuCtxSynchronize),
	// CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags);
	req("cuCtxEnablePeerAccess", &cuCtxEnablePeerAccess),
	// CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
	req("cuMemGetInfo_v2", &cuMemGetInfo_v2),

	// CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
	req("cuMemAlloc_v2", &cuMemAlloc_v2),
	// CUresult cuMemFree_v2(CUdeviceptr dptr);
	req("cuMemFree_v2", &cuMemFree_v2),
	// CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
	req("cuMemHostAlloc", &cuMemHostAlloc),
	// CUresult cuMemFreeHost(void *p);
	req("cuMemFreeHost", &cuMemFreeHost),
	// CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags);
	req("cuMemHostGetDevicePointer_v2", &cuMemHostGetDevicePointer_v2),
	// CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr);
	req("cuPointerGetAttribute", &cuPointerGetAttribute),
	// CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
	req("cuMemcpyHtoD_v2", &cuMemcpyHtoD_v2),
	// CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
	req("cuMemcpyDtoH_v2", &cuMemcpyDtoH_v2),
	// CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
	req("cuMemcpyDtoD_v2", &cuMemcpyDtoD_v2),
	// CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
	req("cuMemcpyHtoDAsync_v2", &cuMemcpyHtoDAsync_v2),
	// CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
	req("cuMemcpyDtoHAsync_v2", &cuMemcpyDtoHAsync_v2),
	// CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
	req("cuMemcpyDtoDAsync_v2", &cuMemcpyDtoDAsync_v2),
	// CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
	req("cuMemsetD8_v2", &cuMemsetD8_v2),
	// CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N);
	req("cuMemsetD32_v2", &cuMemsetD32_v2),
	// CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
	req("cuMemsetD8Async", &cuMemsetD8Async),
	// CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
	req("cuMemsetD32Async", &cuMemsetD32Async),

	// CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
	req("cuStreamCreate", &cuStreamCreate),
	// CUresult cuStreamDestroy_v2(CUstream hStream);
	req("cuStreamDestroy_v2", &cuStreamDestroy_v2),
	// CUresult cuStreamSynchronize(CUstream hStream);
	req("cuStreamSynchronize", &cuStreamSynchronize),
	// CUresult cuStreamQuery(CUstream hStream);
	req("cuStreamQuery", &cuStreamQuery),
	// CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
	req("cuStreamWaitEvent", &cuStreamWaitEvent),
	// CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx);
	req("cuStreamGetCtx", &cuStreamGetCtx),
	// CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
	req("cuEventCreate", &cuEventCreate),
	// CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
	req("cuEventRecord", &cuEventRecord),
	// CUresult cuEventSynchronize(CUevent hEvent);
	req("cuEventSynchronize", &cuEventSynchronize),
	// CUresult cuEventQuery(CUevent hEvent);
	req("cuEventQuery", &cuEventQuery),
	// CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
	req("cuEventElapsedTime", &cuEventElapsedTime),
	// CUresult cuEventDestroy_v2(CUevent hEvent);
	req("cuEventDestroy_v2", &cuEventDestroy_v2),

	// CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
	//                             CUjit_option *options, void **optionValues);
	req("cuModuleLoadDataEx", &cuModuleLoadDataEx),
	// CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
	req("cuModuleGetFunction", &cuModuleGetFunction),
	// CUresult cuModuleUnload(CUmodule hmod);
	req("cuModuleUnload", &cuModuleUnload),
	// CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc);
	req("cuFuncGetAttribute", &cuFuncGetAttribute),
	// CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
	//                                                      int blockSize, size_t dynamicSMemSize);
	req("cuOccupancyMaxActiveBlocksPerMultiprocessor", &cuOccupancyMaxActiveBlocksPerMultiprocessor),
	// CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
	//     unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
	//     unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
	//     void **kernelParams, void **extra);
	req("cuLaunchKernel", &cuLaunchKernel),

	// CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
	req("cuIpcGetMemHandle", &cuIpcGetMemHandle),
	// CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
	// (CUipcMemHandle is a 64-byte struct passed by value: see ipc_amd64.go.)
	req("cuIpcOpenMemHandle_v2", &cuIpcOpenMemHandle_v2),
	// CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
	req("cuIpcCloseMemHandle", &cuIpcCloseMemHandle),

	// CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
	opt("cuLaunchKernelEx", &cuLaunchKernelEx, FeatureLaunchEx, 11080),
	// CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize);
	opt("cuFuncGetParamInfo", &cuFuncGetParamInfo, FeatureParamInfo, 12040),
	// CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
	//                                 void **data, CUdeviceptr ptr);
	opt("cuPointerGetAttributes", &cuPointerGetAttributes, FeaturePointerAttributes, 7000),

	// CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
	//                                        CUmemAllocationGranularity_flags option);
	opt("cuMemGetAllocationGranularity", &cuMemGetAllocationGranularity, FeatureVMM, 10020),
	// CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
	//                      const CUmemAllocationProp *prop, unsigned long long flags);
	opt("cuMemCreate", &cuMemCreate, FeatureVMM, 10020),
	// CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
	opt("cuMemRelease", &cuMemRelease, FeatureVMM, 10020),
	// CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
	//                                       CUmemAllocationHandleType handleType, unsigned long long flags);
	opt("cuMemExportToShareableHandle", &cuMemExportToShareableHandle, FeatureVMM, 10020),
	// CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
	//                                         CUmemAllocationHandleType shHandleType);
	opt("cuMemImportFromShareableHandle", &cuMemImportFromShareableHandle, FeatureVMM, 10020),
	// CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
	//                              unsigned long long flags);
	opt("cuMemAddressReserve", &cuMemAddressReserve, FeatureVMM, 10020),
	// CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
	opt("cuMemAddressFree", &cuMemAddressFree, FeatureVMM, 10020),
	// CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
	//                   unsigned long long flags);
	opt("cuMemMap", &cuMemMap, FeatureVMM, 10020),
	// CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
	opt("cuMemUnmap", &cuMemUnmap, FeatureVMM, 10020),
	// CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
	opt("cuMemSetAccess", &cuMemSetAccess, FeatureVMM, 10020),

	// CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
	opt("cuStreamBeginCapture_v2", &cuStreamBeginCapture_v2, FeatureGraphs, 10010),
	// CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
	opt("cuStreamEndCapture", &cuStreamEndCapture, FeatureGraphs, 10000),
	// CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);
	opt("cuStreamIsCapturing", &cuStreamIsCapturing, FeatureGraphs, 10000),
	// CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
	//     cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out, size_t *numDependencies_out);
	opt("cuStreamGetCaptureInfo_v2", &cuStreamGetCaptureInfo_v2, FeatureGraphs, 11030),
	// CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);
	opt("cuThreadExchangeStreamCaptureMode", &cuThreadExchangeStreamCaptureMode, FeatureGraphs, 10010),
	// CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
	opt("cuGraphInstantiateWithFlags", &cuGraphInstantiateWithFlags, FeatureGraphs, 11040),
	// CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
	opt("cuGraphLaunch", &cuGraphLaunch, FeatureGraphs, 10000),
	// CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
	opt("cuGraphExecDestroy", &cuGraphExecDestroy, FeatureGraphs, 10000),
	// CUresult cuGraphDestroy(CUgraph hGraph);
	opt("cuGraphDestroy", &cuGraphDestroy, FeatureGraphs, 10000),
}

// symbolName returns the C name of the function at address fn, for error messages.
func symbolName(fn uintptr) string {
	for _, s := range symbolTable {
		if *s.fn == fn {
			return s.name
		}
	}
	return "libcuda function"
}
