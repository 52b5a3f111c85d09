// A fake libcuda for driver's ABI tests: the entry points take the C prototypes of cuda.h and
// record what they receive, so that a test can check what the Go side passed (struct layouts,
// by-value structs, kernel parameter arrays). Built by the tests with cc; not part of goccl.
#include <stdint.h>
#include <string.h>

typedef struct { char reserved[64]; } CUipcMemHandle;

// As in cuda.h: the union holds pointers among other members, hence 8-byte alignment.
typedef union {
    char pad[64];
    void *ptr;
    int programmaticStreamSerializationAllowed;
} CUlaunchAttributeValue;

typedef struct {
    int id;
    char pad[8 - sizeof(int)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void *hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

_Static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute size");
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig size");

// Recorded values, read back with fake_get. Slots:
//   0 current context
//   1 function, 2..4 grid, 5..7 block, 8 shared memory, 9 stream, 10 extra
//   11 param 0 (u32), 12 param 1 (u64), 13..14 param 2 (16 bytes), 15 param 3 (u64)
//   16 numAttrs, 17 attrs[0].id, 18 attrs[0].value.programmaticStreamSerializationAllowed
//   20..27 IPC handle words, 28 IPC flags
//   30 stream given to cuStreamGetCtx, 31 context current at cuCtxGetDevice
//   32 cuStreamDestroy_v2 calls, 33 the stream it last destroyed
//   34 cuStreamCreate calls, 35 its flags, 36 context current at it
//   37 stream given to cuStreamQuery, 38 context current at it, 39 capture mode at it
//   40 cuThreadExchangeStreamCaptureMode calls
//   41 event and 42 stream given to cuEventRecord, 43 context current at it
//   44 cuPointerGetAttributes calls, 45 numAttributes, 46..51 attributes, 52 pointer,
//   53 context current at it, 54 cuPointerGetAttribute calls, 55 cuCtxSetCurrent calls
//   56 cuDevicePrimaryCtxRelease_v2 calls, 57 its device
//   58 stream given to cuStreamIsCapturing, 59 context current at it
//   60..62 cuDeviceGetP2PAttribute's attribute, source and destination device
//   63 the stream given to cuStreamGetCaptureInfo_v2, 64 the OR of its optional outputs
static uint64_t rec[72];

// The context current on the calling thread, and the thread's stream capture mode
// (CU_STREAM_CAPTURE_MODE_GLOBAL = 0 at first, as in the driver).
static __thread void *current;
static __thread int capture_mode;

// A CUresult that every context-bound call returns, as after a kernel fault; 0 for none.
static int sticky;

// The capture status cuStreamIsCapturing reports (CU_STREAM_CAPTURE_STATUS_ACTIVE = 1).
static int capturing;

uint64_t fake_get(int i) { return rec[i]; }

void fake_reset(void) {
    memset(rec, 0, sizeof rec);
    current = NULL;
    capture_mode = 0;
    sticky = 0;
    capturing = 0;
}

void fake_set_sticky(int code) { sticky = code; }

int fake_capture_mode(void) { return capture_mode; }

int fake_ok(void) { return 0; }

int fake_not_ready(void) { return 600; } // CUDA_ERROR_NOT_READY, for cuStreamQuery

int cuCtxSetCurrent(void *ctx) {
    rec[0] = (uint64_t)(uintptr_t)ctx;
    rec[55]++;
    current = ctx;
    return 0;
}

int cuDevicePrimaryCtxRelease_v2(int dev) {
    rec[56]++;
    rec[57] = (uint64_t)dev;
    return 0;
}

int cuCtxGetCurrent(void **pctx) {
    *pctx = current;
    return 0;
}

// The fake's contexts: 0xc0 on device 0, 0xc1 on device 1, 0xc7 (a foreign one) on device 3.
// cuDeviceGetP2PAttribute answers 1 for native atomics (attribute 3) from device 0 to 1, and 0
// for every other pair and attribute.
int cuDeviceGetP2PAttribute(int *value, int attrib, int src, int dst) {
    rec[60] = (uint64_t)attrib;
    rec[61] = (uint64_t)src;
    rec[62] = (uint64_t)dst;
    *value = attrib == 3 && src == 0 && dst == 1;
    return 0;
}

int cuCtxGetDevice(int *dev) {
    rec[31] = (uint64_t)(uintptr_t)current;
    switch ((uintptr_t)current) {
    case 0:
        return 201; // CUDA_ERROR_INVALID_CONTEXT: none current
    case 0xc1:
        *dev = 1;
        return 0;
    case 0xc7:
        *dev = 3;
        return 0;
    }
    *dev = 0;
    return 0;
}

// Streams 0x5e (the tests' own) and 0xf5 belong to context 0xc7; 0xdead is no stream.
int cuStreamGetCtx(void *stream, void **pctx) {
    rec[30] = (uint64_t)(uintptr_t)stream;
    if (stream == (void *)0xdead) {
        return 400; // CUDA_ERROR_INVALID_HANDLE
    }
    *pctx = (void *)0xc7;
    return 0;
}

int cuStreamCreate(void **ps, unsigned int flags) {
    rec[34]++;
    rec[35] = flags;
    rec[36] = (uint64_t)(uintptr_t)current;
    if (sticky) {
        return sticky;
    }
    *ps = (void *)(uintptr_t)(0x5000 + rec[34]);
    return 0;
}

int cuStreamDestroy_v2(void *s) {
    rec[32]++;
    rec[33] = (uint64_t)(uintptr_t)s;
    return sticky;
}

int cuStreamQuery(void *s) {
    rec[37] = (uint64_t)(uintptr_t)s;
    rec[38] = (uint64_t)(uintptr_t)current;
    rec[39] = (uint64_t)capture_mode;
    return sticky;
}

void fake_set_capturing(int status) { capturing = status; }

// cuStreamGetCaptureInfo_v2 reports the status fake_set_capturing set and, while capturing,
// an id made of the stream's handle (streams forked from one capture share the id in the
// driver; here each stream has its own); it records the stream and the optional outputs.
int cuStreamGetCaptureInfo_v2(void *s, int *status, uint64_t *id, void **graph, void **deps, size_t *ndeps) {
    rec[63] = (uint64_t)(uintptr_t)s;
    rec[64] = (uint64_t)(uintptr_t)graph | (uint64_t)(uintptr_t)deps | (uint64_t)(uintptr_t)ndeps;
    *status = capturing;
    *id = capturing ? 0x1d00 + (uint64_t)(uintptr_t)s : 0;
    return sticky;
}

int cuStreamIsCapturing(void *s, int *status) {
    rec[58] = (uint64_t)(uintptr_t)s;
    rec[59] = (uint64_t)(uintptr_t)current;
    *status = capturing;
    return sticky;
}

int cuThreadExchangeStreamCaptureMode(int *mode) {
    rec[40]++;
    int old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    return 0;
}

int cuEventCreate(void **pe, unsigned int flags) {
    (void)flags;
    if (sticky) {
        return sticky;
    }
    *pe = (void *)0xe1;
    return 0;
}

int cuEventRecord(void *e, void *s) {
    rec[41] = (uint64_t)(uintptr_t)e;
    rec[42] = (uint64_t)(uintptr_t)s;
    rec[43] = (uint64_t)(uintptr_t)current;
    return sticky;
}

// The fake's memory: what cuPointerGetAttribute(s) report for addresses inside each range.
struct fake_alloc {
    uint64_t base, size;
    unsigned int type; // CUmemorytype
    int ordinal;
    uintptr_t ctx;
    int managed;
    int norange; // RANGE_START_ADDR and RANGE_SIZE refused, as a driver may for host memory
};

static const struct fake_alloc fake_allocs[] = {
    {0x10000000, 0x100000, 2, 0, 0xc0, 0}, // device memory of context 0xc0
    {0x20000000, 0x1000, 1, 0, 0xc0, 0},   // pinned host memory
    {0x21000000, 0x1000, 1, 1, 0xc0, 0, 1}, // host memory without a range
    {0x30000000, 0x200000, 2, 0, 0, 0},    // VMM: no context
    {0x40000000, 0x1000, 2, 1, 0xc1, 0},   // device 1
    {0x50000000, 0x1000, 2, 0, 0xc0, 1},   // managed
    {0x60000000, 0x1000, 2, 3, 0xc7, 0},   // the foreign context's
};

static const struct fake_alloc *fake_find(uint64_t p) {
    for (size_t i = 0; i < sizeof fake_allocs / sizeof fake_allocs[0]; i++) {
        if (p >= fake_allocs[i].base && p - fake_allocs[i].base < fake_allocs[i].size) {
            return &fake_allocs[i];
        }
    }
    return NULL;
}

// Writes attribute attr of a into data with the width cuda.h gives it; 801 for others.
static int fake_attr(const struct fake_alloc *a, int attr, void *data) {
    if (a->norange && (attr == 11 || attr == 12)) {
        return 1; // CUDA_ERROR_INVALID_VALUE
    }
    switch (attr) {
    case 1: // CONTEXT
        *(void **)data = (void *)a->ctx;
        return 0;
    case 2: // MEMORY_TYPE
        *(unsigned int *)data = a->type;
        return 0;
    case 8: // IS_MANAGED: a bool
        *(unsigned char *)data = (unsigned char)a->managed;
        return 0;
    case 9: // DEVICE_ORDINAL
        *(int *)data = a->ordinal;
        return 0;
    case 11: // RANGE_START_ADDR
        *(uint64_t *)data = a->base;
        return 0;
    case 12: // RANGE_SIZE
        *(size_t *)data = a->size;
        return 0;
    }
    return 801;
}

// As the driver: an unknown address is success with nothing written (the caller's zeroes
// stay). 0x1 is refused outright, as a driver may.
int cuPointerGetAttributes(unsigned int n, int *attrs, void **data, unsigned long long p) {
    rec[44]++;
    rec[45] = n;
    for (unsigned int i = 0; i < n && i < 6; i++) {
        rec[46 + i] = (uint64_t)attrs[i];
    }
    rec[52] = p;
    rec[53] = (uint64_t)(uintptr_t)current;
    if (sticky) {
        return sticky;
    }
    if (p == 0x1) {
        return 1; // CUDA_ERROR_INVALID_VALUE
    }
    for (unsigned int i = 0; i < n; i++) {
        for (unsigned int j = 0; j < i; j++) {
            if (data[i] == data[j]) {
                return 1; // two attributes written to one place
            }
        }
    }
    const struct fake_alloc *a = fake_find(p);
    if (a == NULL) {
        return 0;
    }
    for (unsigned int i = 0; i < n; i++) {
        int r = fake_attr(a, attrs[i], data[i]);
        if (r != 0) {
            return r;
        }
    }
    return 0;
}

// As the driver: an unknown address is CUDA_ERROR_INVALID_VALUE; VMM memory has no context
// to report.
int cuPointerGetAttribute(void *data, int attr, unsigned long long p) {
    rec[54]++;
    if (sticky) {
        return sticky;
    }
    const struct fake_alloc *a = fake_find(p);
    if (a == NULL) {
        return 1;
    }
    if (attr == 1 && a->ctx == 0) {
        return 1;
    }
    return fake_attr(a, attr, data);
}

// Reads the parameter list the tests pack: u32, u64, 16 bytes, u64.
static void record_params(void **params) {
    if (params == NULL) {
        return;
    }
    rec[11] = *(uint32_t *)params[0];
    rec[12] = *(uint64_t *)params[1];
    memcpy(&rec[13], params[2], 16);
    rec[15] = *(uint64_t *)params[3];
}

int cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                   unsigned int by, unsigned int bz, unsigned int smem, void *stream,
                   void **params, void **extra) {
    rec[1] = (uint64_t)(uintptr_t)f;
    rec[2] = gx, rec[3] = gy, rec[4] = gz;
    rec[5] = bx, rec[6] = by, rec[7] = bz;
    rec[8] = smem;
    rec[9] = (uint64_t)(uintptr_t)stream;
    rec[10] = (uint64_t)(uintptr_t)extra;
    record_params(params);
    return f == (void *)0xbad ? 701 : sticky; // CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on request
}

int cuLaunchKernelEx(const CUlaunchConfig *c, void *f, void **params, void **extra) {
    rec[1] = (uint64_t)(uintptr_t)f;
    rec[2] = c->gridDimX, rec[3] = c->gridDimY, rec[4] = c->gridDimZ;
    rec[5] = c->blockDimX, rec[6] = c->blockDimY, rec[7] = c->blockDimZ;
    rec[8] = c->sharedMemBytes;
    rec[9] = (uint64_t)(uintptr_t)c->hStream;
    rec[10] = (uint64_t)(uintptr_t)extra;
    rec[16] = c->numAttrs;
    rec[17] = c->numAttrs ? (uint64_t)c->attrs[0].id : 0;
    rec[18] = c->numAttrs ? (uint64_t)c->attrs[0].value.programmaticStreamSerializationAllowed : 0;
    record_params(params);
    return 0;
}

// Fills every byte with 0xEE: the handle that fake cuIpcOpenMemHandle_v2 refuses.
int cuIpcGetMemHandle(CUipcMemHandle *h, unsigned long long dptr) {
    (void)dptr;
    memset(h->reserved, 0xEE, sizeof h->reserved);
    return 0;
}

// Records the handle it got by value and returns an address derived from it.
int cuIpcOpenMemHandle_v2(unsigned long long *pdptr, CUipcMemHandle h, unsigned int flags) {
    memcpy(&rec[20], h.reserved, 64);
    rec[28] = flags;
    if ((unsigned char)h.reserved[0] == 0xEE) {
        return 201; // CUDA_ERROR_INVALID_CONTEXT, as the real driver in the exporting process
    }
    *pdptr = rec[20] ^ rec[27];
    return 0;
}
