package ptx

import (
	"errors"
	"fmt"
	"strings"
)

// Algorithm is one of the all-reduce kernels.
type Algorithm int

const (
	// OneShot (pull): every rank reads every rank's input and reduces it in
	// rank order; entry and exit barriers. Best for small messages.
	OneShot Algorithm = iota + 1
	// TwoShot: reduce-scatter into each rank's tmp buffer, a release/acquire
	// barrier, then all-gather from every rank's tmp buffer. Best for large
	// messages.
	TwoShot
	// Push (Lamport): every rank writes its input into a slot of every rank's
	// receive buffer and polls its own slots for the data; no barrier and no
	// registration of the input.
	Push
)

// Algorithms lists every algorithm, in a fixed order.
var Algorithms = []Algorithm{OneShot, TwoShot, Push}

// String returns the name used in kernel names, flags and tables: "oneshot",
// "twoshot" or "push" ("columns" for the fused kernels' Columns).
func (a Algorithm) String() string {
	switch a {
	case OneShot:
		return "oneshot"
	case TwoShot:
		return "twoshot"
	case Push:
		return "push"
	case Columns:
		return "columns"
	}
	return fmt.Sprintf("algorithm(%d)", int(a))
}

func (a Algorithm) valid() bool { return a >= OneShot && a <= Push }

// ParseAlgorithm turns the name of one of Algorithms, the plain kernels' (any case), into an
// Algorithm; Columns, a fused kernel's alone, is refused.
func ParseAlgorithm(s string) (Algorithm, error) {
	for _, a := range Algorithms {
		if strings.EqualFold(s, a.String()) {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q: use oneshot, twoshot or push", s)
}

// ErrUnsupportedArch is returned (wrapped) for a GPU older than compute
// capability 8.0: the kernels need cvt.rn.bf16x2.f32, which sm_80 introduced.
var ErrUnsupportedArch = errors.New("unsupported GPU architecture")

// Target is the GPU architecture a kernel is generated for.
type Target int

const (
	// SM80 runs on compute capability 8.x (Ampere, Ada) and later.
	SM80 Target = 80
	// SM90 adds programmatic dependent launch (griddepcontrol), compute
	// capability 9.0 (Hopper) and later.
	SM90 Target = 90
)

// String returns the ptxas spelling: "sm_80" or "sm_90".
func (t Target) String() string {
	if t.valid() {
		return fmt.Sprintf("sm_%d", int(t))
	}
	return fmt.Sprintf("target(%d)", int(t))
}

func (t Target) valid() bool { return t == SM80 || t == SM90 }

// TargetFor picks the target for a device of compute capability major.minor:
// SM90 from 9.0 on, SM80 for 8.x. Older devices get an error wrapping
// ErrUnsupportedArch.
func TargetFor(major, minor int) (Target, error) {
	switch {
	case major >= 9:
		return SM90, nil
	case major == 8:
		return SM80, nil
	}
	return 0, fmt.Errorf("compute capability %d.%d: %w: goccl needs 8.0 (Ampere) or newer", major, minor, ErrUnsupportedArch)
}

// Scope is the memory-model scope of a kernel's barriers: the threads for which a rank's
// writes before its flag are visible once they see the flag. It also picks the barrier
// protocol (docs/kernel-abi.md "Barrier"); push has no barrier and ignores it.
type Scope int

const (
	// ScopeSystem (the zero value) reaches threads anywhere in the system, ranks on other
	// GPUs included: the barriers store round numbers (st.volatile, st.release.sys /
	// ld.acquire.sys). It is always correct.
	ScopeSystem Scope = iota
	// ScopeGPU reaches the threads of one GPU only. It is correct only when every rank runs
	// on the same device, as virtual ranks and processes sharing one GPU do, and cheaper
	// there: the barriers count arrivals with atomic adds (red.relaxed.gpu, red.release.gpu /
	// ld.acquire.gpu), so a rank tells its peers it has arrived before it has read its round
	// number, and a release need not wait for the block's writes to reach the whole system.
	// On an H200 with 8 virtual ranks the release/acquire scope alone took about 1.2 us off a
	// two-shot all-reduce.
	ScopeGPU
	// ScopeSystemCounted reaches threads anywhere in the system, as ScopeSystem, and counts
	// arrivals with system-scope atomic adds on the peers' signal regions (red.relaxed.sys,
	// red.release.sys / ld.acquire.sys), as ScopeGPU counts them: a rank tells its peers it
	// has arrived before it has read its round number. It is correct where the GPU of every
	// rank performs atomics natively on every other rank's memory: GPUs linked by NVLink, or
	// one GPU. Across PCIe, where peer atomics are not native, ScopeSystem's stores are the
	// protocol.
	ScopeSystemCounted
)

// String names the scope: "sys", "gpu" or "syscount".
func (s Scope) String() string {
	switch s {
	case ScopeSystem:
		return "sys"
	case ScopeGPU:
		return "gpu"
	case ScopeSystemCounted:
		return "syscount"
	}
	return fmt.Sprintf("scope(%d)", int(s))
}

// PTX returns the scope qualifier of the kernels' release, acquire and atomic instructions:
// "sys" for both system scopes, "gpu" for ScopeGPU.
func (s Scope) PTX() string {
	if s == ScopeGPU {
		return "gpu"
	}
	return "sys"
}

// Counted reports whether the barriers count arrivals with atomic adds (ScopeGPU,
// ScopeSystemCounted) rather than store round numbers (ScopeSystem).
func (s Scope) Counted() bool { return s == ScopeGPU || s == ScopeSystemCounted }

// suffix is what a kernel's entry name carries for the scope: nothing for ScopeSystem, the
// zero value.
func (s Scope) suffix() string {
	if s == ScopeSystem {
		return ""
	}
	return "_" + s.String()
}

func (s Scope) valid() bool { return s == ScopeSystem || s == ScopeGPU || s == ScopeSystemCounted }

// Scopes lists every scope, in a fixed order.
var Scopes = []Scope{ScopeSystem, ScopeGPU, ScopeSystemCounted}
