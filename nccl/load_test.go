package nccl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadExplicitPath(t *testing.T) {
	p := fakeLibrary(t)
	l, err := openLibrary(p, envMap(nil))
	require.NoError(t, err)
	real, err := filepath.EvalSymlinks(p)
	require.NoError(t, err)
	assert.Equal(t, real, l.path)
	assert.Equal(t, Version{2, 27, 3}, l.version)
	for _, s := range l.symbols() {
		assert.NotZero(t, *s.fn, "%s bound", s.name)
	}
}

// TestLoadExplicitPathOnly: a GOCCL_LIBNCCL that does not load is an error naming it, with no
// fall back to the other locations.
func TestLoadExplicitPathOnly(t *testing.T) {
	p := "/nonexistent-goccl/libnccl.so.2"
	_, err := openLibrary(p, envMap(nil))
	require.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), "GOCCL_LIBNCCL")
	assert.Contains(t, err.Error(), "other locations are not searched")
	assert.Contains(t, err.Error(), p+" (no such file)")
	assert.NotContains(t, err.Error(), "/usr/lib64", "no fall back to the default locations")
}

// TestLoadVersionTooOld: NCCL 2.17 is refused, naming both versions.
func TestLoadVersionTooOld(t *testing.T) {
	p := fakeLibrary(t, "-DFAKE_VERSION=21703")
	_, err := openLibrary(p, envMap(nil))
	require.ErrorIs(t, err, ErrVersion)
	assert.NotErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), "is NCCL 2.17.3; goccl needs NCCL 2.18 or newer")
	assert.Contains(t, err.Error(), p)

	_, err = openLibrary(fakeLibrary(t, "-DFAKE_VERSION=21800"), envMap(nil))
	require.NoError(t, err, "2.18.0 is enough")
}

// TestLoadMissingRequired: a library without the required entry points is refused, naming them.
func TestLoadMissingRequired(t *testing.T) {
	_, err := openLibrary("libc.so.6", envMap(nil))
	require.ErrorIs(t, err, ErrVersion)
	assert.Contains(t, err.Error(), "lacks ncclGetVersion, ncclGetErrorString")
	assert.Contains(t, err.Error(), "goccl needs NCCL 2.18 or newer")
}

// TestOpenFirstNamesEveryPath: the error wraps ErrNotFound and carries, from internal/dynlib,
// every path tried with its reason.
func TestOpenFirstNamesEveryPath(t *testing.T) {
	missing := "/nonexistent-goccl/lib/libnccl.so.2"
	bare := "libgoccl-nonexistent.so.2"
	_, _, err := openFirst([]string{missing, bare})
	require.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), "; tried "+missing+" (no such file); "+bare+" (")
	assert.Contains(t, err.Error(), "cannot open shared object file", "the dynamic loader's reason")
}

// mkdirs creates the folders under root and returns root.
func mkdirs(t *testing.T, root string, dirs ...string) string {
	t.Helper()
	for _, d := range dirs {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	return root
}

func indexOf(t *testing.T, list []string, s string) int {
	t.Helper()
	for i, v := range list {
		if v == s {
			return i
		}
	}
	t.Fatalf("%s not among the candidates %v", s, list)
	return -1
}

// TestCandidates checks the search order: the loader, the active environment's wheel
// (VIRTUAL_ENV, CONDA_PREFIX, PYTHONPATH), the system folders, then the system's Python.
func TestCandidates(t *testing.T) {
	venv := mkdirs(t, t.TempDir(), "lib/python3.12/site-packages")
	conda := mkdirs(t, t.TempDir(), "lib/python3.11/site-packages")
	home := mkdirs(t, t.TempDir(), ".local/lib/python3.10/site-packages")
	pp1, pp2 := t.TempDir(), t.TempDir()
	c := candidates(envMap(map[string]string{"VIRTUAL_ENV": venv, "CONDA_PREFIX": conda,
		"PYTHONPATH": pp1 + string(os.PathListSeparator) + string(os.PathListSeparator) + pp2, "HOME": home}))

	assert.Equal(t, "libnccl.so.2", c[0], "the dynamic loader goes first")
	order := []string{
		filepath.Join(venv, "lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"),
		filepath.Join(conda, "lib/libnccl.so.2"),
		filepath.Join(conda, "lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"),
		filepath.Join(pp1, "nvidia/nccl/lib/libnccl.so.2"),
		filepath.Join(pp2, "nvidia/nccl/lib/libnccl.so.2"),
		"/usr/lib64/libnccl.so.2",
		"/usr/local/cuda/lib64/libnccl.so.2",
		filepath.Join(home, ".local/lib/python3.10/site-packages/nvidia/nccl/lib/libnccl.so.2"),
	}
	prev := 0
	for _, p := range order {
		i := indexOf(t, c, p)
		assert.Greater(t, i, prev, "%s after the previous one", p)
		prev = i
	}
	for _, p := range []string{"/usr/lib/libnccl.so.2", "/usr/local/lib/libnccl.so.2"} {
		indexOf(t, c, p)
	}
	seen := map[string]bool{}
	for _, p := range c {
		assert.False(t, seen[p], "%s listed twice", p)
		seen[p] = true
		assert.NotEqual(t, filepath.Join("nvidia/nccl/lib/libnccl.so.2"), p, "an empty PYTHONPATH entry is skipped")
	}

	// Nothing set: the loader, then the fixed folders only.
	c = candidates(envMap(nil))
	assert.Equal(t, "libnccl.so.2", c[0])
	for _, p := range c[1:] {
		assert.True(t, filepath.IsAbs(p), p)
	}
}

// TestLoadFromVirtualEnv loads the fake from the wheel folder of a virtual environment, the
// way pip's nvidia-nccl-cu12 installs it, and names that folder when it is missing.
func TestLoadFromVirtualEnv(t *testing.T) {
	venv := t.TempDir()
	site := filepath.Join(venv, "lib", "python3.12", "site-packages")
	env := envMap(map[string]string{"VIRTUAL_ENV": venv})
	wheelLib := filepath.Join(site, "nvidia", "nccl", "lib", "libnccl.so.2")

	// Only the environment's entries: the loader and the system folders may hold a real
	// libnccl on the machine running the test.
	fromEnv := func() []string {
		var out []string
		for _, p := range candidates(env) {
			if strings.HasPrefix(p, venv) {
				out = append(out, p)
			}
		}
		return out
	}
	mkdirs(t, site, ".")
	_, _, err := openFirst(fromEnv())
	require.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), wheelLib+" (no such file)")

	mkdirs(t, filepath.Dir(wheelLib), ".")
	data, err := os.ReadFile(fakeLibrary(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(wheelLib, data, 0o755))
	h, path, err := openFirst(fromEnv())
	require.NoError(t, err)
	assert.Equal(t, wheelLib, path)
	l, err := bindLibrary(h, path)
	require.NoError(t, err)
	assert.Equal(t, wheelLib, l.path)
}

// TestNotFoundIsAnAnswer: with no library, every entry point says so without panicking.
func TestNotFoundIsAnAnswer(t *testing.T) {
	_, err := openLibrary("/nonexistent-goccl/libnccl.so.2", envMap(nil))
	require.Error(t, err)
	useLibrary(t, nil, err)
	require.ErrorIs(t, Load(), ErrNotFound)
	_, err = LibraryVersion()
	require.ErrorIs(t, err, ErrNotFound)
	assert.Empty(t, LibraryPath())
	assert.False(t, Has(FeatureRegister))
	for _, s := range Symbols() {
		assert.False(t, s.Resolved, s.Name)
	}
	_, err = GetUniqueID()
	require.ErrorIs(t, err, ErrNotFound)
	_, err = InitRank(t.Context(), UniqueID{}, 1, 0, nil)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = InitRankBlocking(UniqueID{}, 1, 0, nil)
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, Group(func() error { return nil }), ErrNotFound)

	var c *Comm
	require.ErrorIs(t, c.AllReduce(1, 2, 3, Float32, Sum, 0), ErrClosed)
	require.NoError(t, c.Abort())
	require.NoError(t, c.Destroy(t.Context()))
	_, err = c.Rank()
	require.ErrorIs(t, err, ErrClosed)
	_, err = c.Register(1, 2)
	require.ErrorIs(t, err, ErrClosed)
	assert.Zero(t, c.Handle())
}

func TestSymbolTable(t *testing.T) {
	l := &library{}
	seen := map[string]bool{}
	fns := map[*uintptr]bool{}
	for _, s := range l.symbols() {
		assert.False(t, seen[s.name], "%s listed twice", s.name)
		seen[s.name] = true
		assert.False(t, fns[s.fn], "%s shares its slot", s.name)
		fns[s.fn] = true
		assert.True(t, strings.HasPrefix(s.name, "nccl"), s.name)
		if s.optional {
			assert.False(t, s.since.Less(Version{2, 14, 0}), "%s: optional symbols record their NCCL version", s.name)
		}
	}
	for _, f := range []Feature{FeatureFinalize, FeatureRegister, FeatureWindow} {
		n := 0
		for _, s := range l.symbols() {
			if s.optional && s.feature == f {
				n++
			}
		}
		assert.NotZero(t, n, "feature %v has symbols", f)
	}
}

// TestSymbolsResolveInRealLibrary checks the table against a real libnccl where there is one
// (GOCCL_LIBNCCL or the default search): the GPU machine, or a CPU machine with the wheel.
func TestSymbolsResolveInRealLibrary(t *testing.T) {
	l, err := openLibrary(os.Getenv(envLibnccl), os.Getenv)
	if err != nil {
		if os.Getenv("GOCCL_REQUIRE_NCCL") == "1" {
			t.Fatalf("GOCCL_REQUIRE_NCCL=1 but: %v", err)
		}
		t.Skipf("no usable libnccl: %v", err)
	}
	t.Logf("libnccl %s, NCCL %v", l.path, l.version)
	for _, s := range l.symbols() {
		if !s.optional {
			assert.NotZero(t, *s.fn, "required %s", s.name)
			continue
		}
		assert.Equal(t, !l.version.Less(s.since), *s.fn != 0, "optional %s (since %v) in NCCL %v", s.name, s.since, l.version)
	}
}
