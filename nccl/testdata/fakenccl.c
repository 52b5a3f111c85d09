// A fake libnccl for nccl's ABI tests: the entry points take the C prototypes of nccl.h and
// record what they receive, so that a test can check what the Go side passed (the 128-byte
// ncclUniqueId by value, the ncclConfig_t layout, counts, types, operations, streams,
// communicators), and return the results a test chooses. Built by the tests with cc; not part
// of goccl.
//
// Build options:
//   -DFAKE_VERSION=21700   the version ncclGetVersion reports (default 2.27.3)
//   -DFAKE_NO_OPTIONAL     leave out the optional entry points (registration, windows, finalize)
#define _GNU_SOURCE
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef FAKE_VERSION
#define FAKE_VERSION 22703
#endif

typedef int ncclResult_t;
typedef struct fakeComm *ncclComm_t;
typedef void *cudaStream_t;
typedef struct { char internal[128]; } ncclUniqueId;

// ncclConfig_t as nccl.h 2.18 declares it.
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
} ncclConfig_t;

_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId size");
_Static_assert(sizeof(ncclConfig_t) == 48, "ncclConfig_t size");

// Record slots, read with fake_get. Keep in step with the constants of abi_test.go.
enum {
    R_ID = 0,          // 0..15: the unique id received, as 16 little-endian words
    R_NRANKS = 16,     // nranks of the last init
    R_RANK,            // rank of the last init
    R_INIT_CALLS,      // calls of ncclCommInitRank + ncclCommInitRankConfig
    R_CFG_SIZE,        // config fields of the last ncclCommInitRankConfig
    R_CFG_MAGIC,
    R_CFG_VERSION,
    R_CFG_BLOCKING,
    R_CFG_CGA,
    R_CFG_MINCTAS,
    R_CFG_MAXCTAS,
    R_CFG_NETNAME,
    R_CFG_SPLITSHARE,
    R_CFG_TAIL,        // the 4 bytes after splitShare (trafficClass from 2.19 on)
    R_CFG_NULL,        // 1 when config was NULL
    R_INIT_TID,        // thread id of the last init call
    R_AR_SEND = 32,    // ncclAllReduce arguments
    R_AR_RECV,
    R_AR_COUNT,
    R_AR_TYPE,
    R_AR_OP,
    R_AR_COMM,
    R_AR_STREAM,
    R_AR_CALLS,
    R_GROUP_START,     // calls of ncclGroupStart
    R_GROUP_END,       // calls of ncclGroupEnd
    R_ABORT_COMM,      // comm of the last ncclCommAbort
    R_ABORT_CALLS,
    R_DESTROY_COMM,    // comm of the last ncclCommDestroy
    R_DESTROY_CALLS,
    R_FINALIZE_COMM,   // comm of the last ncclCommFinalize
    R_ASYNC_COMM,      // comm of the last ncclCommGetAsyncError
    R_ASYNC_CALLS,
    R_QUERY_COMM,      // comm of the last ncclCommCount/CuDevice/UserRank
    R_REG_COMM,        // ncclCommRegister / ncclCommWindowRegister arguments
    R_REG_BUFF,
    R_REG_SIZE,
    R_REG_FLAGS,
    R_DEREG_COMM,      // ncclCommDeregister / ncclCommWindowDeregister arguments
    R_DEREG_HANDLE,
    R_LASTERR_COMM,    // comm passed to the last ncclGetLastError
    R_ERRSTR_CODE,     // code passed to the last ncclGetErrorString
    R_UID_CALLS,       // calls of ncclGetUniqueId
    R_SLOTS = 64
};

// Controls, set with fake_set. Keep in step with abi_test.go.
enum {
    C_INIT_RESULT = 0,  // result of the init calls (7: ncclInProgress for a non-blocking init)
    C_AR_RESULT,        // result of ncclAllReduce
    C_GROUP_END_RESULT, // result of ncclGroupEnd
    C_ASYNC_PENDING,    // ncclCommGetAsyncError reports ncclInProgress this many more times...
    C_ASYNC_FINAL,      // ...then this state
    C_ABORT_RESULT,     // result of ncclCommAbort
    C_DESTROY_RESULT,   // result of ncclCommDestroy
    C_FINALIZE_RESULT,  // result of ncclCommFinalize
    C_COUNT,            // what ncclCommCount, ncclCommCuDevice, ncclCommUserRank report
    C_DEVICE,
    C_USER_RANK,
    C_REG_RESULT,       // result of the registration calls
    C_VERSION,          // overrides FAKE_VERSION when not 0
    C_SLOTS = 32
};

static uint64_t rec[R_SLOTS];
static int64_t ctl[C_SLOTS];

uint64_t fake_get(int i) { return i >= 0 && i < R_SLOTS ? rec[i] : 0; }

// The last slot of each enum, for the tests to check their copies of the numbering.
int fake_layout(int which) {
    switch (which) {
    case 0: return R_INIT_TID;
    case 1: return R_UID_CALLS;
    case 2: return C_VERSION;
    }
    return -1;
}

void fake_set(int i, int64_t v) {
    if (i >= 0 && i < C_SLOTS) {
        ctl[i] = v;
    }
}

ncclResult_t ncclGetVersion(int *version) {
    *version = ctl[C_VERSION] ? (int)ctl[C_VERSION] : FAKE_VERSION;
    return 0;
}

static char lastError[256];

// The strings are NCCL's, with the code appended so that a test sees which one came back.
const char *ncclGetErrorString(ncclResult_t r) {
    static char buf[128];
    rec[R_ERRSTR_CODE] = (uint64_t)r;
    snprintf(buf, sizeof buf, "fake error string for code %d", r);
    return buf;
}

const char *ncclGetLastError(ncclComm_t comm) {
    rec[R_LASTERR_COMM] = (uint64_t)(uintptr_t)comm;
    return lastError;
}

static ncclResult_t fail(ncclResult_t r, const char *what) {
    if (r != 0 && r != 7) {
        snprintf(lastError, sizeof lastError, "fake last error: %s failed", what);
    }
    return r;
}

// Fills the id with 0, 1, 2, ... 127.
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    rec[R_UID_CALLS]++;
    for (int i = 0; i < 128; i++) {
        id->internal[i] = (char)i;
    }
    return 0;
}

// The communicator handed out: 0xC0AA0000 plus the rank.
static void init_common(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    memcpy(&rec[R_ID], id.internal, 128);
    rec[R_NRANKS] = (uint64_t)(int64_t)nranks;
    rec[R_RANK] = (uint64_t)(int64_t)rank;
    rec[R_INIT_CALLS]++;
    rec[R_INIT_TID] = (uint64_t)syscall(SYS_gettid);
    *comm = (ncclComm_t)(uintptr_t)(0xC0AA0000u + (unsigned)rank);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    init_common(comm, nranks, id, rank);
    rec[R_CFG_NULL] = 1;
    return fail((ncclResult_t)ctl[C_INIT_RESULT], "ncclCommInitRank");
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    init_common(comm, nranks, id, rank);
    rec[R_CFG_NULL] = config == NULL;
    if (config != NULL) {
        rec[R_CFG_SIZE] = config->size;
        rec[R_CFG_MAGIC] = config->magic;
        rec[R_CFG_VERSION] = config->version;
        rec[R_CFG_BLOCKING] = (uint32_t)config->blocking;
        rec[R_CFG_CGA] = (uint32_t)config->cgaClusterSize;
        rec[R_CFG_MINCTAS] = (uint32_t)config->minCTAs;
        rec[R_CFG_MAXCTAS] = (uint32_t)config->maxCTAs;
        rec[R_CFG_NETNAME] = (uint64_t)(uintptr_t)config->netName;
        rec[R_CFG_SPLITSHARE] = (uint32_t)config->splitShare;
        int32_t tail;
        memcpy(&tail, (char *)config + offsetof(ncclConfig_t, splitShare) + sizeof(int), sizeof tail);
        rec[R_CFG_TAIL] = (uint32_t)tail;
    }
    return fail((ncclResult_t)ctl[C_INIT_RESULT], "ncclCommInitRankConfig");
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op,
                           ncclComm_t comm, cudaStream_t stream) {
    rec[R_AR_SEND] = (uint64_t)(uintptr_t)sendbuff;
    rec[R_AR_RECV] = (uint64_t)(uintptr_t)recvbuff;
    rec[R_AR_COUNT] = count;
    rec[R_AR_TYPE] = (uint32_t)datatype;
    rec[R_AR_OP] = (uint32_t)op;
    rec[R_AR_COMM] = (uint64_t)(uintptr_t)comm;
    rec[R_AR_STREAM] = (uint64_t)(uintptr_t)stream;
    rec[R_AR_CALLS]++;
    return fail((ncclResult_t)ctl[C_AR_RESULT], "ncclAllReduce");
}

ncclResult_t ncclGroupStart(void) {
    rec[R_GROUP_START]++;
    return 0;
}

ncclResult_t ncclGroupEnd(void) {
    rec[R_GROUP_END]++;
    return fail((ncclResult_t)ctl[C_GROUP_END_RESULT], "ncclGroupEnd");
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    rec[R_ASYNC_COMM] = (uint64_t)(uintptr_t)comm;
    rec[R_ASYNC_CALLS]++;
    if (ctl[C_ASYNC_PENDING] != 0) {
        if (ctl[C_ASYNC_PENDING] > 0) { // negative: in progress for ever
            ctl[C_ASYNC_PENDING]--;
        }
        *asyncError = 7;
        return 0;
    }
    *asyncError = fail((ncclResult_t)ctl[C_ASYNC_FINAL], "the communicator's background work");
    return 0;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    rec[R_ABORT_COMM] = (uint64_t)(uintptr_t)comm;
    rec[R_ABORT_CALLS]++;
    return fail((ncclResult_t)ctl[C_ABORT_RESULT], "ncclCommAbort");
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    rec[R_DESTROY_COMM] = (uint64_t)(uintptr_t)comm;
    rec[R_DESTROY_CALLS]++;
    return fail((ncclResult_t)ctl[C_DESTROY_RESULT], "ncclCommDestroy");
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    rec[R_QUERY_COMM] = (uint64_t)(uintptr_t)comm;
    *count = (int)ctl[C_COUNT];
    return 0;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    rec[R_QUERY_COMM] = (uint64_t)(uintptr_t)comm;
    *device = (int)ctl[C_DEVICE];
    return 0;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    rec[R_QUERY_COMM] = (uint64_t)(uintptr_t)comm;
    *rank = (int)ctl[C_USER_RANK];
    return 0;
}

#ifndef FAKE_NO_OPTIONAL
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    rec[R_FINALIZE_COMM] = (uint64_t)(uintptr_t)comm;
    return fail((ncclResult_t)ctl[C_FINALIZE_RESULT], "ncclCommFinalize");
}

// The handle handed out: the buffer address with the top bit set.
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
    rec[R_REG_COMM] = (uint64_t)(uintptr_t)comm;
    rec[R_REG_BUFF] = (uint64_t)(uintptr_t)buff;
    rec[R_REG_SIZE] = size;
    rec[R_REG_FLAGS] = 0;
    *handle = (void *)((uintptr_t)buff | ((uintptr_t)1 << 63));
    return fail((ncclResult_t)ctl[C_REG_RESULT], "ncclCommRegister");
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
    rec[R_DEREG_COMM] = (uint64_t)(uintptr_t)comm;
    rec[R_DEREG_HANDLE] = (uint64_t)(uintptr_t)handle;
    return 0;
}

typedef struct fakeWindow *ncclWindow_t;

// The window handed out: the buffer address with the top two bits set.
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags) {
    rec[R_REG_COMM] = (uint64_t)(uintptr_t)comm;
    rec[R_REG_BUFF] = (uint64_t)(uintptr_t)buff;
    rec[R_REG_SIZE] = size;
    rec[R_REG_FLAGS] = (uint32_t)winFlags;
    *win = (ncclWindow_t)((uintptr_t)buff | ((uintptr_t)3 << 62));
    return fail((ncclResult_t)ctl[C_REG_RESULT], "ncclCommWindowRegister");
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
    rec[R_DEREG_COMM] = (uint64_t)(uintptr_t)comm;
    rec[R_DEREG_HANDLE] = (uint64_t)(uintptr_t)win;
    return 0;
}
#endif
