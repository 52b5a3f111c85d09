// nccl_allreduce.c: the C baseline for the host cost of an all-reduce that goccl hands to NCCL.
// It makes a communicator of one rank on GPU 0 and queues ncclAllReduce calls of 16 KiB of bf16
// on one stream in a loop, and prints ns per call (the median of 7 rounds), for comparison with
// BenchmarkAllReduceHostNCCL (collective) in the same run on the same machine.
//
// Build and run on a GPU node (needs cuda.h from a CUDA toolkit, libcuda and libnccl.so.2; the
// few NCCL declarations it needs are written out below, so nccl.h is not needed):
//   gcc -O2 -I/usr/local/cuda/include -o nccl_allreduce scripts/bench/nccl_allreduce.c \
//       -lcuda -l:libnccl.so.2 && ./nccl_allreduce 20000
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
extern int ncclGetUniqueId(ncclUniqueId *id);
extern int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
extern int ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op,
                         ncclComm_t comm, CUstream stream);
extern int ncclCommDestroy(ncclComm_t comm);
enum { ncclBfloat16 = 9, ncclSum = 0 };

#define CHECK(x)                                                              \
	do {                                                                      \
		CUresult r_ = (x);                                                    \
		if (r_ != CUDA_SUCCESS) {                                             \
			fprintf(stderr, "%s:%d: %s: %d\n", __FILE__, __LINE__, #x, r_);   \
			exit(1);                                                          \
		}                                                                     \
	} while (0)
#define NCHECK(x)                                                             \
	do {                                                                      \
		int r_ = (x);                                                         \
		if (r_ != 0) {                                                        \
			fprintf(stderr, "%s:%d: %s: NCCL %d\n", __FILE__, __LINE__, #x, r_); \
			exit(1);                                                          \
		}                                                                     \
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

int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 20000;
	CUdevice dev;
	CUcontext ctx;
	CUstream s;
	CUdeviceptr buf;
	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	const size_t count = 8 << 10; // 16 KiB of bf16
	CHECK(cuMemAlloc(&buf, 2 * count));
	ncclUniqueId id;
	ncclComm_t comm;
	NCHECK(ncclGetUniqueId(&id));
	NCHECK(ncclCommInitRank(&comm, 1, id, 0));
	enum { ROUNDS = 7 };
	double r[ROUNDS];
	for (int k = 0; k < ROUNDS; k++) {
		CHECK(cuStreamSynchronize(s));
		double t0 = now_ns();
		for (int i = 0; i < n; i++) {
			NCHECK(ncclAllReduce((void *)buf, (void *)buf, count, ncclBfloat16, ncclSum, comm, s));
			if (i % 64 == 63) { // as the Go benchmark: never let the queue fill up
				double t1 = now_ns();
				CHECK(cuStreamSynchronize(s));
				t0 += now_ns() - t1;
			}
		}
		r[k] = (now_ns() - t0) / n;
	}
	CHECK(cuStreamSynchronize(s));
	qsort(r, ROUNDS, sizeof r[0], cmp);
	printf("C ncclAllReduce, 1 rank, 16 KiB bf16: %.0f ns per call\n", r[ROUNDS / 2]);
	ncclCommDestroy(comm);
	return 0;
}
