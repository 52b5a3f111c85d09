package topology

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:19:00.0":   "0000:19:00.0", // NVML
		"0000:19:00.0":       "0000:19:00.0", // CUDA
		"0000:1A:00.0":       "0000:1a:00.0",
		"19:00.0":            "0000:19:00.0",
		" 00000001:c1:1f.7 ": "0001:c1:1f.7",
	} {
		got, ok := NormalizeBusID(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "GPU-1234", "0000:19:00", "0000:19:20.0", "0000:19:00.8", "zz:00.0", "0:0:0:0.0"} {
		_, ok := NormalizeBusID(in)
		assert.False(t, ok, in)
	}
}

func TestNVMLError(t *testing.T) {
	e := &NVMLError{Op: "nvmlInit_v2", Code: NVMLErrorDriverNotLoaded, Message: "Driver Not Loaded"}
	assert.Equal(t, "nvmlInit_v2: NVML_ERROR_DRIVER_NOT_LOADED (9): Driver Not Loaded", e.Error())
	assert.NotErrorIs(t, e, ErrNoNVML)
	assert.ErrorIs(t, fmt.Errorf("x: %w", &NVMLError{Code: NVMLErrorLibraryNotFound}), ErrNoNVML)
	assert.Equal(t, "NVML_SUCCESS", NVMLSuccess.String())
	assert.Equal(t, "NVML_ERROR_NOT_SUPPORTED", NVMLErrorNotSupported.String())
	assert.Equal(t, "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED", NVMLReturn(30).String())
	assert.Equal(t, "NVML_ERROR_UNKNOWN", NVMLReturn(999).String())
	assert.Equal(t, "NVML_ERROR_77", NVMLReturn(77).String())
	assert.Equal(t, NVMLErrorNotSupported, nvmlCode(fmt.Errorf("wrapped: %w", &NVMLError{Code: NVMLErrorNotSupported})))
	assert.Equal(t, NVMLSuccess, nvmlCode(errors.New("not NVML")))
}

func TestLevelAndStatusNames(t *testing.T) {
	for v, want := range map[uint32]string{0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS", 7: "?"} {
		assert.Equal(t, want, levelFromNVML(v).String(), v)
	}
	assert.Equal(t, "ok", P2POK.String())
	assert.Equal(t, "disabled by regkey", P2PDisabledByRegkey.String())
	assert.Equal(t, "p2p status 9", P2PStatus(9).String())
}

// pcieBox is four GPUs in NVML's (PCI) order where GPUs 1 and 3 are bridged by two NVLinks
// and the rest talk over PCIe; CUDA_VISIBLE_DEVICES=3,1 shows CUDA only those two, reversed.
func pcieBox() (*fakeNVML, *fakeCUDA) {
	nv := &fakeNVML{driver: "550.54.15"}
	nv.add(fakeUUID(0), "00000000:1A:00.0")
	nv.add(fakeUUID(1), "00000000:3D:00.0", "00000000:9D:00.0", "00000000:9D:00.0", "")
	nv.add(fakeUUID(2), "00000000:60:00.0")
	nv.add(fakeUUID(3), "00000000:9D:00.0", "00000000:3D:00.0", "", "00000000:3D:00.0")
	nv.p2p = func(a, b *fakeDev, c P2PCap) P2PStatus {
		if c == P2PNVLink && len(a.links) == 0 {
			return P2PNotSupported
		}
		return P2POK
	}
	nv.level = func(a, b *fakeDev) Level { return LevelNode }
	cu := &fakeCUDA{version: 12040, gpus: []GPU{
		h100(fakeUUID(3), "0000:9D:00.0"),
		h100(fakeUUID(1), "0000:3d:00.0"),
	}}
	return nv, cu
}

func TestDiscoverMatchesCUDAAndNVMLByBusID(t *testing.T) {
	nv, cu := pcieBox()
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu})
	require.NoError(t, err)

	require.True(t, topo.HasNVML, topo.Notes)
	assert.Empty(t, topo.Notes)
	assert.Equal(t, "550.54.15", topo.NVMLDriver)
	assert.Equal(t, 12040, topo.CUDADriver)
	require.Len(t, topo.GPUs, 2)
	assert.Equal(t, GPU{Ordinal: 0, Name: "NVIDIA H100 80GB HBM3", UUID: fakeUUID(3), BusID: "0000:9d:00.0",
		SMs: 132, Major: 9, NVMLIndex: 3}, topo.GPUs[0])
	assert.Equal(t, 1, topo.GPUs[1].NVMLIndex)
	assert.Equal(t, "0000:3d:00.0", topo.GPUs[1].BusID)

	for _, p := range []Pair{{0, 1}, {1, 0}} {
		l := topo.Links[p.From][p.To]
		assert.True(t, l.CanAccessPeer)
		require.NotNil(t, l.NVML, p)
		assert.Equal(t, NVMLLink{NVLinks: 2, Level: LevelNode}, *l.NVML, p)
		assert.False(t, l.Check.Ran, "no CheckP2P, no check")
	}
	assert.Nil(t, topo.Links[0][0].NVML)
	assert.Equal(t, 1, nv.inits)
	assert.Equal(t, 1, nv.shutdowns)
	assert.Empty(t, cu.checked)
	assert.Equal(t, CheckNotRun, topo.PeerCheck)
}

func TestDiscoverWithoutNVML(t *testing.T) {
	_, cu := pcieBox()
	nv := &fakeNVML{initErr: fmt.Errorf("%w: dlopen libnvidia-ml.so.1: not found", ErrNoNVML)}
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu})
	require.NoError(t, err, "a missing NVML is not fatal")

	assert.False(t, topo.HasNVML)
	require.Len(t, topo.Notes, 1)
	assert.Contains(t, topo.Notes[0], "NVML unavailable, CUDA facts only")
	assert.Contains(t, topo.Notes[0], "libnvidia-ml.so.1")
	assert.Equal(t, -1, topo.GPUs[0].NVMLIndex)
	assert.Nil(t, topo.Links[0][1].NVML)
	assert.Equal(t, 0, nv.shutdowns, "no Shutdown after a failed Init")
}

func TestDiscoverNVMLIsAllOrNothing(t *testing.T) {
	nv, cu := pcieBox()
	cu.gpus[1].UUID = fakeUUID(42) // CUDA and NVML disagree about the GPU at 3d:00.0
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu})
	require.NoError(t, err)

	assert.False(t, topo.HasNVML)
	assert.Empty(t, topo.NVMLDriver)
	require.Len(t, topo.Notes, 1)
	assert.Contains(t, topo.Notes[0], "has UUID "+fakeUUID(1)+" but CUDA GPU 1 there has "+fakeUUID(42))
	assert.Equal(t, -1, topo.GPUs[0].NVMLIndex, "no half-applied NVML facts")
	assert.Nil(t, topo.Links[0][1].NVML)
	assert.Equal(t, 1, nv.shutdowns)
}

func TestDiscoverGPUUnknownToNVML(t *testing.T) {
	nv, cu := pcieBox()
	cu.gpus = append(cu.gpus, h100(fakeUUID(7), "0000:b1:00.0"))
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu})
	require.NoError(t, err)
	require.Len(t, topo.Notes, 1)
	assert.Contains(t, topo.Notes[0], "NVML does not list CUDA GPU 2 (bus 0000:b1:00.0)")
}

func TestDiscoverRejectsBadCUDAFacts(t *testing.T) {
	_, cu := pcieBox()
	cu.gpus[1].BusID = "garbage"
	_, err := Discover(context.Background(), Options{NVML: &fakeNVML{}, CUDA: cu})
	require.ErrorContains(t, err, `GPU 1: CUDA gave an unreadable PCI bus id "garbage"`)

	_, err = Discover(context.Background(), Options{NVML: &fakeNVML{}, CUDA: &fakeCUDA{}})
	require.ErrorContains(t, err, "CUDA sees no GPU")
}

func TestDiscoverCountsSwitchLinks(t *testing.T) {
	// Two GPUs on an NVSwitch fabric: every link ends at a switch (not a GPU NVML lists);
	// GPU 1 has two links down. A third GPU is outside the fabric partition.
	nv := &fakeNVML{driver: "570.1"}
	sw := func(n int) []string {
		l := make([]string, n)
		for k := range l {
			l[k] = fmt.Sprintf("00000000:%02x:00.0", 0xe0+k%4)
		}
		return l
	}
	nv.add(fakeUUID(0), "00000000:18:00.0", sw(18)...)
	g1 := nv.add(fakeUUID(1), "00000000:2a:00.0", sw(18)...)
	g1.links[3], g1.links[7] = "", ""
	nv.add(fakeUUID(2), "00000000:3a:00.0", sw(18)...)
	nv.p2p = func(a, b *fakeDev, c P2PCap) P2PStatus {
		if c == P2PNVLink && (a.uuid == fakeUUID(2) || b.uuid == fakeUUID(2)) {
			return P2PNotSupported
		}
		return P2POK
	}
	cu := &fakeCUDA{version: 12080, gpus: []GPU{
		h100(fakeUUID(0), "0000:18:00.0"), h100(fakeUUID(1), "0000:2a:00.0"), h100(fakeUUID(2), "0000:3a:00.0"),
	}}
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu})
	require.NoError(t, err)
	require.True(t, topo.HasNVML, topo.Notes)
	assert.Equal(t, 16, topo.Links[0][1].NVML.NVLinks)
	assert.Equal(t, 16, topo.Links[1][0].NVML.NVLinks)
	assert.Equal(t, 0, topo.Links[0][2].NVML.NVLinks)
	assert.Equal(t, P2PNotSupported, topo.Links[2][1].NVML.NVLink)
}
