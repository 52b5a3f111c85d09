package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/goccl/goccl/dtype"
)

// Limits of the flags.
const (
	minWorld = 2
	maxWorld = 16
)

// algorithms are the algorithms -a all measures, one block each.
var algorithms = []string{"oneshot", "twoshot", "push"}

// The backends of --backend.
const (
	backendGoccl = "goccl" // goccl's kernels, as chosen by -a
	backendNCCL  = "nccl"  // every call through NCCL
	backendBoth  = "both"  // goccl's kernels and NCCL side by side
)

// config is the validated command line.
type config struct {
	minBytes, maxBytes int64
	factor             int64
	dtype              dtype.DType
	algos              []string // with --backend nccl: just "nccl"
	backend            string
	graph              bool
	iters, warmup      int
	check              bool
	ranks              int // 0: every visible GPU, or 8 virtual ranks on a lone GPU
	device             int // -1: not given
	procs              int // 0: one process drives every rank
	timeout            time.Duration
	json               bool
	topo               bool
	fused              *fusedConfig // --fused: the sweep is over row counts of the fused call; nil otherwise
	tune               *tuneConfig  // --tune: measure and write a tuning table; nil otherwise
}

// options holds the flags as typed: the config fields that need no
// conversion, and the others raw, until parseArgs validates them.
type options struct {
	config
	dtypeName  string
	algoName   string
	backend    string
	checkFlag  int
	deviceFlag string
	minSize    byteSize
	maxSize    byteSize
	fused      fusedFlags
	tune       tuneFlags
}

func (o *options) flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("arsmoke", flag.ContinueOnError)
	// run prints errors and usage itself, on the right stream.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	o.minSize, o.maxSize = 1<<10, 8<<20
	fs.Var(&o.minSize, "b", "smallest message `size` in bytes (K, M, G: powers of 1024)")
	fs.Var(&o.maxSize, "e", "largest message `size` in bytes")
	fs.Int64Var(&o.factor, "f", 2, "multiply the size by `factor` from one step to the next")
	fs.StringVar(&o.dtypeName, "d", "bf16", "element `type`: bf16, f16 or f32")
	fs.StringVar(&o.algoName, "a", "auto", "`algorithm`: auto, oneshot, twoshot, push, or all (one block each)")
	fs.StringVar(&o.backend, "backend", backendGoccl, "`engine`: goccl (its kernels), nccl (every call through NCCL), or both side by side")
	fs.BoolVar(&o.graph, "g", false, "capture the all-reduces in a CUDA graph and replay it")
	fs.IntVar(&o.iters, "n", 100, "timed `iterations` per size")
	fs.IntVar(&o.warmup, "w", 10, "untimed warm-up `iterations` per size")
	fs.IntVar(&o.checkFlag, "c", 1, "`0|1`: 1 checks the results, 0 does not")
	fs.IntVar(&o.ranks, "ranks", 0, "run `N` ranks (2..16); with --device, all on that GPU")
	fs.StringVar(&o.deviceFlag, "device", "", "run every rank on GPU `D` (virtual ranks)")
	fs.IntVar(&o.procs, "procs", 0, "run `N` processes of one rank each (2..16), joined by a Unix socket")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "longest wait for a peer before the run fails: a `duration` such as 10s or 2m")
	fs.BoolVar(&o.json, "json", false, "print the results as one JSON document")
	fs.BoolVar(&o.topo, "topo", false, "print the GPUs and their links, and exit")
	o.fused.register(fs)
	o.tune.register(fs)
	return fs
}

// printUsage writes the synopsis and the flags.
func printUsage(w io.Writer) {
	var o options
	fs := o.flagSet()
	fs.SetOutput(w)
	fmt.Fprintln(w, "usage: arsmoke [flags]   (go doc github.com/goccl/goccl/cmd/arsmoke: the manual)")
	fs.PrintDefaults()
}

// parseArgs parses and validates the command line. Every error is a usage
// error and names the flag; -h gives flag.ErrHelp.
func parseArgs(args []string) (config, error) {
	var o options
	fs := o.flagSet()
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q: arsmoke takes flags only", fs.Arg(0))
	}
	c := o.config
	dt, err := dtype.Parse(o.dtypeName)
	if err != nil {
		return config{}, fmt.Errorf("-d: %w", err)
	}
	c.dtype = dt
	c.minBytes, c.maxBytes = int64(o.minSize), int64(o.maxSize)
	for _, s := range []struct {
		name string
		v    int64
	}{{"-b", c.minBytes}, {"-e", c.maxBytes}} {
		if size := int64(dt.Size()); s.v < size || s.v%size != 0 {
			return config{}, fmt.Errorf("%s %v: must be a whole number of %v elements, at least one: a positive multiple of %d bytes",
				s.name, byteSize(s.v), dt, size)
		}
	}
	if c.minBytes > c.maxBytes {
		return config{}, fmt.Errorf("-b %v is larger than -e %v", byteSize(c.minBytes), byteSize(c.maxBytes))
	}
	if c.factor < 2 {
		return config{}, fmt.Errorf("-f %d: must be at least 2", c.factor)
	}
	switch o.algoName {
	case "all":
		c.algos = algorithms
	case "auto", "oneshot", "twoshot", "push":
		c.algos = []string{o.algoName}
	default:
		return config{}, fmt.Errorf("-a %q: unknown algorithm: use auto, oneshot, twoshot, push or all", o.algoName)
	}
	switch c.backend = o.backend; c.backend {
	case backendGoccl, backendBoth:
	case backendNCCL:
		if o.algoName != "auto" {
			if o.fused.on {
				// --fused refuses --backend both: two runs compare them.
				return config{}, fmt.Errorf("-a %s picks goccl's kernels, but --backend nccl runs every all-reduce through NCCL: drop -a, or run -a %s with --backend goccl to compare them", o.algoName, o.algoName)
			}
			return config{}, fmt.Errorf("-a %s picks goccl's kernels, but --backend nccl runs every call through NCCL: drop -a, or use --backend both to compare them with NCCL", o.algoName)
		}
		c.algos = []string{backendNCCL}
	default:
		return config{}, fmt.Errorf("--backend %q: unknown backend: use goccl, nccl or both", o.backend)
	}
	if c.iters < 1 {
		return config{}, fmt.Errorf("-n %d: must be at least 1", c.iters)
	}
	if c.warmup < 0 {
		return config{}, fmt.Errorf("-w %d: must not be negative", c.warmup)
	}
	switch o.checkFlag {
	case 0, 1:
		c.check = o.checkFlag == 1
	default:
		return config{}, fmt.Errorf("-c %d: use 1 to check the results or 0 not to", o.checkFlag)
	}
	// A flag given with its "not given" value (--ranks 0, --device "") is a mistake, not a
	// request for the default.
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if (given["ranks"] || c.ranks != 0) && (c.ranks < minWorld || c.ranks > maxWorld) {
		return config{}, fmt.Errorf("--ranks %d: must be between %d and %d", c.ranks, minWorld, maxWorld)
	}
	c.device = -1
	if given["device"] {
		d, err := strconv.Atoi(o.deviceFlag)
		if err != nil || d < 0 {
			return config{}, fmt.Errorf("--device %q: want a GPU index, 0 or more", o.deviceFlag)
		}
		c.device = d
	}
	if (given["procs"] || c.procs != 0) && (c.procs < minWorld || c.procs > maxWorld) {
		return config{}, fmt.Errorf("--procs %d: must be between %d and %d", c.procs, minWorld, maxWorld)
	}
	if c.procs != 0 && c.ranks != 0 {
		return config{}, fmt.Errorf("--ranks and --procs exclude each other: --procs N runs N ranks, one per process")
	}
	if c.timeout <= 0 {
		return config{}, fmt.Errorf("--timeout %v: must be positive", c.timeout)
	}
	if c.topo && c.json {
		return config{}, fmt.Errorf("--topo prints text only: drop --json")
	}
	if err := o.fused.parse(fs, &c, o.algoName); err != nil {
		return config{}, err
	}
	if err := o.tune.parse(fs, &c, o.algoName); err != nil {
		return config{}, err
	}
	return c, nil
}

// sizes lists the message sizes of the sweep: -b, then times -f up to -e; with --fused, each
// rank's bytes at each row count.
func (c config) sizes() []int64 {
	if c.fused != nil {
		return c.fused.sizes(c.dtype)
	}
	var s []int64
	for b := c.minBytes; b <= c.maxBytes; b *= c.factor {
		s = append(s, b)
		if b > c.maxBytes/c.factor {
			break // the next step would pass -e, or overflow
		}
	}
	return s
}

// byteSize is a flag value in bytes that accepts the suffixes of
// all_reduce_perf: K, M and G, optionally followed by B or iB, all powers of
// 1024.
type byteSize int64

func (b *byteSize) Set(s string) error {
	t := strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B")
	shift := 0
	for _, u := range []struct {
		suffix string
		shift  int
	}{{"KI", 10}, {"MI", 20}, {"GI", 30}, {"K", 10}, {"M", 20}, {"G", 30}} {
		if strings.HasSuffix(t, u.suffix) {
			t, shift = strings.TrimSuffix(t, u.suffix), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("not a size: use bytes, optionally with K, M or G (e.g. 4096, 64K, 8MiB)")
	}
	if n > (1<<62)>>shift {
		return fmt.Errorf("%s is more bytes than arsmoke can count", s)
	}
	*b = byteSize(n << shift)
	return nil
}

// String gives the size with the largest suffix that divides it exactly.
func (b byteSize) String() string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"G", 30}, {"M", 20}, {"K", 10}} {
		if b != 0 && b%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", b>>u.shift, u.suffix)
		}
	}
	return strconv.FormatInt(int64(b), 10)
}
