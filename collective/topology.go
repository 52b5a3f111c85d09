package collective

import (
	"context"
	"errors"
	"fmt"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/internal/topology"
)

// checkTopology applies the custom all-reduce policy to the distinct GPUs of devices (CUDA
// ordinals of this process). Virtual ranks on one GPU need no check.
func checkTopology(ctx context.Context, devices []int, opts Options) error {
	distinct := map[int]bool{}
	for _, d := range devices {
		distinct[d] = true
	}
	if len(distinct) < 2 {
		return nil
	}
	t, err := topology.Discover(ctx, topology.Options{CheckP2P: true})
	if err != nil {
		return fmt.Errorf("collective: discover the GPUs' links: %w", err)
	}
	if err := t.CheckCustomAllReduce(devices, topology.PolicyOptions{AllowNonNVLink: opts.AllowNonNVLink}); err != nil {
		return fmt.Errorf("collective: %w", err)
	}
	return nil
}

// checkPeerTopology applies the same policy to a communicator whose ranks live in several
// processes (New): rank 0 maps every rank's GPU, by UUID, to the GPUs it can see and checks
// them; its verdict reaches every rank, so that all of them fail alike. A communicator whose
// ranks all live in this process was checked by NewGroup already. When rank 0 cannot see
// every rank's GPU (each process limited to its own by CUDA_VISIBLE_DEVICES), the peer check
// cannot run from one process, and mapping the peers' memory is the test.
//
// It also returns whether every rank's GPU performs atomics natively on every other rank's
// memory (peerAtomics), which lets the system-scope barriers count arrivals: true when every
// rank is on one GPU, asked of the driver when the ranks share this process, and rank 0's
// answer, sent with its verdict, otherwise (false when rank 0 cannot see every rank's GPU).
func (c *Comm) checkPeerTopology(ctx context.Context, infos []rankInfo) (atomics bool, err error) {
	// From the facts, not c.allLocal: New runs this check before the kernels' round sets it.
	oneProcess := true
	for _, ri := range infos {
		oneProcess = oneProcess && ri.Process == infos[c.rank].Process
	}
	if ranksPerGPU(infos) == c.size {
		return true, nil
	}
	if oneProcess {
		ordinals := make([]int, len(infos))
		for r, ri := range infos {
			ordinals[r] = int(ri.Device)
		}
		return peerAtomics(ordinals, driverPeerAtomics), nil
	}
	// Rank 0's verdict: [atomics, outcome, reason...]. The outcome tells the ranks apart from
	// a refusal: GPUs that are not eligible (every rank may hand the work to NCCL) against a
	// check that failed (every rank fails New, as rank 0 does).
	var verdict error
	payload := []byte{0, verdictEligible}
	if c.rank == 0 {
		judge := c.judgeTopology
		if c.judgeOverride != nil {
			judge = c.judgeOverride
		}
		var atomics bool
		atomics, verdict = judge(ctx, infos)
		if atomics {
			payload[0] = 1
		}
		if verdict != nil {
			payload[1] = verdictFailed
			if errors.Is(verdict, ErrNotEligible) {
				payload[1] = verdictNotEligible
			}
			payload = append(payload, truncate(verdict.Error(), maxRefusalBytes)...)
		}
	}
	blobs, err := c.boot.AllGather(ctx, withStatus(payload, nil))
	if err != nil {
		return false, fmt.Errorf("exchange the topology verdict: %w", err)
	}
	payloads, err := splitStatus(blobs)
	if err != nil {
		return false, fmt.Errorf("exchange the topology verdict: %w", err)
	}
	if verdict != nil {
		return false, verdict
	}
	p := payloads[0]
	if len(p) < 2 {
		return false, fmt.Errorf("exchange the topology verdict: rank 0 sent %d bytes (do all ranks run the same goccl version?)", len(p))
	}
	switch p[1] {
	case verdictEligible:
		return p[0] == 1, nil
	case verdictNotEligible:
		return false, fmt.Errorf("%w: rank 0 judged: %s", ErrNotEligible, p[2:])
	case verdictFailed:
		return false, fmt.Errorf("rank 0 could not check the ranks' GPUs: %s", p[2:])
	}
	return false, fmt.Errorf("exchange the topology verdict: unknown outcome %d from rank 0 (do all ranks run the same goccl version?)", p[1])
}

// The outcomes of rank 0's check of the ranks' GPUs, as checkPeerTopology sends them.
const (
	verdictEligible    = 0
	verdictNotEligible = 1
	verdictFailed      = 2
)

// judgeTopology is rank 0's check of every rank's GPU, and whether they all have native
// atomics on each other's memory (false when rank 0 cannot see every rank's GPU).
func (c *Comm) judgeTopology(ctx context.Context, infos []rankInfo) (atomics bool, err error) {
	t, err := topology.Discover(ctx, topology.Options{CheckP2P: true})
	if err != nil {
		return false, fmt.Errorf("discover the GPUs' links: %w", err)
	}
	byUUID := map[string]int{}
	for _, g := range t.GPUs {
		byUUID[g.UUID] = g.Ordinal
	}
	ordinals := make([]int, len(infos))
	for r, ri := range infos {
		o, ok := byUUID[formatUUID(ri.UUID)]
		if !ok {
			return false, nil
		}
		ordinals[r] = o
	}
	if err := t.CheckCustomAllReduce(ordinals, topology.PolicyOptions{AllowNonNVLink: c.opts.AllowNonNVLink}); err != nil {
		return false, err
	}
	return peerAtomics(ordinals, driverPeerAtomics), nil
}

// peerAtomics says whether the GPU of every ordinal performs atomics natively on the memory of
// every other (ask: driver.PeerNativeAtomics by CUDA ordinal; a GPU on itself is native). A
// question the driver cannot answer counts as no: the barriers that store round numbers are
// correct everywhere.
func peerAtomics(ordinals []int, ask func(from, to int) (bool, error)) bool {
	for _, a := range ordinals {
		for _, b := range ordinals {
			if a == b {
				continue
			}
			if native, err := ask(a, b); err != nil || !native {
				return false
			}
		}
	}
	return true
}

// driverPeerAtomics is driver.PeerNativeAtomics by CUDA ordinal.
func driverPeerAtomics(from, to int) (bool, error) {
	a, err := driver.GetDevice(from)
	if err != nil {
		return false, err
	}
	b, err := driver.GetDevice(to)
	if err != nil {
		return false, err
	}
	return driver.PeerNativeAtomics(a, b)
}

// formatUUID writes a GPU UUID as NVML and nvidia-smi do: "GPU-" and the 8-4-4-4-12 form.
func formatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
