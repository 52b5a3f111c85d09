//go:build goccl_nvml_cgo && cgo

package topology

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nvmlBuild names the NVML binding this build uses, for the GPU test's output.
const nvmlBuild = "go-nvml (cgo, goccl_nvml_cgo tag)"

// hgxMock is go-nvml's DGX H100 mock server wired like the real board: each GPU's 18
// NVLinks go to the four NVSwitches, all pairs peer-capable, GPUs 0-3 and 4-7 on two NUMA
// nodes. noNVLink names NVML indices whose pair has no NVLink between them (the P2P NVLink
// status says so, as on a partitioned fabric). It returns the server and a CUDA view of the
// same GPUs in CUDA order cudaOrder (NVML indices).
func hgxMock(t *testing.T, noNVLink [2]int, cudaOrder ...int) (*server.Server, *fakeCUDA) {
	t.Helper()
	s := dgxh100.New()
	require.Len(t, s.Devices, 8)
	index := func(d nvml.Device) int { return d.(*server.Device).Index }
	for _, nd := range s.Devices {
		d := nd.(*server.Device)
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return pciInfo(fmt.Sprintf("%08x:%02x:00.0", 0, 0x18+d.Index*0x10)), nvml.SUCCESS
		}
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			return pciInfo(fmt.Sprintf("00000000:%02x:00.0", 0xe0+link%4)), nvml.SUCCESS
		}
		d.GetP2PStatusFunc = func(peer nvml.Device, c nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			pair := [2]int{min(d.Index, index(peer)), max(d.Index, index(peer))}
			if c == nvml.P2P_CAPS_INDEX_NVLINK && pair == noNVLink {
				return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
			}
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(peer nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			if d.Index/4 == index(peer)/4 {
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	cu := &fakeCUDA{version: 12040}
	for _, k := range cudaOrder {
		d := s.Devices[k].(*server.Device)
		cu.gpus = append(cu.gpus, h100(d.UUID, fmt.Sprintf("0000:%02x:00.0", 0x18+k*0x10)))
	}
	return s, cu
}

// pciInfo is an nvml.PciInfo holding only the bus id, as NVML's C string.
func pciInfo(bus string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := range len(bus) {
		p.BusId[i] = int8(bus[i])
	}
	return p
}

func TestMockHGXFullMeshAllowsCustomAllReduce(t *testing.T) {
	s, cu := hgxMock(t, [2]int{-1, -1}, 0, 1, 2, 3, 4, 5, 6, 7)
	topo, err := Discover(context.Background(), Options{NVML: goNVML{lib: s}, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()})
	require.NoError(t, err)
	require.True(t, topo.HasNVML, topo.Notes)
	assert.Equal(t, "550.54.15", topo.NVMLDriver)
	for i := range 8 {
		assert.Equal(t, i, topo.GPUs[i].NVMLIndex)
		for j := range 8 {
			if i == j {
				continue
			}
			n := topo.Links[i][j].NVML
			require.NotNil(t, n)
			assert.Equal(t, 18, n.NVLinks, "GPU %d -> %d", i, j)
			assert.Equal(t, P2POK, n.Atomics)
		}
	}
	assert.Equal(t, LevelNode, topo.Links[1][3].NVML.Level)
	assert.Equal(t, LevelSystem, topo.Links[1][4].NVML.Level)
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 1, 2, 3, 4, 5, 6, 7}, PolicyOptions{}))

	var b bytes.Buffer
	require.NoError(t, topo.Render(&b))
	assert.Equal(t, 8*7, strings.Count(b.String(), "NV18"), b.String())
}

func TestMockHGXMissingNVLinkRefusesCustomAllReduce(t *testing.T) {
	// NVML's pair (2, 5), seen by CUDA as GPUs 5 and 2 under CUDA_VISIBLE_DEVICES=7,6,...,0.
	s, cu := hgxMock(t, [2]int{2, 5}, 7, 6, 5, 4, 3, 2, 1, 0)
	topo, err := Discover(context.Background(), Options{NVML: goNVML{lib: s}, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()})
	require.NoError(t, err)
	require.True(t, topo.HasNVML, topo.Notes)
	assert.Equal(t, 0, topo.Links[5][2].NVML.NVLinks)
	assert.Equal(t, P2PNotSupported, topo.Links[5][2].NVML.NVLink)
	assert.Equal(t, 18, topo.Links[5][3].NVML.NVLinks)

	err = topo.CheckCustomAllReduce([]int{0, 1, 2, 3, 4, 5, 6, 7}, PolicyOptions{})
	requireMockPolicyError(t, err, 2, 5)
	assert.ErrorContains(t, err, "no NVLink (path SYS)")
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 1, 2, 3, 4, 5, 6, 7}, PolicyOptions{AllowNonNVLink: true}))
	assert.NoError(t, topo.CheckCustomAllReduce([]int{0, 1, 3, 4}, PolicyOptions{}), "the GPUs that are meshed")
}

// requireMockPolicyError checks err names CUDA GPUs a and b with their bus ids.
func requireMockPolicyError(t *testing.T, err error, a, b int) {
	t.Helper()
	var pe *PolicyError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, [2]int{a, b}, [2]int{pe.From, pe.To})
	assert.Contains(t, err.Error(), fmt.Sprintf("GPU %d (0000:%02x:00.0)", a, 0x18+(7-a)*0x10))
	assert.Contains(t, err.Error(), fmt.Sprintf("GPU %d (0000:%02x:00.0)", b, 0x18+(7-b)*0x10))
}

func TestMockNVMLErrorsAreTyped(t *testing.T) {
	s, cu := hgxMock(t, [2]int{-1, -1}, 0, 1)
	s.Devices[1].(*server.Device).GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) {
		return nvml.PciInfo{}, nvml.ERROR_GPU_IS_LOST
	}
	topo, err := Discover(context.Background(), Options{NVML: goNVML{lib: s}, CUDA: cu})
	require.NoError(t, err)
	assert.False(t, topo.HasNVML)
	require.Len(t, topo.Notes, 1)
	assert.Contains(t, topo.Notes[0], "GPU 1 link 0: nvmlDeviceGetNvLinkRemotePciInfo_v2: NVML_ERROR_GPU_IS_LOST (15)")
}
