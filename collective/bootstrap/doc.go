// Package bootstrap is how the ranks of a goccl communicator find each other during setup.
//
// Before ranks can reduce through each other's GPU memory they must trade a few facts: each
// rank's device and arena size, the CUDA IPC handle (64 bytes) of its arena, or, for memory
// allocated with the VMM API, a POSIX file descriptor for it. A Bootstrap carries exactly that:
// AllGather of small byte blobs, AllGatherFDs of open file descriptors, and Barrier. It is
// used during setup only; nothing here is on the all-reduce path.
//
// Which one to use:
//
//   - NewInProcess: every rank is a goroutine of one process (collective.NewGroup, one process
//     driving several GPUs or virtual ranks on one GPU). Descriptors are duplicated.
//   - NewUnix: one process per rank on one node, started by your own launcher. Rank 0 listens
//     on a Unix socket path all ranks agree on; descriptors travel as SCM_RIGHTS.
//   - FromEnv: NewUnix configured from torchrun's environment (RANK, WORLD_SIZE, ...).
//
// All of them are single-node: CUDA IPC and file descriptors do not cross machines, and
// several nodes are NCCL's job. The package targets Linux, as goccl does. A launcher with its
// own rendezvous (MPI, a key-value store) may implement Bootstrap itself; one that cannot move
// descriptors returns ErrFDPassingUnsupported from AllGatherFDs.
//
// Nothing waits longer than its context: every call fails when its context ends, naming the
// ranks it was waiting for where it knows them; a rank whose process dies makes the others fail at once
// with ErrPeerLost naming it; ranks that make different calls fail with ErrMismatch. After any
// failure a Bootstrap is unusable: Close it and start over.
//
// A two-process job, with the rank and the socket path from the command line (or use FromEnv
// under torchrun); the example of NewUnix runs both ranks in one process:
//
//	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
//	defer cancel()
//	b, err := bootstrap.NewUnix(ctx, "/tmp/myjob.sock", rank, 2)
//	if err != nil {
//		return err
//	}
//	defer b.Close()
//	handles, err := b.AllGather(ctx, myHandle[:]) // handles[r] is rank r's
package bootstrap
