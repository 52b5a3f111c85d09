package driver

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Hand-written PTX for the GPU tests, validated with ptxas on CPU by TestKernelsAssemble.

// testPTX (sm_80): goccl_test_axpy computes out[i] = a*in[i] + i over u32 for i < n;
// goccl_test_empty does nothing (launch overhead); goccl_test_sum2 stores the sum of the two
// u64 of a by-value byte array parameter (Args.Bytes); goccl_test_spin waits until the host
// sets a flag in mapped host memory, for at most 10 s of %globaltimer.
const testPTX = `.version 7.8
.target sm_80
.address_size 64

.visible .entry goccl_test_axpy(
	.param .u64 p_out,
	.param .u64 p_in,
	.param .u32 p_a,
	.param .u32 p_n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<9>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [p_out];
	ld.param.u64 %rd2, [p_in];
	ld.param.u32 %r1, [p_a];
	ld.param.u32 %r2, [p_n];
	// i = ctaid.x * ntid.x + tid.x
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.u32 %r6, %r3, %r4, %r5;
	setp.ge.u32 %p1, %r6, %r2;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd3, %rd2;
	cvta.to.global.u64 %rd4, %rd1;
	mul.wide.u32 %rd5, %r6, 4;
	add.s64 %rd6, %rd3, %rd5;
	ld.global.u32 %r7, [%rd6];
	mad.lo.u32 %r8, %r7, %r1, %r6;
	add.s64 %rd7, %rd4, %rd5;
	st.global.u32 [%rd7], %r8;
DONE:
	ret;
}

.visible .entry goccl_test_empty()
{
	ret;
}

.visible .entry goccl_test_sum2(
	.param .u64 p_out,
	.param .align 8 .b8 p_pair[16]
)
{
	.reg .b64 %rd<6>;

	ld.param.u64 %rd1, [p_out];
	ld.param.u64 %rd2, [p_pair];
	ld.param.u64 %rd3, [p_pair+8];
	add.s64 %rd4, %rd2, %rd3;
	cvta.to.global.u64 %rd5, %rd1;
	st.global.u64 [%rd5], %rd4;
	ret;
}

.visible .entry goccl_test_spin(
	.param .u64 p_flag
)
{
	.reg .pred %p<3>;
	.reg .b32 %r<2>;
	.reg .b64 %rd<6>;

	ld.param.u64 %rd1, [p_flag];
	cvta.to.global.u64 %rd2, %rd1;
	mov.u64 %rd3, %globaltimer;
SPIN:
	// volatile: the host writes the flag while the kernel runs
	ld.volatile.global.u32 %r1, [%rd2];
	setp.ne.u32 %p1, %r1, 0;
	@%p1 bra DONE;
	mov.u64 %rd4, %globaltimer;
	sub.s64 %rd5, %rd4, %rd3;
	setp.lt.u64 %p2, %rd5, 10000000000;
	@%p2 bra SPIN;
DONE:
	ret;
}
`

// pdlPTX (sm_90): goccl_test_produce lets its dependent grid start at once, then writes
// x[i] = i + 1; goccl_test_consume waits for the producer (griddepcontrol.wait) and writes
// y[i] = 2*x[i]. Without the wait, or with the attribute mishandled, y reads stale zeros.
const pdlPTX = `.version 7.8
.target sm_90
.address_size 64

.visible .entry goccl_test_produce(
	.param .u64 p_x,
	.param .u32 p_n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<4>;

	griddepcontrol.launch_dependents;
	ld.param.u64 %rd1, [p_x];
	ld.param.u32 %r1, [p_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.u32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.u32 %rd3, %r5, 4;
	add.s64 %rd2, %rd2, %rd3;
	add.u32 %r6, %r5, 1;
	st.global.u32 [%rd2], %r6;
DONE:
	ret;
}

.visible .entry goccl_test_consume(
	.param .u64 p_y,
	.param .u64 p_x,
	.param .u32 p_n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<7>;

	griddepcontrol.wait;
	ld.param.u64 %rd1, [p_y];
	ld.param.u64 %rd2, [p_x];
	ld.param.u32 %r1, [p_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.u32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd3, %rd2;
	cvta.to.global.u64 %rd4, %rd1;
	mul.wide.u32 %rd5, %r5, 4;
	add.s64 %rd3, %rd3, %rd5;
	ld.global.u32 %r6, [%rd3];
	shl.b32 %r7, %r6, 1;
	add.s64 %rd6, %rd4, %rd5;
	st.global.u32 [%rd6], %r7;
DONE:
	ret;
}
`

// badPTXLine is the line of badPTX that does not assemble.
const badPTXLine = "line 6"

const badPTX = `.version 7.8
.target sm_80
.address_size 64
.visible .entry goccl_test_bad()
{
	this_is_not_an_instruction %r1;
	ret;
}
`

// TestKernelsAssemble runs ptxas (CUDA 11.8, PTX ISA 7.8) on the test kernels, so that a typo
// shows on CPU rather than on the GPU machine, and checks that the broken one fails on the
// line the GPU test expects.
func TestKernelsAssemble(t *testing.T) {
	ptxas := requireTool(t, "GOCCL_PTXAS")
	dir := t.TempDir()
	assemble := func(name, arch, src string) ([]byte, error) {
		in := filepath.Join(dir, name+".ptx")
		require.NoError(t, os.WriteFile(in, []byte(src), 0o644))
		return exec.Command(ptxas, "-arch="+arch, "-o", filepath.Join(dir, name+".cubin"), in).CombinedOutput()
	}
	out, err := assemble("test", "sm_80", testPTX)
	require.NoError(t, err, "%s", out)
	out, err = assemble("pdl", "sm_90", pdlPTX)
	require.NoError(t, err, "%s", out)
	out, err = assemble("bad", "sm_80", badPTX)
	require.Error(t, err)
	assert.Contains(t, string(out), badPTXLine)
}
