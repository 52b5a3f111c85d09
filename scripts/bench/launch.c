// launch.c: the C baseline for goccl's host-cost numbers. It launches an empty kernel (the
// same PTX as driver's BenchmarkLaunch) in a loop through libcuda and prints ns per launch,
// so that driver.Launch and collective.AllReduce can be compared with C side by side, in one
// run on one machine.
//
// Build and run on a GPU node (needs cuda.h from a CUDA toolkit and libcuda):
//   gcc -O2 -I/usr/local/cuda/include -o launch scripts/bench/launch.c -lcuda && ./launch 20000
//
// It prints three lines: plain cuLaunchKernel; cuCtxSetCurrent + cuLaunchKernel (what a library
// that binds the context on every call pays); cuLaunchKernel with 176 bytes of parameters (the
// size of goccl's one-shot kernel parameters at 8 ranks). Each is the median of 7 rounds.
// With "probe" as second argument it also reports whether a launch succeeds, and runs, on a
// thread with no current context and on one where another context is current: whether the
// driver takes the context from the stream, which would let goccl skip cuCtxSetCurrent.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *ptx =
    ".version 7.8\n.target sm_80\n.address_size 64\n"
    ".visible .entry empty()\n{\n\tret;\n}\n"
    ".visible .entry params(.param .u64 a, .param .u64 b, .param .u32 c, .param .u32 d,\n"
    "  .param .u64 e, .param .u64 f, .param .align 8 .b8 g[64], .param .align 8 .b8 h[64],\n"
    "  .param .u64 i)\n{\n\tret;\n}\n"
    ".visible .entry mark(.param .u64 p)\n{\n\t.reg .u64 %a;\n\t.reg .u32 %v;\n"
    "\tld.param.u64 %a, [p];\n\tmov.u32 %v, 1;\n\tst.global.u32 [%a], %v;\n\tret;\n}\n";

#define CHECK(x)                                                                   \
	do {                                                                           \
		CUresult r_ = (x);                                                         \
		if (r_ != CUDA_SUCCESS) {                                                  \
			const char *s_ = "?";                                                  \
			cuGetErrorName(r_, &s_);                                               \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_);        \
			exit(1);                                                               \
		}                                                                          \
	} while (0)

static double now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

enum { ROUNDS = 7 };

// measure returns the median over ROUNDS of the ns per launch of n launches.
static double measure(CUcontext ctx, CUstream s, CUfunction f, void **params, int setCurrent, int n) {
	double r[ROUNDS];
	for (int k = 0; k < ROUNDS; k++) {
		CHECK(cuStreamSynchronize(s));
		double t0 = now_ns();
		for (int i = 0; i < n; i++) {
			if (setCurrent)
				CHECK(cuCtxSetCurrent(ctx));
			CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
		}
		r[k] = (now_ns() - t0) / n;
	}
	CHECK(cuStreamSynchronize(s));
	qsort(r, ROUNDS, sizeof r[0], cmp);
	return r[ROUNDS / 2];
}

enum binding { OWN, NONE, OTHER };

// probeOne launches mark on s (a stream of ctx) with ctx, no context or another context of
// the same device current, and reports whether the launch succeeded and the kernel ran.
static void probeOne(enum binding bind, CUcontext ctx, CUdevice dev, CUstream s, CUfunction mark, CUdeviceptr flag) {
	static const char *names[] = {"its own context", "no context", "another context"};
	CUcontext other = NULL;
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuMemsetD32(flag, 0, 1));
	CHECK(cuCtxSynchronize());
	if (bind == NONE)
		CHECK(cuCtxSetCurrent(NULL));
	if (bind == OTHER) {
#if CUDA_VERSION >= 13000
		CHECK(cuCtxCreate(&other, NULL, 0, dev));
#else
		CHECK(cuCtxCreate(&other, 0, dev));
#endif
		CHECK(cuCtxSetCurrent(other));
	}
	void *params[] = {&flag};
	CUresult r = cuLaunchKernel(mark, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
	const char *name = "?";
	cuGetErrorName(r, &name);
	unsigned int v = 0;
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuStreamSynchronize(s));
	CHECK(cuMemcpyDtoH(&v, flag, 4));
	printf("probe: launch on a stream of the primary context with %s current: %s, kernel ran: %s\n",
	       names[bind], name, v == 1 ? "yes" : "no");
	if (other)
		CHECK(cuCtxDestroy(other));
}

static void probe(CUcontext ctx, CUdevice dev, CUstream s, CUmodule mod) {
	CUfunction mark;
	CUdeviceptr flag;
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuModuleGetFunction(&mark, mod, "mark"));
	CHECK(cuMemAlloc(&flag, 4));
	probeOne(OWN, ctx, dev, s, mark, flag);
	probeOne(NONE, ctx, dev, s, mark, flag);
	probeOne(OTHER, ctx, dev, s, mark, flag);
	CHECK(cuMemFree(flag));
}

int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 20000;
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction empty, withParams;
	CUstream s;
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuModuleLoadData(&mod, ptx));
	CHECK(cuModuleGetFunction(&empty, mod, "empty"));
	CHECK(cuModuleGetFunction(&withParams, mod, "params"));
	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

	unsigned long long a = 0, b = 0, e = 0, f = 0, i = 0;
	unsigned int c = 0, d = 0;
	unsigned char g[64] = {0}, h[64] = {0};
	void *params[] = {&a, &b, &c, &d, &e, &f, g, h, &i};

	measure(ctx, s, empty, NULL, 0, n); // warm-up
	printf("C cuLaunchKernel (empty kernel):                   %.0f ns/launch\n", measure(ctx, s, empty, NULL, 0, n));
	printf("C cuCtxSetCurrent + cuLaunchKernel (empty kernel): %.0f ns/launch\n", measure(ctx, s, empty, NULL, 1, n));
	printf("C cuLaunchKernel (176 bytes of parameters):        %.0f ns/launch\n", measure(ctx, s, withParams, params, 0, n));
	if (argc > 2 && strcmp(argv[2], "probe") == 0)
		probe(ctx, dev, s, mod);
	return 0;
}
