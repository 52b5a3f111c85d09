// A fake libcuda for memory's tests: the entry points they reach, answering as a driver with
// one device allocation would. The tests build it with cc together with stubs that succeed for
// every other required entry point of driver's table; not part of goccl.
#include <stdint.h>
#include <stddef.h>
#include <string.h>

// The one allocation: [ALLOC_BASE, ALLOC_BASE+ALLOC_SIZE), as fakeAllocBase and
// fakeAllocSize in helpers_test.go.
#define ALLOC_BASE 0x10000000ULL
#define ALLOC_SIZE 0x100000ULL

// CUpointer_attribute values.
enum { RANGE_START_ADDR = 11, RANGE_SIZE = 12 };

int cuDriverGetVersion(int *v) { *v = 12040; return 0; }

int cuDevicePrimaryCtxRetain(void **pctx, int dev) {
    (void)dev;
    *pctx = (void *)0xc0;
    return 0;
}

int cuPointerGetAttribute(void *data, int attr, unsigned long long p) {
    if (p < ALLOC_BASE || p >= ALLOC_BASE + ALLOC_SIZE) return 1; // CUDA_ERROR_INVALID_VALUE
    switch (attr) {
    case RANGE_START_ADDR: *(uint64_t *)data = ALLOC_BASE; return 0;
    case RANGE_SIZE: *(size_t *)data = ALLOC_SIZE; return 0;
    }
    return 801; // CUDA_ERROR_NOT_SUPPORTED
}

int cuIpcGetMemHandle(char handle[64], unsigned long long p) {
    if (p != ALLOC_BASE) return 1; // the handle names a whole allocation, from its base
    memset(handle, 0xab, 64);
    return 0;
}
