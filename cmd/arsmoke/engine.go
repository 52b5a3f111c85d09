package main

import (
	"context"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/dtype"
)

// engine runs all-reduces on GPUs for arsmoke. It is the seam between the
// command (flags, sweep, tables, processes) and collective/: everything on
// this side is tested on CPU with a fake engine; gpu.go holds the real one.
//
// An engine drives every rank of engineConfig.Devices; its methods are called
// from one goroutine.
type engine interface {
	// Describe reports the devices of the ranks and the driver version, for
	// the header of the table. It is called once, after creation.
	Describe() Header
	// Run measures one case on every rank this process drives and returns
	// when all of them are done. An error (a watchdog timeout naming the rank
	// and peer, a failed launch) ends the sweep; wrong values are not an
	// error but counted in the Measurement.
	Run(ctx context.Context, c Case) (Measurement, error)
	// Close releases the communicator(s) and every buffer.
	Close() error
}

// engineConfig is what newEngine needs to build its communicator(s).
type engineConfig struct {
	// Devices holds the CUDA device (index among the visible ones) of each
	// rank this process drives, in rank order. A repeated device means virtual
	// ranks on one GPU (collective.NewGroup). In a --procs child it holds
	// one entry, the device of Proc.Rank.
	Devices []int
	// Proc is set in a --procs child: join the others through the
	// Unix-socket bootstrap. Nil when one process drives every rank.
	Proc *procInfo
	// MaxBytes is the largest message of the sweep: every rank's input and
	// output buffers hold it.
	MaxBytes int64
	// Goccl is the communicator that runs goccl's kernels (Case.Backend
	// "goccl"); nil with --backend nccl.
	Goccl *gocclSpec
	// NCCL asks for a second communicator, created after the first, that
	// runs every call through NCCL (Options.NCCL NCCLAlways; Case.Backend
	// "nccl"): --backend nccl or both. In a --procs child it joins the
	// others through a socket of its own (procInfo.socket).
	NCCL bool
	// Timeout bounds every wait on a peer: the bootstrap and the kernels'
	// watchdog (--timeout).
	Timeout time.Duration
}

// gocclSpec is what differs between the goccl communicators of arsmoke's
// runs (see planEngine).
type gocclSpec struct {
	// MaxBytes and PushMaxBytes are the communicator's Options: multiples
	// of 16; PushMaxBytes 0 leaves the library's default.
	MaxBytes, PushMaxBytes int64
	// NCCL is the communicator's Options.NCCL: NCCLAuto lets NCCL take the
	// calls past MaxBytes where it can be initialised, NCCLOff keeps every
	// call on the kernels.
	NCCL collective.NCCLMode
}

// procInfo tells a --procs child who it is and where to meet the others.
type procInfo struct {
	// Rank is this process's rank, 0..World-1.
	Rank int
	// World is the number of processes (--procs).
	World int
	// Socket is the path of the bootstrap's Unix socket, in a folder the
	// parent made for this run and removes afterwards; the socket file itself
	// does not exist yet when the children start.
	Socket string
	// Parent is the --procs parent's process id (0: unknown), which the child watches.
	Parent int
}

// Header describes where the all-reduces run.
type Header struct {
	// Host is the machine's name.
	Host string
	// Driver is the CUDA driver version, e.g. "12.8".
	Driver string
	// Devices has one entry per rank, in rank order. A --procs child may only
	// know its own.
	Devices []RankDevice
	// NCCL is the version of libnccl when a communicator of the run has
	// NCCL, e.g. "2.21.5"; "" otherwise.
	NCCL string
}

// RankDevice is the GPU of one rank.
type RankDevice struct {
	Rank   int    `json:"rank"`
	Pid    int    `json:"pid"`
	Device int    `json:"device"`
	Name   string `json:"name"`
	BusID  string `json:"bus_id"`
}

// Case is one measurement of the sweep: one size, one algorithm, in or out
// of place.
type Case struct {
	// Bytes is the message size of every rank, a whole number of elements.
	Bytes int64
	// DType is the element type.
	DType dtype.DType
	// Backend is the communicator that runs the case: "goccl" or "nccl"
	// (see engineConfig).
	Backend string
	// Algo is, for goccl, "auto" (the communicator's selection) or the
	// algorithm to force: "oneshot", "twoshot" or "push"; for nccl, "nccl".
	Algo string
	// Graph captures the all-reduce in a CUDA graph and replays it instead
	// of calling it eagerly.
	Graph bool
	// InPlace uses one buffer as input and output.
	InPlace bool
	// Iters is the number of timed all-reduces, after Warmup untimed ones.
	Iters, Warmup int
	// Check asks for a correctness check: fresh random inputs, outputs
	// poisoned before the run, every rank's output compared with the
	// reference: bitwise with internal/ref's for goccl's kernels, within
	// ncclTolerance of the exact sum for NCCL (see checkNCCL).
	Check bool
}

// Measurement is the result of one Case.
type Measurement struct {
	// Time is the mean time of one all-reduce over Iters, on the slowest
	// rank.
	Time time.Duration
	// Path is what served the calls: "oneshot", "twoshot", "push" or
	// "nccl" (an Algo "auto" resolved by the communicator).
	Path string
	// Wrong counts the elements, summed over the ranks, that differ from the
	// reference (for NCCL: by more than its tolerance); 0 when Check is off.
	Wrong int64
	// First is the first wrong element; nil when Wrong is 0.
	First *Mismatch
}

// Mismatch locates one wrong element.
type Mismatch struct {
	Rank  int   `json:"rank"`
	Index int64 `json:"index"`
	// Expected and Got are the element's value and bits, formatted by the
	// engine, e.g. "1 (0x3f80)".
	Expected string `json:"expected"`
	Got      string `json:"got"`
}
