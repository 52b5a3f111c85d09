package topology

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -run %s -update to create it", t.Name())
	assert.Equal(t, string(want), string(got))
}

// renderBox is pcieBox with a third GPU seen by CUDA, one pair without peer access and one
// whose peer check fails.
func renderBox() (*fakeNVML, *fakeCUDA) {
	nv, cu := pcieBox()
	cu.gpus = append(cu.gpus, h100(fakeUUID(0), "0000:1a:00.0"))
	cu.noPeer = map[Pair]bool{{2, 0}: true, {0, 2}: true}
	cu.checkErr = map[Pair]error{{1, 2}: fmt.Errorf("65536 of 1048576 bytes differ (first at byte 0: wrote 0x5a, read 0x00) (%w)", ErrPeerCheckFailed)}
	nv.level = func(a, b *fakeDev) Level {
		if a.uuid == fakeUUID(0) || b.uuid == fakeUUID(0) {
			return LevelSystem
		}
		return LevelPXB
	}
	nv.p2p = func(a, b *fakeDev, c P2PCap) P2PStatus {
		switch {
		case c == P2PNVLink && (len(a.links) == 0 || len(b.links) == 0):
			return P2PNotSupported
		case a.uuid == fakeUUID(0) || b.uuid == fakeUUID(0):
			return P2PChipsetNotSupported
		}
		return P2POK
	}
	return nv, cu
}

func TestRenderGolden(t *testing.T) {
	nv, cu := renderBox()
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()})
	require.NoError(t, err)
	require.Empty(t, topo.Notes)
	var b bytes.Buffer
	require.NoError(t, topo.Render(&b))
	golden(t, "render.golden", b.Bytes())
}

func TestRenderGoldenWithoutNVML(t *testing.T) {
	nv, cu := renderBox()
	nv.initErr = &NVMLError{Op: "nvmlInit_v2", Code: NVMLErrorDriverNotLoaded, Message: "Driver Not Loaded"}
	topo, err := Discover(context.Background(), Options{NVML: nv, CUDA: cu})
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, topo.Render(&b))
	golden(t, "render_no_nvml.golden", b.Bytes())
}

func TestRenderFromCacheNamesTheFile(t *testing.T) {
	nv, cu := renderBox()
	opts := Options{NVML: nv, CUDA: cu, CheckP2P: true, CacheDir: t.TempDir()}
	_, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	topo, err := Discover(context.Background(), opts)
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, topo.Render(&b))
	assert.Contains(t, b.String(), "Peer check (from cache "+topo.CachePath+"; GOCCL_P2P_RECHECK=1 or Options.Force checks again)")
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestRenderReportsWriteErrors(t *testing.T) {
	require.EqualError(t, meshTopology(2, 18).Render(failingWriter{}), "disk full")
}
