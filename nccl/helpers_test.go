package nccl

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/gputest"
)

// fakeNCCLSource is embedded so that the test binary builds the fake anywhere, also from the
// GPU bundle, away from the source tree.
//
//go:embed testdata/fakenccl.c
var fakeNCCLSource []byte

// Record slots and controls of testdata/fakenccl.c (its R_* and C_* enums).
// rID is the first of the 16 words of the unique id the fake received.
const rID = 0

const (
	rNRanks = 16 + iota
	rRank
	rInitCalls
	rCfgSize
	rCfgMagic
	rCfgVersion
	rCfgBlocking
	rCfgCGA
	rCfgMinCTAs
	rCfgMaxCTAs
	rCfgNetName
	rCfgSplitShare
	rCfgTail
	rCfgNull
	rInitTID
)

const (
	rARSend = 32 + iota
	rARRecv
	rARCount
	rARType
	rAROp
	rARComm
	rARStream
	rARCalls
	rGroupStart
	rGroupEnd
	rAbortComm
	rAbortCalls
	rDestroyComm
	rDestroyCalls
	rFinalizeComm
	rAsyncComm
	rAsyncCalls
	rQueryComm
	rRegComm
	rRegBuff
	rRegSize
	rRegFlags
	rDeregComm
	rDeregHandle
	rLastErrComm
	rErrStrCode
	rUIDCalls
)

const (
	cInitResult = iota
	cARResult
	cGroupEndResult
	cAsyncPending
	cAsyncFinal
	cAbortResult
	cDestroyResult
	cFinalizeResult
	cCount
	cDevice
	cUserRank
	cRegResult
	cVersion
)

// builtFakes caches one build of the fake per set of compiler flags, for the whole test binary.
var builtFakes struct {
	sync.Mutex
	dir   string
	paths map[string]string
}

// fakeLibrary builds testdata/fakenccl.c with cc and the given -D flags, and returns the path of
// a private copy of it: each copy is a separate load with its own records and controls.
func fakeLibrary(t testing.TB, flags ...string) string {
	t.Helper()
	cc := gputest.RequireCC(t, "the fake libnccl")
	builtFakes.Lock()
	defer builtFakes.Unlock()
	key := strings.Join(flags, " ")
	so, ok := builtFakes.paths[key]
	if !ok {
		if builtFakes.dir == "" {
			dir, err := os.MkdirTemp("", "goccl-fakenccl-")
			require.NoError(t, err)
			builtFakes.dir, builtFakes.paths = dir, map[string]string{}
		}
		src := filepath.Join(builtFakes.dir, "fakenccl.c")
		require.NoError(t, os.WriteFile(src, fakeNCCLSource, 0o644))
		so = filepath.Join(builtFakes.dir, "libfakenccl"+strings.NewReplacer(" ", "", "=", "", "-", "_").Replace(key)+".so")
		args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", so, src}, flags...)
		out, err := exec.Command(cc, args...).CombinedOutput()
		require.NoError(t, err, "build fake libnccl: %s", out)
		builtFakes.paths[key] = so
	}
	data, err := os.ReadFile(so)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "libnccl.so.2")
	require.NoError(t, os.WriteFile(p, data, 0o755))
	return p
}

// fake is one loaded copy of the fake libnccl.
type fake struct {
	t        testing.TB
	path     string
	lib      *library
	get, set uintptr
}

// newFake loads a fresh copy of the fake through bindLibrary, as Load would.
func newFake(t testing.TB, flags ...string) *fake {
	t.Helper()
	p := fakeLibrary(t, flags...)
	h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	f := &fake{t: t, path: p}
	f.get, err = purego.Dlsym(h, "fake_get")
	require.NoError(t, err)
	f.set, err = purego.Dlsym(h, "fake_set")
	require.NoError(t, err)
	f.lib, err = bindLibrary(h, p)
	require.NoError(t, err)
	return f
}

// rec reads record slot i.
func (f *fake) rec(i int) uint64 {
	r, _, _ := purego.SyscallN(f.get, uintptr(i))
	return uint64(r)
}

// ctl sets control i to v.
func (f *fake) ctl(i int, v int64) { purego.SyscallN(f.set, uintptr(i), uintptr(v)) }

// install makes f the process's library for the rest of the test.
func (f *fake) install(t testing.TB) {
	t.Helper()
	useLibrary(t, f.lib, nil)
}

// useLibrary sets the process's load answer for the rest of the test.
func useLibrary(t testing.TB, lib *library, err error) {
	t.Helper()
	state.mu.Lock()
	loaded, savedLib, savedErr := state.loaded, state.lib, state.err
	state.loaded, state.lib, state.err = true, lib, err
	state.mu.Unlock()
	t.Cleanup(func() {
		state.mu.Lock()
		state.loaded, state.lib, state.err = loaded, savedLib, savedErr
		state.mu.Unlock()
	})
}

// comm returns a communicator of the fake through StartInitRank, rank 1 of 2 by default.
func (f *fake) comm(t testing.TB, cfg *Config) *Comm {
	t.Helper()
	f.install(t)
	c, err := StartInitRank(UniqueID{}, 2, 1, cfg)
	require.NoError(t, err)
	return c
}

// skipUnderRace skips allocation tests: the race detector makes sync.Pool drop items at
// random, so allocation counts mean nothing under it.
func skipUnderRace(t testing.TB) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector (sync.Pool drops items)")
	}
}
