package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/dtype"
)

// envFake makes a --procs child started by a test use a fake engine; its
// value picks the behaviour (see installFake).
const envFake = "ARSMOKE_TEST_FAKE"

// TestMain turns the test binary into arsmoke when a test's --procs parent
// starts it as a child, so that the parent side runs for real.
func TestMain(m *testing.M) {
	// The GPU tests run arsmoke in this process after requireGPU has started CUDA, which reads
	// the queue count then: raise it first, as run does in arsmoke itself (the --procs
	// children still get the default, see childEnv). Not under MPS (the GPU bundle runs
	// TestGPUProcs there): this process's 32 queues and its 4 children's exhaust the MPS pool.
	if os.Getenv("CUDA_MPS_PIPE_DIRECTORY") == "" {
		raiseConnections()
	}
	if rank, child := os.LookupEnv(envRank); child {
		mode := os.Getenv(envFake)
		if mode != "" {
			installFake(mode)
		}
		code := run(os.Args[1:], os.Stdout, os.Stderr)
		if mode == "hangexit0" && rank == "0" {
			// A process that does not exit once its run is over, as one stuck in the
			// driver's teardown.
			time.Sleep(time.Hour)
		}
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// fakeEngine replays recorded results: a time model of 8 us plus the bytes
// at 200 GB/s for goccl, 20 us plus the bytes at 150 GB/s for NCCL (in place
// 5% faster), and whatever measure overrides.
type fakeEngine struct {
	cfg     engineConfig
	measure func(Case) (Measurement, error)
	cases   []Case
	closed  bool
}

func newFake(cfg engineConfig) *fakeEngine { return &fakeEngine{cfg: cfg} }

func (f *fakeEngine) Describe() Header {
	h := Header{Host: "h200-test", Driver: "12.8"}
	if f.cfg.NCCL || (f.cfg.Goccl != nil && f.cfg.Goccl.NCCL == collective.NCCLAuto && !sharesGPU(f.cfg.Devices)) {
		h.NCCL = "2.21.5"
	}
	first := 0
	if f.cfg.Proc != nil {
		first = f.cfg.Proc.Rank
	}
	for i, d := range f.cfg.Devices {
		h.Devices = append(h.Devices, RankDevice{
			Rank: first + i, Pid: 4242, Device: d, Name: "NVIDIA H200",
			BusID: fmt.Sprintf("0000:%02x:00.0", 0x18+8*d),
		})
	}
	return h
}

func (f *fakeEngine) Run(_ context.Context, c Case) (Measurement, error) {
	f.cases = append(f.cases, c)
	if f.measure != nil {
		return f.measure(c)
	}
	if g := f.cfg.Goccl; c.Backend == backendGoccl && c.Algo == "auto" && g != nil && c.Bytes > g.MaxBytes {
		// Past the kernels' MaxBytes the communicator hands the call to NCCL.
		nc := c
		nc.Backend, nc.Algo = backendNCCL, backendNCCL
		return recorded(nc), nil
	}
	return recorded(c), nil
}

func (f *fakeEngine) Close() error {
	f.closed = true
	return nil
}

func recorded(c Case) Measurement {
	ns := 8000 + c.Bytes/200
	path := c.Algo
	switch {
	case c.Backend == backendNCCL:
		ns, path = 20000+c.Bytes/150, backendNCCL
	case path == "auto" && c.Bytes <= 512<<10:
		path = "oneshot"
	case path == "auto":
		path = "twoshot"
	}
	if c.InPlace {
		ns = ns * 95 / 100
	}
	return Measurement{Time: time.Duration(ns), Path: path}
}

// useFake makes run() see visible GPUs and build the engine returned by
// build, for the rest of the test.
func useFake(t *testing.T, visible int, build func(engineConfig) (engine, error)) {
	t.Helper()
	oldCount, oldNew, oldVersion, oldLoads := countDevices, newEngine, gocclVersion, ncclLoads
	t.Cleanup(func() { countDevices, newEngine, gocclVersion, ncclLoads = oldCount, oldNew, oldVersion, oldLoads })
	countDevices = func() (int, error) { return visible, nil }
	ncclLoads = func() bool { return true }
	newEngine = func(_ context.Context, cfg engineConfig) (engine, error) { return build(cfg) }
	gocclVersion = "v0.1.0-test"
}

// installFake sets up a --procs child (see TestMain). Modes: "ok"; "fail1":
// rank 1 cannot start; "hang0": rank 0 never returns from its first
// all-reduce; "hangexit0": rank 0 does not exit after its run (see TestMain); "wrong1": rank 1's outputs are wrong in every case (5 elements,
// the first at index 3), all-reduce and fused; "slow1": rank 1 takes 10 times
// as long as rank 0; "err1": rank 1's 4 KiB cases fail; "hostid" and
// "nohostid": a child fails unless NCCL_HOSTID is set for it (and not set,
// see checkHostEnv); "tune": --tune measures with a fake tuner.
func installFake(mode string) {
	gocclVersion = "v0.1.0-test"
	countDevices = func() (int, error) { return 1, nil }
	ncclLoads = func() bool { return true }
	if mode == "tune" {
		newTuneRunner = func(_ context.Context, cfg engineConfig, _ dtype.DType, _, _ int) (tuneRunner, error) {
			return &fakeTuner{target: h200Target(cfg.Proc.World), closed: new(int)}, nil
		}
	}
	newEngine = func(_ context.Context, cfg engineConfig) (engine, error) {
		if cfg.Proc == nil {
			return nil, errors.New("fake child: no procInfo")
		}
		if _, err := os.Stat(filepath.Dir(cfg.Proc.Socket)); err != nil {
			return nil, fmt.Errorf("fake child: the socket's folder: %w", err)
		}
		f := newFake(cfg)
		if err := checkHostEnv(mode, cfg.Proc.Rank); err != nil {
			return nil, err
		}
		switch {
		case mode == "fail1" && cfg.Proc.Rank == 1:
			return nil, errors.New("fake child: rank 1 cannot join")
		case mode == "hang0" && cfg.Proc.Rank == 0:
			f.measure = func(Case) (Measurement, error) {
				time.Sleep(time.Hour)
				return Measurement{}, nil
			}
		case mode == "wrong1" && cfg.Proc.Rank == 1:
			f.measure = func(c Case) (Measurement, error) {
				m := recorded(c)
				m.Wrong = 5
				m.First = &Mismatch{Rank: 1, Index: 3, Expected: "1 (0x3f80)", Got: "0 (0x0000)"}
				return m, nil
			}
			fakeFused = func(c FusedCase) (FusedMeasurement, error) {
				m := recordedFused(c)
				m.UnfusedWrong = 5
				m.First = &FusedMismatch{Call: "unfused", Output: "sum",
					Mismatch: Mismatch{Rank: 1, Index: 3, Expected: "1 (0x3f80)", Got: "0 (0x0000)"}}
				return m, nil
			}
		case mode == "slow1" && cfg.Proc.Rank == 1:
			f.measure = func(c Case) (Measurement, error) {
				m := recorded(c)
				m.Time *= 10
				return m, nil
			}
			fakeFused = func(c FusedCase) (FusedMeasurement, error) {
				m := recordedFused(c)
				m.Fused, m.Unfused, m.AllReduce = 10*m.Fused, 10*m.Unfused, 10*m.AllReduce
				return m, nil
			}
		case mode == "err1" && cfg.Proc.Rank == 1:
			f.measure = func(c Case) (Measurement, error) {
				if c.Bytes == 4096 {
					return Measurement{}, errors.New("fake child: rank 1's launch failed")
				}
				return recorded(c), nil
			}
		}
		return f, nil
	}
}
