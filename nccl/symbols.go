package nccl

import "strconv"

// Feature is a group of optional NCCL entry points; see Has.
type Feature int

// Features that an older libnccl may lack. A missing one makes the methods that need it return
// an error wrapping ErrNotSupported; the rest of the package works.
const (
	FeatureFinalize Feature = iota // ncclCommFinalize: Destroy flushes outstanding work first (NCCL 2.14)
	FeatureRegister                // ncclCommRegister, ncclCommDeregister: Comm.Register (NCCL 2.19)
	FeatureWindow                  // ncclCommWindowRegister, ncclCommWindowDeregister: Comm.RegisterWindow (NCCL 2.27)
)

// String returns the feature's name.
func (f Feature) String() string {
	switch f {
	case FeatureFinalize:
		return "communicator finalize"
	case FeatureRegister:
		return "buffer registration"
	case FeatureWindow:
		return "symmetric memory windows"
	}
	return "Feature(" + strconv.Itoa(int(f)) + ")"
}

// library is one loaded libnccl: its file, version and the addresses of its entry points, 0
// for the missing optional ones. It never changes once load returns it.
type library struct {
	path    string
	version Version

	getVersion, getErrorString, getLastError, getUniqueID    uintptr
	commInitRank, commInitRankConfig, commAbort, commDestroy uintptr
	commGetAsyncError, commCount, commCuDevice, commUserRank uintptr
	allReduce, groupStart, groupEnd                          uintptr
	commFinalize, commRegister, commDeregister               uintptr // optional
	commWindowRegister, commWindowDeregister                 uintptr // optional
}

// symbol is one entry of the symbol table.
type symbol struct {
	name     string   // exact exported name
	fn       *uintptr // where bind stores its address
	optional bool     // missing: disable feature instead of failing the load
	feature  Feature  // optional symbols: the feature they belong to
	since    Version  // optional symbols: the first NCCL version exporting it
}

func req(name string, fn *uintptr) symbol { return symbol{name: name, fn: fn} }

func opt(name string, fn *uintptr, f Feature, since Version) symbol {
	return symbol{name: name, fn: fn, optional: true, feature: f, since: since}
}

// symbols is the symbol table of l: every libnccl function this package calls, by its exact
// exported name, with its C prototype from nccl.h.
func (l *library) symbols() []symbol {
	return []symbol{
		// ncclResult_t ncclGetVersion(int *version);
		req("ncclGetVersion", &l.getVersion),
		// const char* ncclGetErrorString(ncclResult_t result);
		req("ncclGetErrorString", &l.getErrorString),
		// const char* ncclGetLastError(ncclComm_t comm);
		req("ncclGetLastError", &l.getLastError),
		// ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
		req("ncclGetUniqueId", &l.getUniqueID),
		// ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
		// (ncclUniqueId is a 128-byte struct passed by value: see initrank_amd64.go.)
		req("ncclCommInitRank", &l.commInitRank),
		// ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
		//                                     int rank, ncclConfig_t* config);
		req("ncclCommInitRankConfig", &l.commInitRankConfig),
		// ncclResult_t ncclCommAbort(ncclComm_t comm);
		req("ncclCommAbort", &l.commAbort),
		// ncclResult_t ncclCommDestroy(ncclComm_t comm);
		req("ncclCommDestroy", &l.commDestroy),
		// ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
		req("ncclCommGetAsyncError", &l.commGetAsyncError),
		// ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
		req("ncclCommCount", &l.commCount),
		// ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
		req("ncclCommCuDevice", &l.commCuDevice),
		// ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
		req("ncclCommUserRank", &l.commUserRank),
		// ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
		//     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
		req("ncclAllReduce", &l.allReduce),
		// ncclResult_t ncclGroupStart();
		req("ncclGroupStart", &l.groupStart),
		// ncclResult_t ncclGroupEnd();
		req("ncclGroupEnd", &l.groupEnd),

		// ncclResult_t ncclCommFinalize(ncclComm_t comm);
		opt("ncclCommFinalize", &l.commFinalize, FeatureFinalize, Version{2, 14, 0}),
		// ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
		opt("ncclCommRegister", &l.commRegister, FeatureRegister, Version{2, 19, 0}),
		// ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
		opt("ncclCommDeregister", &l.commDeregister, FeatureRegister, Version{2, 19, 0}),
		// ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
		//                                     ncclWindow_t* win, int winFlags);
		opt("ncclCommWindowRegister", &l.commWindowRegister, FeatureWindow, Version{2, 27, 0}),
		// ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
		opt("ncclCommWindowDeregister", &l.commWindowDeregister, FeatureWindow, Version{2, 27, 0}),
	}
}
