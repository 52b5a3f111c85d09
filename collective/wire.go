package collective

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/goccl/goccl/memory"
)

// rankFacts is the fixed-size part of what every rank tells the others at init.
type rankFacts struct {
	PID int64 // for messages; Process tells processes apart
	// Process is the rank's memory.ProcessID: ranks with the same one share a process (and
	// use each other's pointers as they are), which equal PIDs do not prove across PID
	// namespaces (containers)
	Process     uint64
	Device      int64 // CUDA ordinal in its process
	UUID        [16]byte
	Host        [16]byte // hostID: ranks on other hosts cannot map each other's memory
	Custom      int64    // 1 when the rank could run the custom kernels
	SMs         int64
	BlocksPerSM int64
	Major       int64 // compute capability
	// The options every rank must agree on.
	Blocks, PushBlocks, ThreadsPerBlock, MaxBytes, PushMaxBytes, Algorithm int64
	// SystemScope is 1 when the rank was created with Options.SystemScope: the scope picks the
	// barrier protocol, which every rank must share.
	SystemScope int64
	// FlagBarriers is 1 with Options.FlagBarriers, which picks the protocol too.
	FlagBarriers int64
	NCCL         int64 // Options.NCCL
	// Scope is the ptx.Scope the rank chose (the second exchange only): every rank must
	// choose the same.
	Scope int64
	// Tune is the digest of the tuning table sections the rank loaded (zero: none); ranks
	// use a table only if every digest is the same (adoptTuning).
	Tune [16]byte
}

// rankInfo is what every rank tells the others at init.
type rankInfo struct {
	rankFacts
	Arena memory.Descriptor
}

func (ri rankInfo) marshal() ([]byte, error) {
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, ri.rankFacts); err != nil {
		return nil, err
	}
	arena, err := ri.Arena.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b.Write(arena)
	return b.Bytes(), nil
}

func unmarshalRankInfo(p []byte) (rankInfo, error) {
	var ri rankInfo
	r := bytes.NewReader(p)
	if err := binary.Read(r, binary.LittleEndian, &ri.rankFacts); err != nil {
		return ri, fmt.Errorf("malformed rank info (do all ranks run the same goccl version?): %w", err)
	}
	if err := ri.Arena.UnmarshalBinary(p[len(p)-r.Len():]); err != nil {
		return ri, err
	}
	return ri, nil
}

// agree checks that every rank passed the same options: different grids or buffer sizes would
// make the kernels wait for blocks that never come, or read past buffers.
func agree(infos []rankInfo, me int) error {
	type agreed struct {
		Blocks, PushBlocks, ThreadsPerBlock, MaxBytes, PushMaxBytes, Algorithm, SystemScope, FlagBarriers, NCCL int64
	}
	pick := func(f rankFacts) agreed {
		return agreed{f.Blocks, f.PushBlocks, f.ThreadsPerBlock, f.MaxBytes, f.PushMaxBytes, f.Algorithm, f.SystemScope, f.FlagBarriers, f.NCCL}
	}
	mine := pick(infos[me].rankFacts)
	for r, ri := range infos {
		if pick(ri.rankFacts) != mine {
			return invalid("rank %d was created with different options (Blocks, PushBlocks, ThreadsPerBlock, MaxBytes, PushMaxBytes, Algorithm, SystemScope, FlagBarriers, NCCL) than rank %d: all ranks must pass the same", r, me)
		}
	}
	return nil
}

// checkArena refuses the arena descriptor that rank r sent unless it describes an arena laid
// out as this rank's: the same sharing kind (Options.IPC, which decides whether the ranks
// exchange file descriptors next: ranks that disagree would wait for each other), exactly
// total bytes (every offset the kernels use in a peer's arena comes from this rank's layout,
// so a smaller arena, from a rank of another goccl version or a corrupt message, would be
// written past its end), from its start, and for VMM a mapping that covers it.
func checkArena(r, me int, d memory.Descriptor, kind memory.Kind, total uint64) error {
	switch {
	case d.Kind != kind:
		return invalid("rank %d shares its memory as %s and rank %d as %s: every rank must pass the same Options.IPC", r, kindName(d.Kind), me, kindName(kind))
	case d.Size != total:
		return fmt.Errorf("the arena of rank %d is %d bytes, rank %d's %d bytes: do all ranks run the same goccl version?", r, d.Size, me, total)
	case d.Offset != 0:
		return fmt.Errorf("the arena of rank %d starts at offset %d of its allocation, not 0: do all ranks run the same goccl version?", r, d.Offset)
	case d.Kind == memory.VMM && d.Mapped < d.Size:
		return fmt.Errorf("the arena of rank %d maps %d bytes, fewer than its %d: do all ranks run the same goccl version?", r, d.Mapped, d.Size)
	}
	return nil
}

// kindName names a memory.Kind as Options.IPC spells it.
func kindName(k memory.Kind) string {
	switch k {
	case memory.LegacyIPC:
		return "memory.LegacyIPC"
	case memory.VMM:
		return "memory.VMM"
	}
	return fmt.Sprintf("memory.Kind(%d)", int(k))
}

// ranksPerGPU is the largest number of ranks that share one GPU.
func ranksPerGPU(infos []rankInfo) int {
	count := map[[16]byte]int{}
	most := 0
	for _, ri := range infos {
		count[ri.UUID]++
		most = max(most, count[ri.UUID])
	}
	return most
}

// Exchanges that can fail on one rank (Register, Capture) carry the outcome in front of the
// payload, so that one rank's refusal reaches the others at once instead of leaving them
// waiting for a blob that never comes.
const (
	exchangeOK     byte = 0
	exchangeFailed byte = 1
)

// maxRefusalBytes bounds the reason a rank sends with a failed exchange.
const maxRefusalBytes = 1024

// truncate cuts s to at most n bytes.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// withStatus prefixes payload with the outcome of this rank's part: ok, or refused with the
// text of failure.
func withStatus(payload []byte, failure error) []byte {
	if failure != nil {
		return append([]byte{exchangeFailed}, truncate(failure.Error(), maxRefusalBytes)...)
	}
	return append([]byte{exchangeOK}, payload...)
}

// RefusedError is returned on every rank when one or more ranks refused their part of a
// collective setup call (Register, Capture): it names each refusing rank and its reason. The
// communicator stays usable; nothing was registered.
type RefusedError struct {
	// Reasons maps each refusing rank to the error it met.
	Reasons map[int]string
}

// Error names each refusing rank with its reason, in rank order.
func (e *RefusedError) Error() string {
	ranks := slices.Sorted(maps.Keys(e.Reasons))
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = fmt.Sprintf("rank %d refused: %s", r, e.Reasons[r])
	}
	return strings.Join(parts, "; ")
}

// splitStatus reads the outcome in front of every rank's blob. It returns the payloads, or a
// *RefusedError when any rank refused.
func splitStatus(blobs [][]byte) ([][]byte, error) {
	payloads := make([][]byte, len(blobs))
	var refused *RefusedError
	for r, b := range blobs {
		switch {
		case len(b) == 0:
			return nil, fmt.Errorf("empty exchange blob from rank %d (do all ranks run the same goccl version?)", r)
		case b[0] == exchangeOK:
			payloads[r] = b[1:]
		case b[0] == exchangeFailed:
			if refused == nil {
				refused = &RefusedError{Reasons: map[int]string{}}
			}
			refused.Reasons[r] = string(b[1:])
		default:
			return nil, fmt.Errorf("unknown exchange status %d from rank %d (do all ranks run the same goccl version?)", b[0], r)
		}
	}
	if refused != nil {
		return nil, refused
	}
	return payloads, nil
}
