// startup.c: the driver's part of goccl's start-up, in C. It does what a communicator's New
// asks of libcuda before its kernels run, and times each call: cuInit, the primary context
// (cuDevicePrimaryCtxRetain, which creates it), then cuModuleLoadDataEx of the same PTX texts
// goccl loads, with the same JIT options (error and info logs, verbose), the kernel lookup and
// its occupancy at 512 threads per block, one module after another or from several threads
// at once. Comm.Startup reports the same steps from inside goccl: the two side by side show
// what goccl adds to the driver's own cost.
//
// The PTX comes from goccl's own generator (collective's TestDumpStartupPTX):
//   GOCCL_DUMP_PTX=/tmp/ptx ./collective.test -test.run '^TestDumpStartupPTX$'
// writes /tmp/ptx/sm_90/w8-gpu (the nine kernels a communicator of 8 ranks on one GPU loads),
// w8-sys (ranks on several GPUs), w8-both (both scopes: fifteen) and the same for 2 and 4.
//
// Build and run on the GPU node; it opens libcuda.so.1 itself, so neither cuda.h nor a
// toolkit is needed:
//   gcc -O2 -o startup scripts/bench/startup.c -ldl -lpthread
//   CUDA_CACHE_DISABLE=1 ./startup -j 1,4,16 /tmp/ptx/sm_90/w8-both
//
// Flags:
//   -j LIST   thread counts to load with, comma-separated (default 1): each count loads every
//             module once per round, its threads taking the next module as they finish one
//   -r N      rounds per thread count (default 2): every round loads all modules and unloads
//             them, so that later rounds show the driver's on-disk JIT cache (unless
//             CUDA_CACHE_DISABLE=1, which makes every round compile)
//   -d N      device ordinal (default 0)
//   -q        no JIT logs and no verbose option (goccl asks for both)
//   -v        one line per module and round, not only the first round of each count
//   PATH...   .ptx files, or folders whose *.ptx files are loaded in name order
//
// The driver's own count of JIT time (CU_JIT_WALL_TIME) is printed beside each load where the
// driver reports it; it is absent (or 0) where the module came from the on-disk cache.
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;

// CUjit_option values, as in cuda.h.
enum {
	JIT_WALL_TIME = 2,
	JIT_INFO_LOG_BUFFER = 3,
	JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
	JIT_ERROR_LOG_BUFFER = 5,
	JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
	JIT_LOG_VERBOSE = 12,
};

enum { LOG_BYTES = 32 << 10 }; // goccl's JIT log buffers (driver/module.go)

static CUresult (*cuInit)(unsigned int);
static CUresult (*cuDriverGetVersion)(int *);
static CUresult (*cuDeviceGet)(CUdevice *, int);
static CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuModuleLoadDataEx)(CUmodule *, const void *, unsigned int, int *, void **);
static CUresult (*cuModuleUnload)(CUmodule);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *, CUfunction, int, size_t);
static CUresult (*cuGetErrorName)(CUresult, const char **);

static const char *errName(CUresult r) {
	const char *s = "unknown error";
	if (cuGetErrorName)
		cuGetErrorName(r, &s);
	return s;
}

#define CHECK(x)                                                                        \
	do {                                                                                \
		CUresult r_ = (x);                                                              \
		if (r_ != 0) {                                                                  \
			fprintf(stderr, "%s:%d: %s: %s (%d)\n", __FILE__, __LINE__, #x, errName(r_), r_); \
			exit(1);                                                                    \
		}                                                                               \
	} while (0)

static double nowMs(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *sym(void *lib, const char *name, int required) {
	void *p = dlsym(lib, name);
	if (!p && required) {
		fprintf(stderr, "libcuda lacks %s\n", name);
		exit(1);
	}
	return p;
}

// One PTX module: its text and entry name, and what the current round measured.
struct kernel {
	char *path, *ptx, entry[256];
	CUmodule mod;
	double start, load, wall, setup; // ms; wall < 0: the driver did not report it
	int occ;
};

static struct kernel *kernels;
static int nkernels;
static CUcontext ctx;
static int quiet;
static int noWallTime; // set when the driver refused CU_JIT_WALL_TIME
static int next;       // the next module to load in the round (atomic)
static double roundStart;

static char *readFile(const char *path) {
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc(n + 1);
	if (fread(b, 1, n, f) != (size_t)n) {
		perror(path);
		exit(1);
	}
	b[n] = 0; // the driver reads PTX as a C string
	fclose(f);
	return b;
}

static void addFile(const char *path) {
	kernels = realloc(kernels, (nkernels + 1) * sizeof *kernels);
	struct kernel *k = &kernels[nkernels++];
	memset(k, 0, sizeof *k);
	k->path = strdup(path);
	k->ptx = readFile(path);
	const char *e = strstr(k->ptx, ".entry ");
	if (!e || sscanf(e + 7, "%255[A-Za-z0-9_$]", k->entry) != 1) {
		fprintf(stderr, "%s: no .entry\n", path);
		exit(1);
	}
}

static int cmpNames(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void addPath(const char *path) {
	struct stat st;
	if (stat(path, &st) != 0) {
		perror(path);
		exit(1);
	}
	if (!S_ISDIR(st.st_mode)) {
		addFile(path);
		return;
	}
	DIR *d = opendir(path);
	char **names = NULL;
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d));) {
		size_t l = strlen(e->d_name);
		if (l > 4 && strcmp(e->d_name + l - 4, ".ptx") == 0) {
			names = realloc(names, (n + 1) * sizeof *names);
			names[n++] = strdup(e->d_name);
		}
	}
	if (d)
		closedir(d);
	qsort(names, n, sizeof *names, cmpNames);
	for (int i = 0; i < n; i++) {
		char full[4096];
		snprintf(full, sizeof full, "%s/%s", path, names[i]);
		addFile(full);
	}
}

// loadOne loads module k as goccl does (driver/module.go: LoadModule), then looks its kernel
// up and asks for the occupancy (collective/kernels.go: jitCompile).
static void loadOne(struct kernel *k) {
	static __thread char errLog[LOG_BYTES], infoLog[LOG_BYTES];
	int opts[6];
	void *vals[6];
	unsigned int n = 0;
	float wall = -1;
	if (!quiet) {
		opts[n] = JIT_ERROR_LOG_BUFFER, vals[n++] = errLog;
		opts[n] = JIT_ERROR_LOG_BUFFER_SIZE_BYTES, vals[n++] = (void *)(uintptr_t)LOG_BYTES;
		opts[n] = JIT_INFO_LOG_BUFFER, vals[n++] = infoLog;
		opts[n] = JIT_INFO_LOG_BUFFER_SIZE_BYTES, vals[n++] = (void *)(uintptr_t)LOG_BYTES;
		opts[n] = JIT_LOG_VERBOSE, vals[n++] = (void *)(uintptr_t)1;
	}
	int wallAt = -1;
	if (!__atomic_load_n(&noWallTime, __ATOMIC_RELAXED)) {
		// cuda.h says the driver overwrites the option's value with a float; its samples pass
		// a pointer to one. Both are read back.
		wallAt = n;
		opts[n] = JIT_WALL_TIME, vals[n++] = &wall;
	}
	k->start = nowMs() - roundStart;
	double t0 = nowMs();
	CUresult r = cuModuleLoadDataEx(&k->mod, k->ptx, n, opts, vals);
	if (r == 1 && wallAt >= 0) { // CUDA_ERROR_INVALID_VALUE: try once more without the wall time
		__atomic_store_n(&noWallTime, 1, __ATOMIC_RELAXED);
		fprintf(stderr, "note: the driver refused CU_JIT_WALL_TIME; loading without it\n");
		n--, wallAt = -1;
		t0 = nowMs();
		r = cuModuleLoadDataEx(&k->mod, k->ptx, n, opts, vals);
	}
	k->load = nowMs() - t0;
	if (r != 0) {
		fprintf(stderr, "%s: cuModuleLoadDataEx: %s (%d)\n%s\n", k->path, errName(r), r, quiet ? "" : errLog);
		exit(1);
	}
	k->wall = -1;
	if (wallAt >= 0) {
		if (vals[wallAt] != (void *)&wall) {
			uint32_t bits = (uint32_t)(uintptr_t)vals[wallAt];
			float w;
			memcpy(&w, &bits, sizeof w);
			k->wall = w;
		} else if (wall >= 0) {
			k->wall = wall;
		}
	}
	t0 = nowMs();
	CUfunction f;
	CHECK(cuModuleGetFunction(&f, k->mod, k->entry));
	CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&k->occ, f, 512, 0));
	k->setup = nowMs() - t0;
}

static void *worker(void *arg) {
	(void)arg;
	CHECK(cuCtxSetCurrent(ctx));
	for (;;) {
		int i = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
		if (i >= nkernels)
			return NULL;
		loadOne(&kernels[i]);
	}
}

// runRound loads every module with threads threads, prints the round, and unloads them.
static void runRound(int threads, int round, int verbose) {
	next = 0;
	roundStart = nowMs();
	pthread_t *tids = calloc(threads, sizeof *tids);
	for (int t = 0; t < threads; t++)
		pthread_create(&tids[t], NULL, worker, NULL);
	for (int t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
	double wall = nowMs() - roundStart;
	free(tids);
	double sum = 0, setup = 0;
	for (int i = 0; i < nkernels; i++)
		sum += kernels[i].load, setup += kernels[i].setup;
	double t0 = nowMs();
	CHECK(cuCtxSetCurrent(ctx));
	for (int i = 0; i < nkernels; i++)
		CHECK(cuModuleUnload(kernels[i].mod));
	double unload = nowMs() - t0;
	printf("threads %2d, round %d: %d modules in %8.2f ms (loads %8.2f ms summed, lookups and occupancy %6.2f ms), unload %6.2f ms\n",
	       threads, round, nkernels, wall, sum, setup, unload);
	if (!verbose)
		return;
	printf("  %-32s %10s %10s %10s %10s %s\n", "kernel", "start ms", "load ms", "JIT ms", "setup ms", "blocks/SM");
	for (int i = 0; i < nkernels; i++) {
		struct kernel *k = &kernels[i];
		char jit[32] = "-";
		if (k->wall >= 0)
			snprintf(jit, sizeof jit, "%.2f", k->wall);
		printf("  %-32s %10.2f %10.2f %10s %10.3f %d\n", k->entry, k->start, k->load, jit, k->setup, k->occ);
	}
}

static void usage(void) {
	fprintf(stderr, "usage: startup [-j threads,...] [-r rounds] [-d device] [-q] [-v] PATH...\n");
	exit(2);
}

int main(int argc, char **argv) {
	const char *jlist = "1";
	int rounds = 2, ordinal = 0, verbose = 0;
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "-j") == 0 && i + 1 < argc)
			jlist = argv[++i];
		else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (strcmp(argv[i], "-d") == 0 && i + 1 < argc)
			ordinal = atoi(argv[++i]);
		else if (strcmp(argv[i], "-q") == 0)
			quiet = 1;
		else if (strcmp(argv[i], "-v") == 0)
			verbose = 1;
		else
			usage();
	}
	if (i == argc || rounds < 1)
		usage();
	for (; i < argc; i++)
		addPath(argv[i]);
	if (nkernels == 0) {
		fprintf(stderr, "no .ptx files\n");
		return 1;
	}

	const char *path = getenv("GOCCL_LIBCUDA") ? getenv("GOCCL_LIBCUDA") : "libcuda.so.1";
	double t0 = nowMs();
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	double tOpen = nowMs() - t0;
	if (!lib) {
		fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
		return 1;
	}
	cuInit = sym(lib, "cuInit", 1);
	cuDriverGetVersion = sym(lib, "cuDriverGetVersion", 1);
	cuDeviceGet = sym(lib, "cuDeviceGet", 1);
	cuDeviceGetAttribute = sym(lib, "cuDeviceGetAttribute", 1);
	cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain", 1);
	cuDevicePrimaryCtxRelease = sym(lib, "cuDevicePrimaryCtxRelease_v2", 0);
	if (!cuDevicePrimaryCtxRelease)
		cuDevicePrimaryCtxRelease = sym(lib, "cuDevicePrimaryCtxRelease", 1);
	cuCtxSetCurrent = sym(lib, "cuCtxSetCurrent", 1);
	cuModuleLoadDataEx = sym(lib, "cuModuleLoadDataEx", 1);
	cuModuleUnload = sym(lib, "cuModuleUnload", 1);
	cuModuleGetFunction = sym(lib, "cuModuleGetFunction", 1);
	cuOccupancyMaxActiveBlocksPerMultiprocessor = sym(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor", 1);
	cuGetErrorName = sym(lib, "cuGetErrorName", 0);

	CUdevice dev;
	int version = 0, major = 0, minor = 0;
	t0 = nowMs();
	CHECK(cuInit(0));
	double tInit = nowMs() - t0;
	CHECK(cuDriverGetVersion(&version));
	t0 = nowMs();
	CHECK(cuDeviceGet(&dev, ordinal));
	double tDev = nowMs() - t0;
	CHECK(cuDeviceGetAttribute(&major, 75, dev)); // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	CHECK(cuDeviceGetAttribute(&minor, 76, dev));
	t0 = nowMs();
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	double tRetain = nowMs() - t0;
	t0 = nowMs();
	CHECK(cuCtxSetCurrent(ctx));
	double tCurrent = nowMs() - t0;

	const char *cache = getenv("CUDA_CACHE_DISABLE");
	printf("%s, CUDA %d.%d driver, device %d sm_%d%d, CUDA_CACHE_DISABLE=%s, JIT logs %s\n", path, version / 1000,
	       version % 1000 / 10, ordinal, major, minor, cache ? cache : "(unset)", quiet ? "off" : "on (verbose)");
	printf("dlopen                   %8.2f ms\n", tOpen);
	printf("cuInit                   %8.2f ms\n", tInit);
	printf("cuDeviceGet              %8.2f ms\n", tDev);
	printf("cuDevicePrimaryCtxRetain %8.2f ms (creates the context)\n", tRetain);
	printf("cuCtxSetCurrent          %8.2f ms\n", tCurrent);
	printf("%d modules, first %s\n", nkernels, kernels[0].path);

	for (const char *p = jlist; *p;) {
		int threads = atoi(p);
		if (threads < 1)
			usage();
		for (int r = 1; r <= rounds; r++)
			runRound(threads, r, verbose || r == 1);
		p = strchr(p, ',');
		if (!p)
			break;
		p++;
	}
	CHECK(cuDevicePrimaryCtxRelease(dev));
	return 0;
}
