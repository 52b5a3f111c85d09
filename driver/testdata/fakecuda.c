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
static uint64_t rec[32];

uint64_t fake_get(int i) { return rec[i]; }

int fake_ok(void) { return 0; }

int fake_not_ready(void) { return 600; } // CUDA_ERROR_NOT_READY, for cuStreamQuery

int cuCtxSetCurrent(void *ctx) {
    rec[0] = (uint64_t)(uintptr_t)ctx;
    return 0;
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
    return f == (void *)0xbad ? 701 : 0; // CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on request
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
