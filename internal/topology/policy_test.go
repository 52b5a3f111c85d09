package topology

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// meshTopology is n GPUs, every pair with peer access, a passing check and nvlinks NVLinks
// (0: PCIe, level SYS).
func meshTopology(n, nvlinks int) *Topology {
	t := &Topology{HasNVML: true, PeerCheck: CheckRunNow}
	for i := range n {
		t.GPUs = append(t.GPUs, GPU{Ordinal: i, BusID: fmt.Sprintf("0000:%02x:00.0", 0x10+i), NVMLIndex: i})
		row := make([]Link, n)
		for j := range row {
			row[j] = Link{CanAccessPeer: true, Check: Check{Ran: true}}
			if i != j {
				row[j].NVML = &NVMLLink{NVLinks: nvlinks, Level: LevelSystem}
			}
		}
		t.Links = append(t.Links, row)
	}
	return t
}

// requirePolicyError checks err is a *PolicyError about from -> to whose reason says why.
func requirePolicyError(t *testing.T, err error, from, to int, why string) {
	t.Helper()
	require.ErrorIs(t, err, ErrNotEligible)
	var pe *PolicyError
	require.True(t, errors.As(err, &pe), err)
	assert.Equal(t, from, pe.From)
	assert.Equal(t, to, pe.To)
	assert.Contains(t, pe.Reason, why)
	assert.Contains(t, err.Error(), fmt.Sprintf("GPU %d (0000:%02x:00.0) and GPU %d (0000:%02x:00.0)", from, 0x10+from, to, 0x10+to))
}

func TestPolicyNVLinkMesh(t *testing.T) {
	topo := meshTopology(8, 18)
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 1, 2, 3, 4, 5, 6, 7}, PolicyOptions{}))
	assert.NoError(t, topo.CheckCustomAllReduce([]int{7, 2, 5}, PolicyOptions{}), "any subset, any rank order")

	topo.Links[5][2].NVML.NVLinks = 0
	topo.Links[2][5].NVML.NVLinks = 0
	requirePolicyError(t, topo.CheckCustomAllReduce([]int{0, 1, 2, 3, 4, 5, 6, 7}, PolicyOptions{}), 2, 5, "no NVLink (path SYS)")
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 1, 2, 3, 4, 5, 6, 7}, PolicyOptions{AllowNonNVLink: true}))
	assert.NoError(t, topo.CheckCustomAllReduce([]int{2, 5}, PolicyOptions{}), "two GPUs need no NVLink")
	assert.NoError(t, topo.CheckCustomAllReduce([]int{2, 2, 5, 5}, PolicyOptions{}), "two GPUs, virtual ranks on each")
}

func TestPolicyPCIe(t *testing.T) {
	topo := meshTopology(4, 0)
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 3}, PolicyOptions{}))
	requirePolicyError(t, topo.CheckCustomAllReduce([]int{0, 1, 2}, PolicyOptions{}), 0, 1, "3 GPUs need a full NVLink mesh")
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 1, 2}, PolicyOptions{AllowNonNVLink: true}))

	topo.HasNVML = false
	for i := range topo.Links {
		for j := range topo.Links[i] {
			topo.Links[i][j].NVML = nil
		}
	}
	requirePolicyError(t, topo.CheckCustomAllReduce([]int{0, 1, 2, 3}, PolicyOptions{}), 0, 1, "NVLink unknown without NVML")
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 1, 2, 3}, PolicyOptions{AllowNonNVLink: true}))
}

func TestPolicyPeerAccess(t *testing.T) {
	topo := meshTopology(4, 12)
	topo.Links[3][1].CanAccessPeer = false
	requirePolicyError(t, topo.CheckCustomAllReduce([]int{1, 3}, PolicyOptions{}), 3, 1, "CUDA reports no peer access")
	requirePolicyError(t, topo.CheckCustomAllReduce([]int{0, 1, 2, 3}, PolicyOptions{AllowNonNVLink: true}), 3, 1, "no peer access")

	topo = meshTopology(4, 12)
	topo.Links[2][0].Check = Check{Ran: true, Err: "copy kernel did not finish within 10s"}
	requirePolicyError(t, topo.CheckCustomAllReduce([]int{0, 2}, PolicyOptions{}), 2, 0, "peer check failed: copy kernel did not finish within 10s")

	topo = meshTopology(4, 12)
	topo.Links[1][1].Check = Check{Ran: true, Err: "data corrupted"}
	requirePolicyError(t, topo.CheckCustomAllReduce([]int{0, 1}, PolicyOptions{}), 1, 1, "peer check failed: data corrupted")

	topo = meshTopology(4, 12)
	topo.PeerCheck = CheckNotRun
	topo.Links[0][3].Check = Check{}
	requirePolicyError(t, topo.CheckCustomAllReduce([]int{0, 3}, PolicyOptions{}), 0, 3, "not verified (run Discover with CheckP2P)")
}

func TestPolicyVirtualRanks(t *testing.T) {
	// One GPU repeated needs nothing, not even a peer check.
	topo := meshTopology(2, 0)
	topo.HasNVML = false
	topo.Links[0][0] = Link{}
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 0, 0, 0, 0, 0, 0, 0}, PolicyOptions{}))
	assert.NoError(t, topo.CheckCustomAllReduce([]int{1}, PolicyOptions{}))
}

func TestPolicyBadOrdinals(t *testing.T) {
	topo := meshTopology(2, 18)
	err := topo.CheckCustomAllReduce([]int{0, 2}, PolicyOptions{})
	require.ErrorContains(t, err, "rank 1 is on GPU 2, but only GPUs 0..1 are visible")
	assert.NotErrorIs(t, err, ErrNotEligible, "a caller bug, not a topology verdict")
	require.ErrorContains(t, topo.CheckCustomAllReduce(nil, PolicyOptions{}), "no ranks")
	require.Error(t, topo.CheckCustomAllReduce([]int{-1}, PolicyOptions{}))
}
