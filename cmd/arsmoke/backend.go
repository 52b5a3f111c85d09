package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/goccl/goccl/collective"
)

// kernelMaxBytes is the largest call goccl's kernels take in a --backend goccl -a auto run
// whose communicator can have NCCL: larger ones go to NCCL, as in a service. Smaller than the
// sweep's largest size, it also bounds each rank's staging memory (about 2*MaxBytes).
const kernelMaxBytes = 64 << 20

// The environment a --procs child gets when NCCL must see its processes as separate hosts:
// NCCL reads both when it initialises, and collective takes NCCL_HOSTID as the host of its
// communicators that may use NCCL.
const (
	envNCCLHostID  = "NCCL_HOSTID"
	envNCCLIfname  = "NCCL_SOCKET_IFNAME"
	loopbackIfname = "lo"
)

// usageError is a combination of flags that cannot run on this machine's GPUs: exit 2, like
// a bad flag, with the message saying what to do.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// sharesGPU reports whether two ranks run on one GPU.
func sharesGPU(devices []int) bool {
	seen := map[int]bool{}
	for _, d := range devices {
		if seen[d] {
			return true
		}
		seen[d] = true
	}
	return false
}

// checkBackend refuses the backends that cannot run with the ranks placed on devices: NCCL
// takes one rank per GPU of a host, so virtual ranks (ranks sharing a GPU in one process)
// never get it. Processes can: each one gets its own NCCL host (see hostIDEnv).
func checkBackend(c config, devices []int) error {
	if c.backend == backendGoccl || c.procs != 0 || !sharesGPU(devices) {
		return nil
	}
	return &usageError{msg: fmt.Sprintf("--backend %s: the %d ranks would be virtual ranks sharing GPU %d in one process, and NCCL takes one rank per GPU: add --procs %d to run them as processes (NCCL then sees each as its own host and connects them over sockets), or run one rank per GPU",
		c.backend, len(devices), devices[0], len(devices))}
}

// hostIDEnv says whether the ranks of a --procs run need NCCL_HOSTID: they use NCCL and share
// a GPU, which NCCL accepts only from ranks of different hosts.
func hostIDEnv(c config, devices []int) bool {
	return c.backend != backendGoccl && sharesGPU(devices)
}

// ncclHostEnv makes rank's process a host of its own for NCCL: its own NCCL_HOSTID, and
// NCCL's sockets on the loopback interface unless the user chose one. tag tells this run's
// hosts from other runs'.
func ncclHostEnv(env []string, rank int, tag string) []string {
	out := make([]string, 0, len(env)+2)
	ifname := false
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, envNCCLHostID+"="):
			continue // ours replaces it: every rank needs a distinct one
		case strings.HasPrefix(kv, envNCCLIfname+"="):
			ifname = true
		}
		out = append(out, kv)
	}
	out = append(out, envNCCLHostID+"=arsmoke-"+tag+"-rank"+strconv.Itoa(rank))
	if !ifname {
		out = append(out, envNCCLIfname+"="+loopbackIfname)
	}
	return out
}

// planEngine decides the communicators of a run of c on devices. ncclLoads says whether this
// process can load libnccl.
//
//   - goccl: one communicator with the library's default NCCL mode (NCCLAuto). With -a auto,
//     when it can have NCCL (ranks on distinct GPUs, libnccl loads) and the sweep goes past
//     kernelMaxBytes, the kernels take calls up to kernelMaxBytes and NCCL the larger ones, as
//     in a service. Otherwise (-a forcing a kernel, or no NCCL) the kernels take every size.
//   - nccl: one communicator whose every call goes through NCCL.
//   - both: a kernels-only communicator (NCCLOff: every size on the kernels, so that every row
//     compares them with NCCL, and the ranks of one GPU stay one host for it whatever
//     NCCL_HOSTID says) and an NCCL one.
func planEngine(c config, devices []int, ncclLoads bool) engineConfig {
	sizes := c.sizes()
	largest := roundUp16(sizes[len(sizes)-1])
	cfg := engineConfig{Devices: devices, MaxBytes: largest, Timeout: c.timeout, NCCL: c.backend != backendGoccl}
	if c.backend == backendNCCL {
		return cfg
	}
	spec := &gocclSpec{MaxBytes: largest, NCCL: collective.NCCLAuto}
	if c.backend == backendBoth {
		spec.NCCL = collective.NCCLOff
	}
	if c.backend == backendGoccl && slices.Equal(c.algos, []string{"auto"}) && !sharesGPU(devices) && ncclLoads && largest > kernelMaxBytes {
		spec.MaxBytes = kernelMaxBytes
	}
	if slices.Contains(c.algos, "push") {
		// -a push and -a all measure Push at every size; auto keeps the library's bound.
		spec.PushMaxBytes = spec.MaxBytes
	}
	cfg.Goccl = spec
	return cfg
}

// roundUp16 rounds n up to a multiple of 16: the communicators' MaxBytes, and buffers that
// the kernels read in whole 16-byte vectors.
func roundUp16(n int64) int64 { return (n + 15) &^ 15 }

// socket returns the bootstrap socket of the i-th communicator a --procs child creates
// (0, 1, ...): each needs its own, since rank 0 removes a socket once its ranks have joined.
func (p *procInfo) socket(i int) string {
	if i == 0 {
		return p.Socket
	}
	return p.Socket + "." + strconv.Itoa(i)
}

// runTag names a --procs run in NCCL_HOSTID: the parent's process id, unique while it runs.
func runTag() string { return strconv.Itoa(os.Getpid()) }
