package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// write makes the file dir/name with text.
func write(t *testing.T, dir, name, text string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
}

// fusedJSON is an arsmoke --fused --json document of one run with rows 1 and 512.
func fusedJSON(build string, ranks int, f1, p1, a1 float64) string {
	return `{"goccl": "` + build + `", "driver": "13.0", "ranks": ` + fmt.Sprint(ranks) + `, "fused": {"hidden": 8192, "blocks": [{"algo": "auto", "backend": "goccl", "rows": [
		{"rows": 1, "path": "oneshot", "pair_path": "push", "fused_us": ` + fmt.Sprint(f1) + `, "unfused_us": ` + fmt.Sprint(p1) + `, "allreduce_us": ` + fmt.Sprint(a1) + `, "wrong": 0},
		{"rows": 512, "path": "twoshot", "pair_path": "twoshot", "fused_us": 20, "unfused_us": 36, "allreduce_us": 30, "wrong": 0}]}]},
		"verdict": {}}`
}

// TestRender renders a folder of every part: ranges over the passes, the room, each point's
// verdict, the best kernel at each scope against the v2 figure, the tuning summary without the
// per-size rows, and the default runs' bandwidth.
func TestRender(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "date.txt", "2026-12-07\n")
	write(t, dir, "gpu.txt", "NVIDIA H200, 580.159.04\n")
	write(t, dir, "build.json", `{"goccl": "abc123", "ranks": 2}`)
	write(t, dir, "fused_ws2_p1.json", fusedJSON("abc123", 2, 3.0, 4.0, 1.8))
	write(t, dir, "fused_ws2_p2.json", fusedJSON("abc123", 2, 3.2, 4.0, 1.9))
	write(t, dir, "forkjoin_fused.txt", strings.Join([]string{
		"goos: linux",
		"BenchmarkAllReduceResidualRMSNorm/ws8/rows1/fused-16         	      10	 123 ns/op	         7.52 us/layer",
		"BenchmarkAllReduceResidualRMSNorm/ws8/rows1/unfused-16       	      10	 123 ns/op	         8.50 us/layer",
		"BenchmarkAllReduceResidualRMSNorm/ws8/rows1/allreduce-16     	      10	 123 ns/op	         6.15 us/layer",
		"    fused_gpu_test.go:620: fused: oneshot",
		"PASS",
	}, "\n"))
	write(t, dir, "points.txt", strings.Join([]string{
		"BenchmarkGraphForkJoinFloor/fork-rank0-pdl-early/ws2-16 	 10	 1 ns/op	 0.72 us/layer",
		"BenchmarkAllReduceGrid/ws2/16K/oneshot/gpu/blocks0-16 	 10	 1 ns/op	 2.54 us/allreduce	 6.4 algGB/s",
		"BenchmarkAllReduceGrid/ws2/16K/oneshot/sys/blocks0-16 	 10	 1 ns/op	 2.38 us/allreduce	 6.9 algGB/s",
		"BenchmarkAllReduceGrid/ws2/16K/push/gpu/blocks0-16 	 10	 1 ns/op	 2.03 us/allreduce	 8.1 algGB/s",
		"BenchmarkAllReduceGrid/ws2/16K/push/sys/blocks0-16 	 10	 1 ns/op	 1.80 us/allreduce	 9.1 algGB/s",
		"BenchmarkAllReduceGrid/ws2/1M/oneshot/gpu/blocks0-16 	 10	 1 ns/op	 3.10 us/allreduce	 1 algGB/s",
		"BenchmarkAllReduceGrid/ws2/1M/oneshot/sys/blocks0-16 	 10	 1 ns/op	 3.22 us/allreduce	 1 algGB/s",
	}, "\n"))
	write(t, dir, "tune.log", "arsmoke: --tune: 2 ranks\n# goccl tuning: x\n\n## 2 ranks: one GPU; gpu-scope barriers\npush blocks: 32 (built-in 16); pull grid built in: 64xauto\n\ngraph: push 32xauto up to 32K, oneshot 64xauto above\n      size  tuned ...\ngain over the built-in choice: 6.2% on average (geometric)\n")
	write(t, dir, "tune.json", "{}\n")
	write(t, dir, "default_eager_on_p1.log", "# Avg bus bandwidth    : 84.1000\n")
	write(t, dir, "default_eager_off_p1.log", "# Avg bus bandwidth    : 83.3000\n")
	write(t, dir, "default_graph_on_p1.log", "# Avg bus bandwidth    : 116.4000\n")

	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run([]string{dir}, &stdout, &stderr), stderr.String())
	out := stdout.String()
	assert.Contains(t, out, "Measured 2026-12-07 at abc123 on NVIDIA H200, 580.159.04")
	// one graph per rank: ranges over the two passes; 0.75*4.0-1.8 = 1.20, 0.75*4.0-1.9 = 1.10
	assert.Contains(t, out, "| 2 | 1 | oneshot | 3.00-3.20 | 4.00 | 0.75-0.80 | 1.80-1.90 | 1.10-1.20 | missed | 0 |")
	assert.Contains(t, out, "| 2 | 512 | twoshot | 20.00 | 36.00 | 0.56 | 30.00 | -3.00 | met | 0 |")
	// fork/join: 7.52/8.50 = 0.88, room 0.75*8.50-6.15 = 0.225
	assert.Contains(t, out, "| 8 | 1 | 7.52 | 8.50 | 0.88 | 6.15 | 0.22 | missed |")
	// points: the best out of place at each scope, against v2's 2.01
	assert.Contains(t, out, "| 2 | 0.72 | 16K | 2.54 / 2.38 |  | 2.03 / 1.80 |  | 2.03 | 1.80 | 2.01 (0.72) | 0.90 |")
	assert.Contains(t, out, "| 2 | 0.72 | 1M | 3.10 / 3.22 |  |  |  | 3.10 | 3.22 | 3.92 (0.72) | 0.82 |")
	assert.Contains(t, out, "within 0.9 of the v2 figure at 2 of 2 points")
	assert.Contains(t, out, "graph: push 32xauto up to 32K, oneshot 64xauto above\n")
	assert.NotContains(t, out, "size  tuned")
	assert.Contains(t, out, "| eager | 84.1 | 83.3 |")
	assert.Contains(t, out, "| graph | 116.4 |  |")
}

// TestRenderRefuses: a folder without any part, runs from two builds, a run that stopped or
// printed no JSON and a default run without its average all fail with a message and no
// tables; no folder at all is a usage error.
func TestRenderRefuses(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"nothing": {"other.txt": "x"},
		"two builds": {
			"fused_ws2_p1.json": fusedJSON("abc123", 2, 3, 4, 2),
			"fused_ws2_p2.json": fusedJSON("def456", 2, 3, 4, 2),
		},
		"stopped run":     {"fused_ws4_p1.json": `{"goccl": "abc", "ranks": 4, "error": "peer 3 timed out"}`},
		"not JSON":        {"fused_ws4_p1.json": "arsmoke: no GPU\n"},
		"unfinished runs": {"default_eager_on_p1.log": "arsmoke: interrupted\n", "tune.json": "{}\n"},
		"no table":        {"default_eager_on_p1.log": "# Avg bus bandwidth    : 84.1000\n"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for f, text := range files {
				write(t, dir, f, text)
			}
			var stdout, stderr bytes.Buffer
			assert.Equal(t, 1, run([]string{dir}, &stdout, &stderr))
			assert.Empty(t, stdout.String())
			assert.NotEmpty(t, stderr.String())
		})
	}
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 2, run(nil, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "usage")
}

// TestGoalsScript runs goals.sh with stand-ins for arsmoke, collective.test and nvidia-smi that
// print what the real ones do, and renders its output folder: the script's file names and the
// renderer's must agree.
func TestGoalsScript(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("goals.sh needs bash")
	}
	if _, err := exec.LookPath("timeout"); err != nil {
		t.Skip("goals.sh needs timeout (coreutils)")
	}
	bundle, bin, out := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "goals")
	script, err := os.ReadFile("../goals.sh")
	require.NoError(t, err)
	write(t, bundle, "goals.sh", string(script))
	// arsmoke: --fused runs print their JSON, --tune its summary, the default run its table
	write(t, bundle, "arsmoke", `#!/bin/sh
case " $* " in
*" --fused "*) ws=$(echo "$*" | sed 's/.*--ranks \([0-9]*\).*/\1/')
  echo '{"goccl": "devel abc123", "ranks": '$ws', "fused": {"hidden": 8192, "blocks": [{"algo": "auto", "rows": [{"rows": 1, "path": "oneshot", "fused_us": 3, "unfused_us": 4, "allreduce_us": 2}]}]}}'
  echo "arsmoke: PASS" >&2 ;;
*" --tune "*) [ -z "${FAKE_TUNE_FAILS:-}" ] || { echo "arsmoke: --tune: no GPU" >&2; exit 1; }
  echo "## 8 ranks: one GPU"; echo "graph: push 16xauto up to 16K, oneshot 16xauto above"
  echo '{}' >"$(echo "$*" | sed 's/.* -o \([^ ]*\).*/\1/')" ;;
*" --json "*) echo '{"goccl": "devel abc123"}' ;;
*) if [ -n "${GOCCL_TUNE_FILE:-}" ]; then echo "# Avg bus bandwidth    : 84.1000"; else echo "# Avg bus bandwidth    : 83.3000"; fi ;;
esac
`)
	write(t, bundle, "collective.test", `#!/bin/sh
case "$*" in
*AllReduceResidualRMSNorm*) for v in "fused 7.5" "unfused 8.5" "allreduce 6.1"; do set -- $v; echo "BenchmarkAllReduceResidualRMSNorm/ws8/rows1/$1-16 10 1 ns/op $2 us/layer"; done ;;
*GraphForkJoinFloor*AllReduceGrid*) echo "BenchmarkGraphForkJoinFloor/fork-rank0-pdl-early/ws8-16 10 1 ns/op 3.57 us/layer"
   echo "BenchmarkAllReduceGrid/ws8/16K/push/sys/blocks0-16 10 1 ns/op 5.94 us/allreduce 2.8 algGB/s" ;;
*) echo "collective.test: unexpected arguments: $*" >&2; exit 2 ;;
esac
`)
	write(t, bin, "nvidia-smi", "#!/bin/sh\necho 'NVIDIA H200, 580.159.04'\n")
	for _, dir := range []string{bundle, bin} {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			require.NoError(t, os.Chmod(filepath.Join(dir, e.Name()), 0o755))
		}
	}
	// the parts in two calls, as under a per-call time limit, each into its own folder
	outs := []string{filepath.Join(out, "fused"), filepath.Join(out, "rest")}
	for i, parts := range [][]string{{"fused"}, {"points", "tune"}} {
		cmd := exec.Command("bash", append([]string{filepath.Join(bundle, "goals.sh")}, parts...)...)
		cmd.Env = append(os.Environ(), "OUT="+outs[i], "PASSES=2", "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		log, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", log)
	}

	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, run([]string{outs[0], outs[0]}, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "the same measurement twice")
	stdout.Reset()
	stderr.Reset()
	require.Equal(t, 0, run(outs, &stdout, &stderr), stderr.String())
	got := stdout.String()
	assert.Contains(t, got, "at devel abc123 on NVIDIA H200, 580.159.04")
	for _, ws := range []int{2, 4, 8} {
		assert.Contains(t, got, fmt.Sprintf("| %d | 1 | oneshot | 3.00 | 4.00 | 0.75 | 2.00 | 1.00 | met | 0 |", ws))
	}
	assert.Contains(t, got, "| 8 | 1 | 7.50 | 8.50 | 0.88 | 6.10 | 0.28 | missed |")
	assert.Contains(t, got, "| 8 | 3.57 | 16K |  |  |  / 5.94 |  |  | 5.94 | 5.84 (3.57) | 1.02 |")
	assert.Contains(t, got, "graph: push 16xauto up to 16K")
	assert.Contains(t, got, "| eager | 84.1, 84.1 | 83.3, 83.3 |")

	goals := func(env []string, parts ...string) (string, int) {
		cmd := exec.Command("bash", append([]string{filepath.Join(bundle, "goals.sh")}, parts...)...)
		cmd.Env = append(append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH")), env...)
		log, _ := cmd.CombinedOutput()
		return string(log), cmd.ProcessState.ExitCode()
	}
	// A tuning step that fails leaves no table: the runs "with the table" are left out, not
	// run with a file goccl would ignore.
	failed := filepath.Join(out, "tune-failed")
	log, code := goals([]string{"OUT=" + failed, "PASSES=1", "FAKE_TUNE_FAILS=1"}, "tune")
	assert.Equal(t, 1, code, log)
	assert.Contains(t, log, "no tuning table from this run")
	assert.NoFileExists(t, filepath.Join(failed, "default_eager_on_p1.log"))
	stdout.Reset()
	require.Equal(t, 0, run([]string{failed}, &stdout, &stderr), stderr.String())
	assert.Contains(t, stdout.String(), "| eager |  | 83.3 |")

	// Bad parts and passes are refused before anything runs.
	for _, tc := range []struct {
		env   []string
		parts []string
		want  string
	}{
		{nil, []string{"tune", "tuen"}, "goals: unknown part tuen"},
		{[]string{"PASSES=abc"}, []string{"fused"}, "goals: PASSES=abc: want a number of passes"},
	} {
		dir := filepath.Join(out, "refused")
		log, code := goals(append(tc.env, "OUT="+dir), tc.parts...)
		assert.Equal(t, 2, code, log)
		assert.Contains(t, log, tc.want)
		assert.NoDirExists(t, dir, "nothing ran")
	}
}
