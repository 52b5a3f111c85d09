package collective

import (
	"errors"
	"fmt"
	"os"

	"github.com/goccl/goccl/internal/topology"
	"github.com/goccl/goccl/ptx"
)

var (
	// ErrInvalidArgument is returned, before anything is launched, for a call the
	// communicator cannot serve: bad size, alignment, pointer, dtype, stream or option.
	ErrInvalidArgument = errors.New("collective: invalid argument")
	// ErrClosed is returned by every call on a closed communicator.
	ErrClosed = errors.New("collective: communicator is closed")
	// ErrTimeout means a kernel's watchdog fired: a peer did not arrive in time. The
	// communicator is unusable afterwards; close it and build a new one.
	ErrTimeout = errors.New("collective: timed out waiting for a peer")
	// ErrUnfilledSlot means a kernel found a registration slot without its peers' pointers:
	// a graph was replayed before Capture exchanged its buffers.
	ErrUnfilledSlot = errors.New("collective: graph replayed before its buffers were exchanged")
	// ErrUnusable is returned by every call after an earlier asynchronous error.
	ErrUnusable = errors.New("collective: communicator is unusable after an earlier error")
	// ErrNotEligible means the GPUs cannot run goccl's all-reduce well or safely (no working
	// peer access between a pair, or more than two GPUs without a full NVLink mesh): hand the
	// work to NCCL. The error names the pair and the reason.
	ErrNotEligible = topology.ErrNotEligible
)

// MaxConnectionsEnv is the CUDA environment variable that sets how many hardware queues a
// process gets per GPU; virtual ranks need one per rank (see NewGroup).
const MaxConnectionsEnv = "CUDA_DEVICE_MAX_CONNECTIONS"

// KernelError is an error a kernel recorded in its error record, read back by the host.
// errors.Is matches ErrTimeout or ErrUnfilledSlot, and ErrUnusable.
type KernelError struct {
	Code  uint32 // ptx.ErrCode*
	Rank  int    // the rank whose kernel recorded it
	Block int    // thread block that recorded it
	Peer  int    // the rank that did not arrive, or whose slot was empty
	Phase uint32 // ptx.Phase*
	// SharedGPU: ranks of this process share a GPU (virtual ranks), where a timeout can also
	// come from two ranks' streams sharing a hardware queue (see NewGroup).
	SharedGPU bool
}

func (e *KernelError) Error() string {
	switch e.Code {
	case ptx.ErrCodeTimeout:
		msg := fmt.Sprintf("collective: rank %d timed out in the %s waiting for rank %d (block %d): that rank never launched its all-reduce, is stuck, or died",
			e.Rank, phaseName(e.Phase), e.Peer, e.Block)
		if e.SharedGPU {
			msg += fmt.Sprintf("; with virtual ranks it can also be two ranks' streams sharing a hardware queue (%s=%q here; set it to 32 before the first CUDA call)",
				MaxConnectionsEnv, os.Getenv(MaxConnectionsEnv))
		}
		return msg
	case ptx.ErrCodeUnfilledSlot:
		return fmt.Sprintf("collective: rank %d found no pointer for rank %d in its registration slot (block %d): a captured graph was replayed before Capture finished exchanging buffers",
			e.Rank, e.Peer, e.Block)
	}
	return fmt.Sprintf("collective: rank %d: kernel error code %d (peer %d, block %d, %s)", e.Rank, e.Code, e.Peer, e.Block, phaseName(e.Phase))
}

// Is makes errors.Is work with the package's sentinels.
func (e *KernelError) Is(target error) bool {
	switch target {
	case ErrUnusable:
		return true
	case ErrTimeout:
		return e.Code == ptx.ErrCodeTimeout
	case ErrUnfilledSlot:
		return e.Code == ptx.ErrCodeUnfilledSlot
	}
	return false
}

func phaseName(p uint32) string {
	switch p {
	case ptx.PhaseEntry:
		return "entry barrier"
	case ptx.PhaseMiddle:
		return "middle barrier"
	case ptx.PhaseExit:
		return "exit barrier"
	case ptx.PhasePush:
		return "push receive"
	}
	return fmt.Sprintf("phase %d", p)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}
