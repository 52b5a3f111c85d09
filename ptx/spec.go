package ptx

import (
	"bytes"
	"embed"
	"fmt"
	"strings"
	"sync"
	"text/template"

	"github.com/goccl/goccl/dtype"
)

// Spec names one kernel: an algorithm for one element type, world size,
// target and barrier scope. It is a pure description; Generate turns it into
// PTX text and loading that text into a context is the driver's job.
type Spec struct {
	Algo      Algorithm
	DType     dtype.DType
	WorldSize int    // ranks of the communicator, 2..MaxRanks
	Target    Target // see TargetFor
	// Scope of the one-shot and two-shot barriers: ScopeSystem stores round numbers into
	// the peers' flags, ScopeSystemCounted counts arrivals with system-scope atomic adds,
	// ScopeGPU counts them with GPU-scope ones and makes the two-shot's release/acquire
	// GPU-scope (docs/kernel-abi.md, "Barrier"). Push has no barrier and is the same in all
	// three. The zero value, ScopeSystem, is always correct; ScopeSystemCounted where every
	// rank's GPU has native atomics on every other's memory; ScopeGPU only when every rank is
	// on one device.
	Scope Scope
}

// Validate reports whether the spec names a kernel that exists: a known
// algorithm, element type and target, and a world size of 2..MaxRanks.
func (s Spec) Validate() error {
	if !s.Algo.valid() {
		return fmt.Errorf("kernel spec: unknown algorithm %d: use ptx.OneShot, ptx.TwoShot or ptx.Push", int(s.Algo))
	}
	if !s.DType.Valid() {
		return fmt.Errorf("kernel spec: unsupported element type %v: use dtype.Float32, dtype.Float16 or dtype.BFloat16", s.DType)
	}
	if s.WorldSize < 2 || s.WorldSize > MaxRanks {
		return fmt.Errorf("kernel spec: world size %d out of range: the kernels exist for 2..%d ranks", s.WorldSize, MaxRanks)
	}
	if !s.Target.valid() {
		return fmt.Errorf("kernel spec: unknown target %d: use ptx.SM80 or ptx.SM90 (see ptx.TargetFor)", int(s.Target))
	}
	if !s.Scope.valid() {
		return fmt.Errorf("kernel spec: unknown scope %d: use ptx.ScopeSystem, ptx.ScopeGPU or ptx.ScopeSystemCounted", int(s.Scope))
	}
	return nil
}

// EntryName returns the kernel's .entry name, goccl_<algo>_<dtype>_w<ws>,
// e.g. "goccl_oneshot_bf16_w8", with "_gpu" appended for ScopeGPU and "_syscount" for
// ScopeSystemCounted (so that a profile tells the scopes apart). Both targets use the same
// name.
func (s Spec) EntryName() string {
	return fmt.Sprintf("goccl_%s_%s_w%d%s", s.Algo, s.DType, s.WorldSize, s.Scope.suffix())
}

// Generate returns the PTX module of the kernel: text without NUL bytes (the
// driver wants one appended), holding exactly one .entry named EntryName.
// The same spec always gives the same bytes.
func (s Spec) Generate() ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	tmpl, err := parsedTemplates()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, s.Algo.String(), newKernel(s)); err != nil {
		return nil, fmt.Errorf("generate %s for %s: %w", s.EntryName(), s.Target, err)
	}
	return squeezeBlankLines(buf.Bytes()), nil
}

//go:embed templates/*.ptx.tmpl
var templateFS embed.FS

// parsedTemplates parses the embedded templates once. An error here means a
// broken build of this package, which the tests catch; it is still returned
// rather than panicking.
var parsedTemplates = sync.OnceValues(func() (*template.Template, error) {
	t, err := template.New("ptx").Funcs(template.FuncMap{
		"add":  func(a, b int) int { return a + b },
		"mul":  func(a, b int) int { return a * b },
		"shl":  func(a, b int) int { return a << b },
		"args": args,
		"join": strings.Join,
		// abi: the constants of abi.go, for pieces that get an argument map rather than a kernel
		"abi": func() abiConsts { return baseABI },
	}).ParseFS(templateFS, "templates/*.ptx.tmpl")
	if err != nil {
		return nil, fmt.Errorf("parse embedded PTX templates: %w", err)
	}
	return t, nil
})

// args builds the map a template piece receives: key, value, key, value...
func args(kv ...any) (map[string]any, error) {
	if len(kv)%2 != 0 {
		return nil, fmt.Errorf("args: odd number of arguments %d", len(kv))
	}
	m := make(map[string]any, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		k, ok := kv[i].(string)
		if !ok {
			return nil, fmt.Errorf("args: key %v is not a string", kv[i])
		}
		m[k] = kv[i+1]
	}
	return m, nil
}

// kernel is what the templates see: everything that varies between kernels.
type kernel struct {
	Entry  string
	Algo   string
	DType  string // "bf16", "f16" or "f32"
	Target string // "sm_80" or "sm_90"
	PDL    bool   // programmatic dependent launch (griddepcontrol), sm_90 only
	Scope  string // "sys" or "gpu": the scope of the barriers' release, acquire and atomics
	// Counting: the barriers count arrivals with atomic adds (red.add) instead of storing
	// round numbers (ScopeGPU, ScopeSystemCounted)
	Counting bool
	WS       int
	Ranks    []int // 0..WS-1, the unrolled rank loops
	Rotated  bool  // inputs taken in the order rank, rank+1, ... (two-shot)
	// DeferRearm: push may leave the re-arm of its receive slots to the next call (see
	// templates/push.ptx.tmpl), from DeferRearmMinRanks ranks on
	DeferRearm bool
	// rowCache: the kernel keeps the thread's first vectors of a row in registers between
	// its passes (RowCache): the fused one-shot built with FusedSpec.RowCache, and the
	// single-rank RMSNorm kernel
	rowCache bool
	Elems    int // elements per 16-byte vector
	// LaneMask has the non-sign bits of every element of a 32-bit word set,
	// SignMask the sign bits, LowOnes the lowest bit of every element.
	LaneMask, SignMask, LowOnes string
	ABI                         abiConsts
}

// abiConsts hands the Go constants of abi.go to the templates, so the
// offsets, codes and phases are written down once.
type abiConsts struct {
	SelfCounter, PeerCounter, PushEpoch, PushPending, Call int
	// Lanes is the u32 counters per block (16*b + lane), PhaseSlots the
	// counters per phase of peer_counter (1024*ph + 16*b + rank).
	Lanes, PhaseSlots                       int
	CodeTimeout, CodeUnfilled, CodeMismatch int
	PhaseNone, PhaseEntry, PhaseMiddle      int
	PhaseExit, PhasePush                    int
	StaleAfterNs                            int
	FlagEarlyTrigger, FlagStageInput        int
	FlagEntryTrigger                        int
	PushParts                               int
	// PushHeader is the bytes of the call header at the start of a push receive slot,
	// PushTag the tag of its words.
	PushHeader, PushTag int
	// Done and Claim are the byte offsets of the error record's done and claim words.
	Done, Claim int
}

// baseABI is abiConsts without the values that depend on the world size.
var baseABI = abiConsts{
	SelfCounter: SelfCounterOffset, PeerCounter: PeerCounterOffset, PushEpoch: PushEpochOffset,
	PushPending: PushPendingOffset, Call: CallOffset,
	CodeTimeout: int(ErrCodeTimeout), CodeUnfilled: int(ErrCodeUnfilledSlot), CodeMismatch: int(ErrCodeMismatch),
	PhaseNone: int(PhaseNone), PhaseEntry: int(PhaseEntry), PhaseMiddle: int(PhaseMiddle),
	PhaseExit: int(PhaseExit), PhasePush: int(PhasePush), StaleAfterNs: StaleAfterNs,
	FlagEarlyTrigger: FlagEarlyTrigger, FlagStageInput: FlagStageInput, FlagEntryTrigger: FlagEntryTrigger, Lanes: MaxRanks, PhaseSlots: MaxBlocks * MaxRanks,
	PushHeader: PushHeaderBytes, PushTag: PushHeaderTag, Done: 4 * ErrWordDone, Claim: 4 * ErrWordClaim,
}

func newKernel(s Spec) *kernel {
	k := &kernel{
		Entry:      s.EntryName(),
		Algo:       s.Algo.String(),
		DType:      s.DType.String(),
		Target:     s.Target.String(),
		PDL:        s.Target == SM90,
		Scope:      s.Scope.PTX(),
		Counting:   s.Scope.Counted(),
		WS:         s.WorldSize,
		Rotated:    s.Algo == TwoShot,
		DeferRearm: s.Algo == Push && s.WorldSize >= DeferRearmMinRanks,
		Elems:      VectorBytes / s.DType.Size(),
		ABI:        baseABI,
	}
	k.ABI.PushParts = PushParts(s.WorldSize)
	for r := range s.WorldSize {
		k.Ranks = append(k.Ranks, r)
	}
	if s.DType.Size() == 4 {
		k.LaneMask, k.SignMask, k.LowOnes = "0x7FFFFFFF", "0x80000000", "0x00000001"
	} else {
		k.LaneMask, k.SignMask, k.LowOnes = "0x7FFF7FFF", "0x80008000", "0x00010001"
	}
	return k
}

// Packed is the register list of a rounded vector, as the "pack" piece leaves it.
func (k *kernel) Packed() string {
	if k.DType == "f32" {
		return "{%acc0, %acc1, %acc2, %acc3}"
	}
	return "{%o0, %o1, %o2, %o3}"
}

// Words lists the four 32-bit words of a vector.
func (k *kernel) Words() []int { return []int{0, 1, 2, 3} }

// PackedWords names the four 32-bit registers of a rounded vector (see Packed).
func (k *kernel) PackedWords() []string {
	if k.DType == "f32" {
		return []string{"%acc0", "%acc1", "%acc2", "%acc3"}
	}
	return []string{"%o0", "%o1", "%o2", "%o3"}
}

// VecWords names the four registers of the r-th loaded vector.
func (k *kernel) VecWords(r int) []string { return vectorWords("%v", r) }

// StageVec names the four registers of the u-th vector of a pass of the one-shot "stage"
// copy (%c<4u> .. %c<4u+3>).
func (k *kernel) StageVec(u int) []string { return vectorWords("%c", u) }

// vectorWords names the four registers prefix<4u> .. prefix<4u+3> that hold vector u of a
// register array.
func vectorWords(prefix string, u int) []string {
	return []string{fmt.Sprintf("%s%d", prefix, 4*u), fmt.Sprintf("%s%d", prefix, 4*u+1), fmt.Sprintf("%s%d", prefix, 4*u+2), fmt.Sprintf("%s%d", prefix, 4*u+3)}
}

// HalfWords reports whether an element is 16 bits, so that a message may end in the
// middle of a 32-bit word.
func (k *kernel) HalfWords() bool { return k.Elems == 8 }

// Vec is the register list of the r-th loaded vector, "{%v8, %v9, %v10, %v11}".
func (k *kernel) Vec(r int) string {
	return fmt.Sprintf("{%%v%d, %%v%d, %%v%d, %%v%d}", 4*r, 4*r+1, 4*r+2, 4*r+3)
}

// VecRef names the r-th loaded vector for the accumulate piece.
func (k *kernel) VecRef(r int) vecRef { return vecRef{k, r} }

// vecRef is the r-th of the ws vectors a thread loads per index.
type vecRef struct {
	*kernel
	R int
}

// Word is the register of word w of the vector.
func (v vecRef) Word(w int) string { return fmt.Sprintf("%%v%d", 4*v.R+w) }

// First reports whether the vector is the first term of the sum.
func (v vecRef) First() bool { return v.R == 0 }

// barrier is one of the four barriers of docs/kernel-abi.md.
type barrier struct {
	*kernel
	Name  string
	Phase int
	// Pre: bar.sync before the handshake ((1)); Post: bar.red.or after it ((6));
	// Acquire: release/acquire flags instead of volatile ones.
	Pre, Post, Acquire bool
	// Chained: an earlier barrier of the same kernel left this lane's round in %round, so
	// the round is that plus one, without reading the counter back from memory.
	Chained bool
	// Publish: thread 0 of block 0 writes this rank's call, tagged with the round, into
	// its call for the peers' call check (the entry barrier).
	Publish bool
	// Part: "" for the whole barrier; "arrive" or "wait" for its halves, in that order with
	// other work between (a chained barrier without release: the split exit barrier).
	// arrive has the bar.sync and the lanes' arrivals, wait the lanes' waits.
	Part string
	// Staged: the one-shot entry barrier, before which the kernel may have copied its input
	// into its own input slot (FlagStageInput, register %stage, whose copy ends with a
	// bar.sync). With %stage, lanes fence (acq_rel, the kernel's scope) before telling a peer,
	// so that the flag releases the block's copies, and their polls acquire the peers'.
	Staged bool
}

// Barrier returns the entry, staged entry (one-shot's), middle, exit or delivered barrier,
// or one half of the exit barrier ("exit arrive", "exit wait").
func (k *kernel) Barrier(name string) (barrier, error) {
	switch name {
	case "entry":
		return barrier{kernel: k, Name: name, Phase: int(PhaseEntry), Post: true, Publish: true}, nil
	case "staged entry":
		// the one-shot entry barrier: it also publishes the input that the kernel staged
		return barrier{kernel: k, Name: "entry", Phase: int(PhaseEntry), Post: true, Publish: true, Staged: true}, nil
	case "middle":
		return barrier{kernel: k, Name: name, Phase: int(PhaseMiddle), Pre: true, Post: true, Acquire: true, Chained: true}, nil
	case "exit":
		return barrier{kernel: k, Name: name, Phase: int(PhaseExit), Pre: true, Chained: true}, nil
	case "exit arrive", "exit wait":
		// the exit barrier in two halves (the fused one-shot's row cache build)
		return barrier{kernel: k, Name: "exit", Phase: int(PhaseExit), Pre: true, Chained: true, Part: strings.TrimPrefix(name, "exit ")}, nil
	case "delivered":
		// the direct two-shot's exit: its shards were written into the peers' outputs by this
		// kernel, so the flags carry them (release/acquire), like the middle barrier's
		return barrier{kernel: k, Name: name, Phase: int(PhaseExit), Pre: true, Acquire: true, Chained: true}, nil
	}
	return barrier{}, fmt.Errorf("unknown barrier %q", name)
}

// squeezeBlankLines drops the blank lines the template actions leave behind
// where two or more follow each other, so the output reads like hand-written
// PTX.
func squeezeBlankLines(src []byte) []byte {
	lines := strings.Split(string(src), "\n")
	out := lines[:0]
	blank := false
	for _, l := range lines {
		l = strings.TrimRight(l, " \t")
		if l == "" && blank {
			continue
		}
		blank = l == ""
		out = append(out, l)
	}
	return []byte(strings.Join(out, "\n"))
}
