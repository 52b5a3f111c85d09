package collective

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// StartupProfile says where one rank's New (or its part of NewGroup) spent its time: each
// step with its start and duration, and how each kernel the communicator needed was found.
// Comm.Startup returns it; recording it costs a few clock reads per New.
type StartupProfile struct {
	// Total is the time from the call of New (NewGroup) until this rank was ready.
	Total time.Duration
	// Steps lists the steps in the order they began. Steps of one rank may overlap (the
	// launch probe runs beside the kernels). Steps that did not run are absent.
	Steps []StartupStep
	// Kernels lists the plain kernels that New needed, in load order (the fused and RMSNorm
	// kernels load on their first call and are not listed).
	Kernels []KernelLoad
	// JITWorkers is how many kernels the process JIT-compiles at once.
	JITWorkers int
}

// StartupStep is one step of New.
type StartupStep struct {
	// Phase is the step.
	Phase StartupPhase
	// Start is when the step began, from the start of New (NewGroup).
	Start time.Duration
	// Duration is how long the step took, waits for other ranks included.
	Duration time.Duration
}

// StartupPhase names a step of New.
type StartupPhase string

// The steps of New, in the order they run. Steps that talk to the other ranks (the
// exchanges and the final barrier) include the wait for the slowest of them.
const (
	// StartupGroupCheck is NewGroup's check of its distinct GPUs (topology, P2P probe) and
	// the creation of its in-process bootstrap, before its ranks start.
	StartupGroupCheck StartupPhase = "group check"
	// StartupDriver loads libcuda and calls cuInit (the first New of the process), and
	// looks up the device.
	StartupDriver StartupPhase = "driver"
	// StartupContext retains the device's primary context, which creates it on the first
	// retain in the process.
	StartupContext StartupPhase = "context"
	// StartupDevice reads the device's compute capability, SM count and UUID.
	StartupDevice StartupPhase = "device"
	// StartupExchangeFacts is the first bootstrap round: every rank's facts and options.
	StartupExchangeFacts StartupPhase = "exchange facts"
	// StartupTopology is rank 0's check of the GPUs of ranks in several processes.
	StartupTopology StartupPhase = "topology"
	// StartupKernels generates the PTX of the kernels and JIT-compiles them, or waits for
	// the rank of this process that does, or finds them loaded (KernelLoad says which).
	StartupKernels StartupPhase = "kernels"
	// StartupProbe is driver.ProbeStreamLaunch, once per process, beside the kernels.
	StartupProbe StartupPhase = "launch probe"
	// StartupArena allocates the memory the rank shares with its peers.
	StartupArena StartupPhase = "arena"
	// StartupTables allocates the kernels' error record and the registration table.
	StartupTables StartupPhase = "tables"
	// StartupExport makes the arena's descriptor for the peers (IPC handle or VMM export).
	StartupExport StartupPhase = "export"
	// StartupExchangeArenas is the second bootstrap round: the arenas' descriptors and
	// block caps, and with VMM their file descriptors.
	StartupExchangeArenas StartupPhase = "exchange arenas"
	// StartupMapPeers opens and maps every peer's arena (IPC open or VMM import), with
	// peer access to other devices of this process.
	StartupMapPeers StartupPhase = "map peers"
	// StartupNCCL sets up the NCCL communicator, or finds that there is none.
	StartupNCCL StartupPhase = "nccl"
	// StartupBarrier is the final barrier: every rank is ready.
	StartupBarrier StartupPhase = "final barrier"
)

// KernelLoad is how one kernel was found at New.
type KernelLoad struct {
	// Name is the kernel's entry name, e.g. goccl_oneshot_bf16_w8_gpu.
	Name string
	// Source says whether this New compiled it, waited for another, or found it loaded.
	Source KernelSource
	// PTXBytes is the size of the PTX text.
	PTXBytes int
	// Generate is the time to generate the PTX from the templates; Load the time of
	// cuModuleLoadDataEx (the driver's JIT, or its on-disk cache, and the upload); Setup the
	// time to look the kernel up and ask for its occupancy. Where Source is not
	// KernelCompiled they are the times of the load this New waited for or found.
	Generate, Load, Setup time.Duration
	// BlocksPerSM is the kernel's occupancy at 512 threads per block.
	BlocksPerSM int
}

// KernelSource says how New came by a kernel.
type KernelSource int

const (
	// KernelCompiled: this New loaded it (cuModuleLoadDataEx).
	KernelCompiled KernelSource = iota
	// KernelShared: another New of this process (another rank of the group) was loading it,
	// and this one waited for that.
	KernelShared
	// KernelCached: it was already loaded in this process (kernels stay loaded: see
	// UnloadKernels).
	KernelCached
)

// String returns "compiled", "shared" or "cached".
func (s KernelSource) String() string {
	switch s {
	case KernelCompiled:
		return "compiled"
	case KernelShared:
		return "shared"
	case KernelCached:
		return "cached"
	}
	return fmt.Sprintf("KernelSource(%d)", int(s))
}

// Phase returns the time spent in the steps of phase ph (0 if none ran).
func (p StartupProfile) Phase(ph StartupPhase) time.Duration {
	var d time.Duration
	for _, s := range p.Steps {
		if s.Phase == ph {
			d += s.Duration
		}
	}
	return d
}

// Count returns how many of the kernels came from src.
func (p StartupProfile) Count(src KernelSource) int {
	n := 0
	for _, k := range p.Kernels {
		if k.Source == src {
			n++
		}
	}
	return n
}

// String renders the profile as a table: the steps, then the kernels.
func (p StartupProfile) String() string {
	var b strings.Builder
	ms := func(d time.Duration) string { return fmt.Sprintf("%9.2f ms", float64(d)/float64(time.Millisecond)) }
	fmt.Fprintf(&b, "total %s\n", strings.TrimSpace(ms(p.Total)))
	fmt.Fprintf(&b, "  %-16s %12s %12s\n", "step", "start", "took")
	for _, s := range p.Steps {
		fmt.Fprintf(&b, "  %-16s %12s %12s\n", s.Phase, ms(s.Start), ms(s.Duration))
	}
	fmt.Fprintf(&b, "kernels: %d compiled, %d shared, %d cached; %d JIT workers\n",
		p.Count(KernelCompiled), p.Count(KernelShared), p.Count(KernelCached), p.JITWorkers)
	if len(p.Kernels) > 0 {
		fmt.Fprintf(&b, "  %-28s %-8s %8s %12s %12s %12s %s\n", "kernel", "source", "PTX", "generate", "load", "setup", "blocks/SM")
	}
	for _, k := range p.Kernels {
		fmt.Fprintf(&b, "  %-28s %-8s %7dB %12s %12s %12s %d\n", k.Name, k.Source, k.PTXBytes, ms(k.Generate), ms(k.Load), ms(k.Setup), k.BlocksPerSM)
	}
	return b.String()
}

// Startup returns where this rank's New spent its time. The profile is fixed once New
// returns; the result is a copy.
func (c *Comm) Startup() StartupProfile {
	p := c.startup
	p.Steps = slices.Clone(p.Steps)
	p.Kernels = slices.Clone(p.Kernels)
	return p
}

// startupStart is when a New began and, for NewGroup, the steps it took before starting its
// ranks.
type startupStart struct {
	at    time.Time
	steps []StartupStep
}

// step records a step of New that began at from and ends now, and returns now (the start of
// the next step).
func (c *Comm) step(ph StartupPhase, from time.Time) time.Time {
	now := time.Now()
	c.startup.Steps = append(c.startup.Steps, StartupStep{Phase: ph, Start: from.Sub(c.startupAt), Duration: now.Sub(from)})
	return now
}
