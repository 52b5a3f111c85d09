// Arsmoke tells, in one go, whether all-reduce works on this machine's GPUs
// and how fast it is: the smoke test and benchmark of goccl, in the spirit of
// nccl-tests' all_reduce_perf, as one Go binary that needs no CUDA toolkit
// (only the NVIDIA driver).
//
// Usage:
//
//	arsmoke [flags]
//
// With no flags it runs every visible GPU in one process, one rank per GPU
// (with a single GPU: 8 virtual ranks on it), on bf16 messages of 1 KiB to
// 8 MiB doubling, with the automatic algorithm, checks every result, prints a
// table and a verdict, and exits 0 only if nothing was wrong. --backend nccl
// measures NCCL instead, and --backend both measures the two side by side
// (see NCCL below).
//
// # Flags
//
// Flags take one dash or two: -n 20 and --n 20 are the same.
//
//	-b size       smallest message in bytes (default 1K). Sizes take the
//	              suffixes K, M, G, optionally with B or iB, all powers of
//	              1024 as in all_reduce_perf: 4096, 64K, 8M, 64MiB. Every
//	              size must be a whole number of elements, at least one
//	              (a multiple of 2 bytes for bf16 and f16, of 4 for f32):
//	              the kernels take any element count.
//	-e size       largest message in bytes (default 8M); at least -b.
//	-f factor     multiply the size by factor at each step (default 2, at
//	              least 2). The sweep is -b, -b*f, ... up to -e.
//	-d type       element type: bf16 (default), f16 or f32.
//	-a algorithm  auto (default: the communicator's choice), oneshot,
//	              twoshot, push, or all: one table per algorithm. These are
//	              goccl's; with --backend nccl, -a stays auto.
//	--backend b   goccl (default): goccl's kernels, as -a says; nccl: every
//	              call through NCCL; both: goccl's kernels and NCCL side by
//	              side, one table per algorithm with the speedup. NCCL needs
//	              libnccl and one rank per GPU, or --procs (see NCCL).
//	-g            capture the all-reduces in a CUDA graph and replay it
//	              (default: eager calls): the -n timed ones in one graph per
//	              rank, replayed untimed for the warm-up, so that -w rounds
//	              up to whole graphs (-w 10 -n 100: one replay of 100; -w 0:
//	              none, and the graph's upload to the GPU, which its first
//	              launch does, is part of the time).
//	-n iterations timed all-reduces per size and placement (default 100).
//	-w iterations untimed warm-up all-reduces before them (default 10).
//	-c 0|1        check the results (default 1): fresh random inputs for
//	              each size, outputs poisoned before the run, every rank's
//	              output compared bitwise with the CPU reference and with the
//	              other ranks'.
//	--ranks N     run N ranks, 2 to 16. Without --device each rank needs its
//	              own GPU, except on a machine with one GPU, where they share
//	              it.
//	--device D    run every rank on GPU D, as virtual ranks (default: 8 of
//	              them unless --ranks or --procs says otherwise).
//	--procs N     run N processes of one rank each, 2 to 16: arsmoke starts N
//	              copies of itself with the same flags, which join through a
//	              Unix socket. Ranks go to GPUs as with --ranks. After each
//	              case the processes combine their results (times, wrong
//	              elements, first mismatch, errors), so the results cover
//	              every rank and every process ends with the same verdict;
//	              rank 0 prints them, the others' messages come prefixed
//	              with their rank. If one fails, the others are stopped; once
//	              one has finished, the others get --timeout to follow. If
//	              arsmoke itself is killed, its processes stop within a
//	              second, as on an interrupt. With
//	              --backend nccl or both and the processes on one GPU, each
//	              gets its own NCCL_HOSTID (see NCCL).
//	--timeout d   the longest wait for a peer (bootstrap, the kernels'
//	              watchdog, and with --procs the other processes' results of
//	              a case) before the run fails naming the rank and the peer
//	              (default 10s).
//	--json        print the results as one JSON document instead of the
//	              table (see below); nothing else goes to stdout.
//	--topo        print the GPUs and their links, and exit.
//	--fused       measure the fused all-reduce + residual add + RMSNorm
//	              beside the unfused pair, over row counts instead of
//	              message sizes (see Fused).
//	--hidden N    with --fused: elements per row, a multiple of 8 from 2048
//	              to 16384 (default 8192).
//	--rows list   with --fused: the row counts, comma-separated, each N or
//	              A-B for A, A*f, ... up to B (-f, default 2); default
//	              1,8,32,128,512. Each rank's input is rows*hidden elements.
//	--tune        measure every algorithm and a few grids on this machine
//	              and write the tuning table goccl loads (see Tuning).
//	--quick       with --tune: fewer grids, 20 iterations after 5 warm-up.
//	--worlds list with --tune: the world sizes to tune, comma-separated
//	              (default: 2,4,8 virtual ranks on one GPU or with
//	              --device, 2 to N over N GPUs; --ranks N or --procs N: N).
//	-o file       with --tune: write the table there instead of the file
//	              goccl loads by default.
//
// Which GPUs are visible follows CUDA_VISIBLE_DEVICES. GOCCL_LIBCUDA is the
// path of libcuda.so.1 when the driver is not where the dynamic loader looks;
// GOCCL_LIBNCCL that of libnccl.so.2; GOCCL_LIBNVML that of
// libnvidia-ml.so.1, which --topo and ranks on several GPUs read the links
// from. A process that drives every rank sets CUDA_DEVICE_MAX_CONNECTIONS to
// 32 unless it is set already: with CUDA's default of 8 hardware queues, two
// virtual ranks' streams can share a queue and wait for each other. The ranks
// of --procs keep the default (under MPS, 32 queues a process exhaust the
// GPU's pool).
//
// # NCCL
//
// goccl's communicators drive NCCL beside their kernels where they can: when
// every rank's process loads libnccl and no two ranks of one host share a GPU
// (NCCL takes one rank per GPU of a host).
//
// --backend goccl runs the library as a service would. With -a auto, where
// the communicator can have NCCL (one rank per GPU, libnccl present) and the
// sweep goes past 64 MiB, the kernels take the calls up to 64 MiB and NCCL
// the larger ones; everywhere else (virtual ranks, processes on one GPU, no
// libnccl, or -a naming a kernel) the kernels take every size. The path
// column says what served each row: oneshot, twoshot, push or nccl.
//
// --backend nccl sends every call through NCCL. --backend both runs two
// communicators in the same processes, one after the other: one of goccl's
// kernels only, which take every size of the sweep, and one of NCCL only. At
// each size NCCL follows goccl, and each row shows both times and the speedup,
// NCCL's time over goccl's (above 1: goccl is faster); NCCL is measured once
// per size and shown in every block of -a all.
//
// What each placement can show:
//
//   - one rank per GPU (several GPUs, one process or --procs): NCCL over its
//     usual transports (NVLink, PCIe), goccl's kernels over peer access: the
//     comparison that matters.
//   - virtual ranks (ranks sharing a GPU in one process: one GPU, or
//     --device): NCCL cannot run at all; --backend nccl or both is refused
//     (exit 2): add --procs.
//   - --procs N on one GPU: NCCL refuses ranks of one host on one GPU, so
//     arsmoke gives each process its own NCCL_HOSTID (and
//     NCCL_SOCKET_IFNAME=lo unless set): NCCL takes each process for a host of
//     its own and connects them over TCP sockets through the loopback. goccl's
//     kernels-only communicator ignores NCCL_HOSTID and still finds the
//     processes on one host, sharing memory through CUDA IPC. Both results are
//     checked, but NCCL's times are those of sockets through host memory, not
//     of a GPU interconnect: they show that NCCL works through arsmoke, not
//     how the two compare between GPUs. (With --backend goccl nothing is set,
//     and the processes' communicators have no NCCL.)
//
// Checking: goccl's results are compared bitwise with the CPU reference of
// the kernel that ran (internal/ref), which every rank matches. NCCL adds
// the ranks' values in its own order and rounds in the element type after
// each addition, so its results are compared with the exact sum: an element
// passes when |got - sum| <= n * u * sum_r |x_r| (n ranks; u = 2^-8 for bf16,
// 2^-11 for f16, 2^-24 for f32; plus n times half the smallest subnormal,
// for roundings near zero). NaN never passes, and neither does an infinity,
// except where the order can make one: inputs of one sign that add up past
// the largest finite value allow that sign's infinity (the exact sum may
// still be finite), and both signs' together allow NaN.
//
// # Fused
//
// --fused measures the end of a tensor-parallel transformer layer: the
// all-reduce of the layer's partial sums, the residual add and the RMSNorm,
// ResidualOut = allreduce(In) + Residual and NormOut = RMSNorm(ResidualOut) *
// Gamma with eps 1e-6, rows of --hidden elements. For each row count it
// runs, on every rank:
//
//   - the fused call, collective.Comm.AllReduceResidualRMSNorm: one kernel;
//   - the unfused pair: AllReduce into a sum buffer, then
//     collective.Comm.ResidualRMSNorm over that sum: two kernels.
//
// In, the pair's sum, the residual and both outputs are registered (and a
// graph shares them anyway), so a TwoShot writes the finished rows straight
// into every rank's outputs. -a auto lets each call pick its algorithm (the
// path and pair path columns say which); -a oneshot, twoshot or push forces
// both calls to it (the fused push takes calls up to the communicator's
// PushMaxBytes, which -a push raises to the largest call); -a all runs
// oneshot and twoshot as two blocks.
//
// Checking (-c 1): fresh activations for each row count (inputs in [-1, 1],
// the residual in [-4, 4] and gamma in [-1.5, 1.5], both the same on every
// rank), each call once out of place into poisoned outputs: the fused call's
// ResidualOut and NormOut bitwise against internal/ref.Fused in the order of
// its algorithm; the pair's sum bitwise against the all-reduce reference of
// its path, and its outputs bitwise against internal/ref.Fused over that
// sum; on every rank. Then each is timed in place (ResidualOut over the
// residual), eagerly or with -g in one CUDA graph per rank, as the
// all-reduces are.
//
// --backend nccl times the pair alone, its all-reduce through NCCL (the sum
// checked within NCCL's tolerance, see NCCL; the outputs still bitwise over
// the sum each rank got): NCCL has no fused call, so there is no fused
// column. ResidualRMSNorm is one of goccl's kernels: on GPUs that goccl's
// kernels cannot serve (see NCCL), the run fails saying so.
//
// --backend both, -b and -e are refused with --fused (exit 2): run goccl and
// nccl one after the other; the rows set the sizes, and the communicators'
// MaxBytes is raised to the largest rows*hidden (the kernels take every row
// count, where an all-reduce sweep hands NCCL the calls past 64 MiB).
//
// The table of a fused run has one line per row count:
//
//	rows, bytes (each rank's input), type, path (the fused call's
//	algorithm), pair path (what served the pair's all-reduce), fused (us),
//	unfused (us), pair a-r alone (us: the pair's all-reduce timed by
//	itself, so unfused less this is what the norm kernel adds, the most a
//	fused kernel that reduces no faster than that all-reduce can save),
//	ratio (fused / unfused: below 1 the fused call is faster), #wrong
//	(fused and unfused together)
//
// Each table ends with the out-of-bounds line and
//
//	# Avg ratio            : 0.81 (geometric mean of fused / unfused)
//
// and the verdict reads, for example,
//
//	arsmoke: PASS — 8 ranks, bf16, fused, hidden 8192, 5 row counts, 0 wrong
//
// With --json, min_bytes, max_bytes and sizes describe the row counts'
// inputs, blocks is empty, and fused holds the results: hidden, rows, eps,
// blocks (algo, backend, wrong, avg_ratio, and rows with rows, bytes, type,
// path, pair_path, fused_us, unfused_us, allreduce_us, ratio, wrong,
// fused_wrong, unfused_wrong) and first_mismatch (algo, rows, call: fused
// or unfused, output: ResidualOut, NormOut or sum, rank, index, expected,
// got).
//
// # Tuning
//
// --tune measures, for each world size, every algorithm (oneshot, twoshot,
// push) at every size of the sweep, in three kinds of call: captured in a
// graph (Comm.Capture, one graph per rank), eager on registered buffers
// (zero-copy input, twoshot writing straight into every rank's output), and
// eager on plain buffers (the input staged, twoshot through its tmp buffer).
// Each is measured with several grids: 16, 24, 32, 36, 48 and 64 blocks for
// oneshot and twoshot, 8, 16 and 32 for push, with automatic and 256-thread
// blocks, each capped by what the ranks can keep resident on their GPU
// (--quick: 16, 36 and 64 blocks, push 16, automatic threads). Every case is
// timed three times, in three passes over its communicator's cases, and its
// fastest time counts, so that one timing a host-side delay lengthened
// decides nothing (--quick: once). Every call is out of place, and every
// result is checked bitwise against the reference as in a sweep: a wrong one
// stops the run (exit 1). From the times it derives,
// per kind of call, the size bands of each algorithm and their grids, and
// one push grid (every push call of a communicator must use the same), and
// writes them as a section of the tuning table for this GPU, driver and
// topology: -o, else the file goccl loads by default (in the user cache
// directory; docs/tuning.md). Sections of other world sizes or topologies
// already in that file are kept, also those that another --tune run writes at
// the same time (the merge locks <table>.lock). -n and -w default to 50 and
// 10. -a other than auto, -g, -c 0, --backend other than goccl, --json,
// --topo and --fused are refused with --tune.
//
// It prints, per world size, the push grid and, per kind of call, the bands
// and a row per size: the tuned choice (algorithm and grid, blocks x threads)
// and its time, the built-in selection's choice and its time, and the gain;
// then the mean gain. With --procs N it tunes N processes: each times its own
// rank, every case takes the slowest rank's time, a case that fails on any
// rank fails them all, and rank 0 writes the table. Eight virtual ranks take far fewer grids than two (a 16-block cap
// on an H200): 2, 4 and 8 virtual ranks on one H200 take a few minutes,
// --quick about a minute.
//
// # Output
//
// The table has the layout of all_reduce_perf. Header lines give the sweep,
// the goccl version, the driver (and libnccl's version when NCCL is used),
// the host, how ranks are placed, the backend (and how NCCL's results are
// checked), and each rank's process, device, PCI bus id and name. Then, for each algorithm, one
// row per size:
//
//	size (B), count (elements), type, redop (sum), root (-1: none), path,
//	then out of place and in place: time (us), algbw (GB/s), busbw (GB/s), #wrong
//
// path is what served the row (oneshot, twoshot, push or nccl; out of place
// and in place when they differ, as oneshot/twoshot). With --backend both a
// row has, out of place and in place: goccl's time (us), NCCL's time (us),
// the speedup (NCCL's time / goccl's), and #wrong for both together.
//
// time is the mean of one all-reduce over -n iterations on the slowest rank;
// algbw is size / time; busbw = algbw * 2(n-1)/n for n ranks, comparable with
// the links' bandwidth whatever n; #wrong counts the elements, over all ranks,
// that differ from the reference or between ranks, for NCCL those outside its
// tolerance (see NCCL); N/A with -c 0. With -g, out of place, the result of
// the graph's replays is checked as well as the eager call's, and #wrong is
// the larger of the two counts (an element is never counted twice). Each table
// ends with
//
//	# Out of bounds values : 0 OK        (or: N FAILED)
//	# Avg bus bandwidth    : 123.4567    (GB/s, mean over the rows, both placements)
//
// and with --backend both
//
//	# Avg bus bandwidth    : 123.4567 goccl, 98.7654 nccl
//	# Avg speedup          : 1.25x (geometric mean of NCCL's time / goccl's)
//
// and the last line is the verdict, for example
//
//	arsmoke: PASS — 8 ranks, bf16, 14 sizes, 0 wrong
//	arsmoke: FAIL — 8 ranks, bf16, 14 sizes, 3 wrong; first: auto, 4096 B in-place, rank 3, element 17: expected 1 (0x3f80), got 0 (0x0000)
//	arsmoke: DONE — 8 ranks, bf16, 14 sizes, results not checked (-c 0)
//	arsmoke: PASS — 2 ranks, bf16, 14 sizes, goccl beside NCCL, 0 wrong
//
// With --json, stdout is one JSON object with the same content: the header
// fields (goccl, host, driver, mode, backend, nccl: libnccl's version when
// used, kernel_max_bytes: the kernels' largest call when NCCL takes the
// larger ones, ranks, dtype, min_bytes, max_bytes, factor, sizes, warmup,
// iters, graph, check, devices), blocks (algo, backend, rows, wrong,
// avg_busbw_gbps, and with both nccl_avg_busbw_gbps and avg_speedup; each row
// has bytes, count, type, redop, root, out_of_place and in_place with path,
// time_us, algbw_gbps, busbw_gbps, wrong, and with both nccl (NCCL's
// measurement, the same fields) and speedup),
// first_mismatch when something was wrong, error when the run stopped early,
// and verdict (pass, line). A failure also prints the verdict line on stderr.
// With --procs the document is rank 0's; where rank 0 printed none (it was
// stopped, or the run failed before it could), arsmoke prints one with the
// error that ended the run, so that stdout is one JSON object whatever
// happens.
//
// On a terminal, a progress line on stderr shows the case being measured;
// there is none when stderr is not a terminal, or with --json.
//
// # Exit codes
//
//	0  everything ran, and every checked result was right
//	1  a failure: no driver (check GOCCL_LIBCUDA), no GPU, fewer GPUs than
//	   asked, a timeout (the message names the rank and the peer it waited
//	   for), wrong results (how many, and the first with its rank, index,
//	   expected and actual value), a --procs child that failed or hung
//	2  bad flags (the message names the flag), or a --backend that cannot run
//	   with the ranks placed as asked (NCCL on virtual ranks)
package main
