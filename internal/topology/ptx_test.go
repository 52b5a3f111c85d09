package topology

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestP2PCheckPTXAssembles(t *testing.T) {
	assert.Contains(t, string(p2pCheckPTX), ".version 7.8\n.target sm_80\n")
	assert.Contains(t, string(p2pCheckPTX), ".entry "+p2pCheckKernel+"(")
	ptxas := requireEnv(t, "GOCCL_PTXAS")
	src := filepath.Join(t.TempDir(), "p2pcheck.ptx")
	require.NoError(t, os.WriteFile(src, p2pCheckPTX, 0o644))
	for _, arch := range []string{"sm_80", "sm_90"} {
		out, err := exec.Command(ptxas, "-arch="+arch, "-o", os.DevNull, src).CombinedOutput()
		require.NoError(t, err, "ptxas -arch=%s: %s", arch, out)
	}
}
