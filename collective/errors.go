package collective

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/goccl/goccl/driver"
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
	// a graph was replayed before Capture exchanged its buffers, or after it was closed.
	ErrUnfilledSlot = errors.New("collective: graph replayed before its buffers were exchanged")
	// ErrCallMismatch means a kernel saw a peer make a different call (another element count,
	// element type or algorithm) at the same point of the ranks' sequences of calls: the
	// program issues different all-reduces on different ranks. The communicator is unusable
	// afterwards.
	ErrCallMismatch = errors.New("collective: ranks made different calls")
	// ErrUnusable is returned by every call after an earlier asynchronous error: a kernel
	// error (KernelError), or a CUDA error that left the context unusable
	// (driver.ErrContextLost, wrapped too). Close the communicator; after a lost context the
	// whole process must restart its CUDA work.
	ErrUnusable = errors.New("collective: communicator is unusable after an earlier error")
	// ErrNotEligible means the GPUs cannot run goccl's all-reduce well or safely (no working
	// peer access between a pair, or more than two GPUs without a full NVLink mesh): hand the
	// work to NCCL. The error names the pair and the reason.
	ErrNotEligible = topology.ErrNotEligible
)

// errNilComm is what the methods of a nil *Comm return: it matches ErrClosed, since a
// communicator that was never made takes no work, like one that was closed.
var errNilComm = fmt.Errorf("%w: nil *Comm (New or NewGroup failed, or was never called)", ErrClosed)

// errNilHandle is what the methods of a nil or zero *Graph or *Registration return.
func errNilHandle(what string) error {
	return fmt.Errorf("%w: nil or zero %s (made by no Capture or Register)", ErrClosed, what)
}

// MaxConnectionsEnv is the CUDA environment variable that sets how many hardware queues a
// process gets per GPU; virtual ranks need one per rank (see NewGroup).
const MaxConnectionsEnv = "CUDA_DEVICE_MAX_CONNECTIONS"

// defaultConnections is the number of hardware queues CUDA gives a process per GPU when
// MaxConnectionsEnv is not set.
const defaultConnections = 8

// contextHint is what to add to the error of a context the driver refused with err: under MPS
// the server takes every client process's hardware queues (MaxConnectionsEnv) out of the
// GPU's fixed number, and refuses a process it has none left for with
// CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED or CUDA_ERROR_OUT_OF_MEMORY. On an H200 under MPS,
// four processes of one rank each with CUDA_DEVICE_MAX_CONNECTIONS=32 got both errors, and
// started without it. Empty where the variable does not ask for more than CUDA's default.
func contextHint(err error) string {
	n, convErr := strconv.Atoi(os.Getenv(MaxConnectionsEnv))
	if convErr != nil || n <= defaultConnections || !errors.Is(err, driver.ErrMPSLimit) && !errors.Is(err, driver.ErrOutOfMemory) {
		return ""
	}
	return fmt.Sprintf(" (%s=%d here: under MPS every process's hardware queues count against the GPU's limit; a process with one rank needs no more than CUDA's default of %d: unset it for such processes, keep it only where a process runs virtual ranks)",
		MaxConnectionsEnv, n, defaultConnections)
}

// ErrorCode says what a kernel recorded: ptx.ErrCodeTimeout, ptx.ErrCodeUnfilledSlot or
// ptx.ErrCodeMismatch.
type ErrorCode = ptx.ErrCode

// Phase says where a kernel was when it recorded an error: ptx.PhaseEntry and the others.
type Phase = ptx.Phase

// Call describes one rank's call as a kernel saw it (element count, type, algorithm).
type Call = ptx.Call

// KernelError is an error a kernel recorded in its error record, read back by the host.
// errors.Is matches ErrTimeout, ErrUnfilledSlot or ErrCallMismatch, and ErrUnusable.
type KernelError struct {
	Code  ErrorCode // what went wrong: a timeout, an unfilled slot or a call mismatch
	Rank  int       // the rank whose kernel recorded it
	Block int       // thread block that recorded it
	Peer  int       // the rank that did not arrive, whose slot was empty, or whose call differs
	Phase Phase     // where the kernel was: which barrier, or push's receive
	// Mine and Theirs are the two calls of a mismatch (Code ptx.ErrCodeMismatch): the
	// recording rank's and the peer's.
	Mine, Theirs Call
	// SharedGPU: ranks of this process share a GPU (virtual ranks), where a timeout can also
	// come from two ranks' streams sharing a hardware queue (see NewGroup).
	SharedGPU bool
}

// Error says what the kernel recorded, naming the ranks, the phase and, for a mismatch, both
// calls.
func (e *KernelError) Error() string {
	switch e.Code {
	case ptx.ErrCodeTimeout:
		msg := fmt.Sprintf("collective: rank %d timed out in the %s waiting for rank %d (block %d): that rank never launched its all-reduce, is stuck, or died",
			e.Rank, e.Phase, e.Peer, e.Block)
		if e.SharedGPU {
			msg += fmt.Sprintf("; with virtual ranks it can also be two ranks' streams sharing a hardware queue (%s=%q here; set it to 32 before the first CUDA call)",
				MaxConnectionsEnv, os.Getenv(MaxConnectionsEnv))
		}
		return msg
	case ptx.ErrCodeUnfilledSlot:
		return fmt.Sprintf("collective: rank %d found no pointer for rank %d in its registration slot (block %d): a captured graph was replayed before Capture finished exchanging buffers, or after it was closed",
			e.Rank, e.Peer, e.Block)
	case ptx.ErrCodeMismatch:
		return fmt.Sprintf("collective: ranks made different calls: rank %d issued %v while rank %d issued %v (seen by rank %d in the %s, block %d): every rank must issue the same all-reduces in the same order",
			e.Rank, e.Mine, e.Peer, e.Theirs, e.Rank, e.Phase, e.Block)
	}
	return fmt.Sprintf("collective: rank %d: kernel error %v (peer %d, block %d, %s)", e.Rank, e.Code, e.Peer, e.Block, e.Phase)
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
	case ErrCallMismatch:
		return e.Code == ptx.ErrCodeMismatch
	}
	return false
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// fail makes err the communicator's sticky failure when it left the CUDA context unusable,
// and returns the error the caller should see: err itself, or the failure that explains it.
func (c *Comm) fail(err error) error {
	if errors.Is(err, driver.ErrContextLost) {
		if c.failed == nil {
			c.failed = fmt.Errorf("%w: %w", ErrUnusable, err)
		}
		return c.failed
	}
	return err
}
