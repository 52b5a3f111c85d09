package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
)

func TestPlanEngine(t *testing.T) {
	one := []int{0, 0, 0, 0}    // ranks sharing a GPU
	four := []int{0, 1, 2, 3}   // one rank per GPU
	auto := collective.NCCLAuto // the library's default
	for _, tc := range []struct {
		name    string
		args    string
		devices []int
		loads   bool
		goccl   *gocclSpec
		nccl    bool
	}{
		{name: "default", args: "", devices: one, loads: true, goccl: &gocclSpec{MaxBytes: 8 << 20, NCCL: auto}},
		{name: "large on one GPU: kernels take every size", args: "-e 256M", devices: one, loads: true,
			goccl: &gocclSpec{MaxBytes: 256 << 20, NCCL: auto}},
		{name: "large on four GPUs: NCCL past 64M", args: "-e 256M", devices: four, loads: true,
			goccl: &gocclSpec{MaxBytes: kernelMaxBytes, NCCL: auto}},
		{name: "large without libnccl", args: "-e 256M", devices: four, loads: false,
			goccl: &gocclSpec{MaxBytes: 256 << 20, NCCL: auto}},
		{name: "a kernel named: it takes every size", args: "-e 256M -a twoshot", devices: four, loads: true,
			goccl: &gocclSpec{MaxBytes: 256 << 20, NCCL: auto}},
		{name: "push measured at every size", args: "-e 1M -a all", devices: four, loads: true,
			goccl: &gocclSpec{MaxBytes: 1 << 20, PushMaxBytes: 1 << 20, NCCL: auto}},
		{name: "odd largest size rounds up", args: "-b 6 -e 1000 -f 10", devices: one, loads: true,
			goccl: &gocclSpec{MaxBytes: 608, NCCL: auto}}, // sizes 6, 60, 600
		{name: "nccl", args: "--backend nccl -e 256M", devices: four, loads: true, nccl: true},
		{name: "both: kernels only, every size", args: "--backend both -e 256M", devices: one, loads: true, nccl: true,
			goccl: &gocclSpec{MaxBytes: 256 << 20, NCCL: collective.NCCLOff}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseArgs(strings.Fields(tc.args))
			require.NoError(t, err)
			cfg := planEngine(c, tc.devices, tc.loads)
			assert.Equal(t, tc.goccl, cfg.Goccl)
			assert.Equal(t, tc.nccl, cfg.NCCL)
			assert.Equal(t, tc.devices, cfg.Devices)
			sizes := c.sizes()
			assert.Equal(t, roundUp16(sizes[len(sizes)-1]), cfg.MaxBytes, "the buffers hold the largest size")
		})
	}
}

// Each process of a --procs run that uses NCCL on one GPU is a host of its own: a distinct
// NCCL_HOSTID replaces the user's, and NCCL's sockets go through the loopback unless the user
// chose an interface.
func TestNCCLHostEnv(t *testing.T) {
	env := ncclHostEnv([]string{"HOME=/h", "NCCL_HOSTID=shared"}, 3, "99")
	assert.Equal(t, []string{"HOME=/h", "NCCL_HOSTID=arsmoke-99-rank3", "NCCL_SOCKET_IFNAME=lo"}, env)
	env = ncclHostEnv([]string{"NCCL_SOCKET_IFNAME=eth1"}, 0, "99")
	assert.Equal(t, []string{"NCCL_SOCKET_IFNAME=eth1", "NCCL_HOSTID=arsmoke-99-rank0"}, env)

	for _, tc := range []struct {
		backend string
		devices []int
		want    bool
	}{
		{backendGoccl, []int{0, 0}, false},
		{backendNCCL, []int{0, 0}, true},
		{backendBoth, []int{2, 2, 2}, true},
		{backendBoth, []int{0, 1}, false}, // NCCL's own transports between GPUs
	} {
		assert.Equal(t, tc.want, hostIDEnv(config{backend: tc.backend}, tc.devices), "%s on %v", tc.backend, tc.devices)
	}
}

func TestProcSockets(t *testing.T) {
	p := &procInfo{Socket: "/tmp/arsmoke-1/bootstrap.sock"}
	assert.Equal(t, "/tmp/arsmoke-1/bootstrap.sock", p.socket(0))
	assert.Equal(t, "/tmp/arsmoke-1/bootstrap.sock.1", p.socket(1))
}

// TestProcsNCCLOnOneGPU runs --procs with NCCL on one GPU: every child finds its own
// NCCL_HOSTID and the loopback interface (the fake engine fails otherwise), and rank 0's table
// says how NCCL connects them.
func TestProcsNCCLOnOneGPU(t *testing.T) {
	useFake(t, 1, func(engineConfig) (engine, error) { return nil, fmt.Errorf("the parent builds no engine") })
	code, stdout, stderr, _ := runProcs(t, "hostid", "--procs", "3", "--backend", "both", "-b", "1K", "-e", "4K")
	require.Equal(t, exitPass, code, stderr)
	assert.Empty(t, stderr)
	assert.Contains(t, stdout, "# 3 ranks, 3 processes, all on GPU 0; NCCL sees each process as a host of its own (NCCL_HOSTID) and connects them over sockets\n")
	assert.Contains(t, stdout, "# Algorithm: auto (goccl) vs nccl\n")
	assert.True(t, strings.HasSuffix(stdout, "arsmoke: PASS — 3 ranks, bf16, 3 sizes, goccl beside NCCL, 0 wrong\n"), stdout)

	// Without NCCL nothing is set: the fake fails a child that finds NCCL_HOSTID.
	code, _, stderr, _ = runProcs(t, "nohostid", "--procs", "2", "-b", "1K", "-e", "4K")
	require.Equal(t, exitPass, code, stderr)
}

// The children's fake checks its environment (see installFake's modes hostid and nohostid).
func checkHostEnv(mode string, rank int) error {
	id, ifname := os.Getenv(envNCCLHostID), os.Getenv(envNCCLIfname)
	switch {
	case mode == "hostid" && !strings.HasSuffix(id, fmt.Sprintf("-rank%d", rank)):
		return fmt.Errorf("rank %d: NCCL_HOSTID=%q", rank, id)
	case mode == "hostid" && ifname != "lo":
		return fmt.Errorf("rank %d: NCCL_SOCKET_IFNAME=%q", rank, ifname)
	case mode == "nohostid" && id != "":
		return fmt.Errorf("rank %d: NCCL_HOSTID=%q set for a goccl run", rank, id)
	}
	return nil
}
