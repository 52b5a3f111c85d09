package collective

import (
	"context"
	"fmt"

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
func (c *Comm) checkPeerTopology(ctx context.Context, infos []rankInfo) error {
	// From the facts, not c.allLocal: New runs this check before the kernels' round sets it.
	oneProcess := true
	for _, ri := range infos {
		oneProcess = oneProcess && ri.PID == infos[c.rank].PID
	}
	if oneProcess || ranksPerGPU(infos) == c.size {
		return nil
	}
	var verdict error
	if c.rank == 0 {
		verdict = c.judgeTopology(ctx, infos)
	}
	blobs, err := c.boot.AllGather(ctx, withStatus(nil, verdict))
	if err != nil {
		return fmt.Errorf("exchange the topology verdict: %w", err)
	}
	if _, refused := splitStatus(blobs); refused != nil {
		if verdict != nil {
			return verdict
		}
		return fmt.Errorf("%w: %v", ErrNotEligible, refused)
	}
	return nil
}

// judgeTopology is rank 0's check of every rank's GPU.
func (c *Comm) judgeTopology(ctx context.Context, infos []rankInfo) error {
	t, err := topology.Discover(ctx, topology.Options{CheckP2P: true})
	if err != nil {
		return fmt.Errorf("discover the GPUs' links: %w", err)
	}
	byUUID := map[string]int{}
	for _, g := range t.GPUs {
		byUUID[g.UUID] = g.Ordinal
	}
	ordinals := make([]int, len(infos))
	for r, ri := range infos {
		o, ok := byUUID[formatUUID(ri.UUID)]
		if !ok {
			return nil
		}
		ordinals[r] = o
	}
	return t.CheckCustomAllReduce(ordinals, topology.PolicyOptions{AllowNonNVLink: c.opts.AllowNonNVLink})
}

// formatUUID writes a GPU UUID as NVML and nvidia-smi do: "GPU-" and the 8-4-4-4-12 form.
func formatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
