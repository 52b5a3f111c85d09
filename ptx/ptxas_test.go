package ptx

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

// ptxasPath returns the ptxas to validate with, from GOCCL_PTXAS. Without it
// the test skips, unless GOCCL_REQUIRE_TOOLS=1 (CI), where it fails.
func ptxasPath(t *testing.T) string {
	t.Helper()
	if raceEnabled {
		// Hundreds of ptxas runs gain nothing from the race detector, and take minutes under
		// it; make test's pass without -race assembles every kernel.
		t.Skip("ptxas validation runs in the build without -race")
	}
	p := os.Getenv("GOCCL_PTXAS")
	if p == "" {
		msg := `GOCCL_PTXAS is not set: run eval "$(scripts/fetch-tools.sh ptxas)" to validate the kernels with ptxas`
		if os.Getenv("GOCCL_REQUIRE_TOOLS") == "1" {
			t.Fatal(msg + " (GOCCL_REQUIRE_TOOLS=1 makes this a failure)")
		}
		t.Skip(msg)
	}
	return p
}

// ptxasReport is what ptxas -v says about the one function of a module.
type ptxasReport struct {
	Registers, StackFrame, SpillStores, SpillLoads int
}

var (
	registersRE = regexp.MustCompile(`Used (\d+) registers`)
	frameRE     = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
)

// assemble runs ptxas -v on one PTX module and reads its resource report.
func assemble(ptxas, arch string, src []byte, dir string) (ptxasReport, error) {
	in := filepath.Join(dir, "kernel.ptx")
	if err := os.WriteFile(in, src, 0o644); err != nil {
		return ptxasReport{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, ptxas, "-arch="+arch, "-v", "-o", filepath.Join(dir, "kernel.cubin"), in)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return ptxasReport{}, fmt.Errorf("ptxas -arch=%s: %w\n%s", arch, err, out.String())
	}
	regs := registersRE.FindStringSubmatch(out.String())
	frame := frameRE.FindStringSubmatch(out.String())
	if regs == nil || frame == nil {
		return ptxasReport{}, fmt.Errorf("ptxas -v output not understood:\n%s", out.String())
	}
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n } // the patterns match digits only
	return ptxasReport{atoi(regs[1]), atoi(frame[1]), atoi(frame[2]), atoi(frame[3])}, nil
}

// TestPTXAssembles assembles every variant with ptxas for its target and
// fails on spills or a stack frame: the kernels must keep everything in
// registers.
func TestPTXAssembles(t *testing.T) {
	ptxas := ptxasPath(t)
	for _, s := range allSpecs() {
		t.Run(variantName(s), func(t *testing.T) {
			t.Parallel()
			rep, err := assemble(ptxas, s.Target.String(), generate(t, s), t.TempDir())
			require.NoError(t, err)
			assert.Zero(t, rep.StackFrame, "stack frame bytes (local memory)")
			assert.Zero(t, rep.SpillStores, "spill store bytes")
			assert.Zero(t, rep.SpillLoads, "spill load bytes")
			assert.LessOrEqual(t, rep.Registers, 65536/ThreadsPerBlock, "registers for one block of %d threads per SM", ThreadsPerBlock)
			if s.DType == dtype.BFloat16 && s.Target == SM90 && (s.WorldSize == 2 || s.WorldSize == 8 || s.WorldSize == 16) {
				t.Logf("%s %s: %d registers", s.EntryName(), s.Target, rep.Registers)
			}
		})
	}
}

// TestAssembleCatchesFailures makes sure the harness above can fail: a PTX
// error, a kernel with a stack frame, and griddepcontrol on sm_80.
func TestAssembleCatchesFailures(t *testing.T) {
	ptxas := ptxasPath(t)
	good := generate(t, Spec{OneShot, dtype.Float32, 2, SM80, ScopeSystem})

	_, err := assemble(ptxas, "sm_80", bytes.Replace(good, []byte("add.rn.f32"), []byte("add.rn.f33"), 1), t.TempDir())
	assert.Error(t, err, "a misspelt instruction")

	pdl := generate(t, Spec{OneShot, dtype.Float32, 2, SM90, ScopeSystem})
	_, err = assemble(ptxas, "sm_80", bytes.Replace(pdl, []byte(".target sm_90"), []byte(".target sm_80"), 1), t.TempDir())
	assert.ErrorContains(t, err, "griddepcontrol", "griddepcontrol needs sm_90")

	local := []byte(`.version 7.8
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p, .param .u32 i)
{
	.local .align 4 .b8 buf[64];
	.reg .b32 %r<3>;
	.reg .b64 %rd<4>;
	ld.param.u32 %r1, [i];
	mov.u64 %rd1, buf;
	mul.wide.u32 %rd2, %r1, 4;
	add.u64 %rd1, %rd1, %rd2;
	st.local.u32 [%rd1], %r1;
	ld.param.u64 %rd3, [p];
	ld.local.u32 %r2, [buf+8];
	st.global.u32 [%rd3], %r2;
	ret;
}
`)
	rep, err := assemble(ptxas, "sm_80", local, t.TempDir())
	require.NoError(t, err)
	assert.Positive(t, rep.StackFrame, "a dynamically indexed local array needs a stack frame")
}
