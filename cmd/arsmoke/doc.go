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
// table and a verdict, and exits 0 only if nothing was wrong.
//
// # Flags
//
// Flags take one dash or two: -n 20 and --n 20 are the same.
//
//	-b size       smallest message in bytes (default 1K). Sizes take the
//	              suffixes K, M, G, optionally with B or iB, all powers of
//	              1024 as in all_reduce_perf: 4096, 64K, 8M, 64MiB. Every
//	              size must be a multiple of 16 bytes (the kernels move
//	              16-byte vectors), and so of every element size.
//	-e size       largest message in bytes (default 8M); at least -b.
//	-f factor     multiply the size by factor at each step (default 2, at
//	              least 2). The sweep is -b, -b*f, ... up to -e.
//	-d type       element type: bf16 (default), f16 or f32.
//	-a algorithm  auto (default: the communicator's choice), oneshot,
//	              twoshot, push, or all: one table per algorithm.
//	-g            capture the all-reduces in a CUDA graph and replay it
//	              (default: eager calls).
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
//	              Unix socket. Ranks go to GPUs as with --ranks. Rank 0
//	              prints the results; the others' messages come prefixed
//	              with their rank. If one fails, the others are stopped; once
//	              one has finished, the others get --timeout to follow.
//	--timeout d   the longest wait for a peer (bootstrap, and the kernels'
//	              watchdog) before the run fails naming the rank and the peer
//	              (default 10s).
//	--json        print the results as one JSON document instead of the
//	              table (see below); nothing else goes to stdout.
//	--topo        print the GPUs and their links, and exit.
//
// Which GPUs are visible follows CUDA_VISIBLE_DEVICES. GOCCL_LIBCUDA is the
// path of libcuda.so.1 when the driver is not where the dynamic loader looks.
//
// # Output
//
// The table has the layout of all_reduce_perf. Header lines give the sweep,
// the goccl version, the driver, the host, how ranks are placed, and each
// rank's process, device, PCI bus id and name. Then, for each algorithm, one
// row per size:
//
//	size (B), count (elements), type, redop (sum), root (-1: none),
//	then out of place and in place: time (us), algbw (GB/s), busbw (GB/s), #wrong
//
// time is the mean of one all-reduce over -n iterations on the slowest rank;
// algbw is size / time; busbw = algbw * 2(n-1)/n for n ranks, comparable with
// the links' bandwidth whatever n; #wrong counts the elements, over all ranks,
// that differ from the reference or between ranks (N/A with -c 0). Each table
// ends with
//
//	# Out of bounds values : 0 OK        (or: N FAILED)
//	# Avg bus bandwidth    : 123.4567    (GB/s, mean over the rows, both placements)
//
// and the last line is the verdict, for example
//
//	arsmoke: PASS — 8 ranks, bf16, 14 sizes, 0 wrong
//	arsmoke: FAIL — 8 ranks, bf16, 14 sizes, 3 wrong; first: auto, 4096 B in-place, rank 3, element 17: expected 0x3f80 (1), got 0x0000 (0)
//	arsmoke: DONE — 8 ranks, bf16, 14 sizes, results not checked (-c 0)
//
// With --json, stdout is one JSON object with the same content: the header
// fields (goccl, host, driver, mode, ranks, dtype, min_bytes, max_bytes,
// factor, sizes, warmup, iters, graph, check, devices), blocks (algo, rows,
// wrong, avg_busbw_gbps; each row has bytes, count, type, redop, root,
// out_of_place and in_place with time_us, algbw_gbps, busbw_gbps, wrong),
// first_mismatch when something was wrong, error when the run stopped early,
// and verdict (pass, line). A failure also prints the verdict line on stderr.
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
//	2  bad flags; the message names the flag
package main
