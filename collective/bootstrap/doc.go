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
//   - NewUnix (NewUnixWith to pass the token and options): one process per rank on one node,
//     started by your own launcher. Rank 0 listens on a Unix socket path all ranks agree on
//     (SocketDir gives a private directory for it); descriptors travel as SCM_RIGHTS.
//   - NewTCP: one process per rank on several nodes. Rank 0 listens at host:port. TCP cannot
//     carry descriptors: AllGatherFDs fails with ErrFDPassingUnsupported (a job across nodes
//     reduces through NCCL, not through shared GPU memory).
//   - FromEnv: NewUnix or NewTCP configured from torchrun's environment (RANK, WORLD_SIZE,
//     ...), with the job token in GOCCL_JOB_TOKEN.
//
// A launcher with its own rendezvous (MPI, a key-value store) may implement Bootstrap itself;
// one that cannot move descriptors returns ErrFDPassingUnsupported from AllGatherFDs.
//
// Nothing waits longer than its context: every call fails when its context ends, naming the
// ranks it was waiting for where it knows them; a rank whose process dies makes the others fail
// at once with ErrPeerLost naming it; ranks that make different calls fail with ErrMismatch.
// After any failure a Bootstrap is unusable: Close it and start over. A constructor that fails
// returns a nil Bootstrap.
//
// # Who can join
//
// The socket bootstraps (NewUnix, NewTCP) authenticate their peers when they join:
//
//   - The job token (TokenEnv, GOCCL_JOB_TOKEN; a launcher makes one per job, as arsmoke
//     --procs does). Each side proves that it knows the token with an HMAC-SHA256 over both
//     sides' fresh nonces, the joining rank's number and the group size; the token never
//     travels and proofs are compared in constant time. Rank 0 admits only processes that
//     prove it, and a rank accepts rank 0 only once rank 0 has proven it: a process that
//     listens at the path or port first is named in the ranks' error, not joined. NewTCP
//     refuses to start without a token of at least MinTCPToken bytes.
//   - The peer's user, on Unix sockets: the socket file is made 0600 before anyone can
//     connect, and both ends check with SO_PEERCRED that the other runs as this process's
//     user. SocketDir is a directory of this user's, mode 0700, that FromEnv uses: other users
//     can neither reach its sockets nor plant a socket or link there.
//   - Bounds: a handshake frame is at most 4 KiB, a blob at most MaxBlob, an AllGather at
//     most MaxGather, a group at most MaxRanks, and each frame's size and descriptor count are
//     checked before anything is allocated or received. Descriptors attached where none, or
//     fewer, are expected are closed at once and the message refused. At most
//     Options.MaxPending connections handshake at once, each within Options.HandshakeTimeout.
//
// A connection that fails these checks (another user, not this protocol, an oversized frame,
// a wrong or missing token) gets a short notice of why, is closed and does not fail the group:
// the real ranks still join, and if the group fails anyway, rank 0's error names the
// connections it refused. A process that proves the token but does not fit (another group
// size, a rank already taken) fails the group at once, on every rank.
//
// What is not protected: without a token (NewUnix with GOCCL_JOB_TOKEN unset), any process of
// the same user that reaches the socket can join a job, take a rank's place or pose as rank 0,
// and errors about refused connections say so. After the handshake, traffic is neither
// encrypted nor integrity-checked: over TCP, use a network where nobody can tamper with
// connections. Anyone who can reach rank 0 can hold handshake slots and delay the join until
// the context ends (a denial of service, not a way in). NewInProcess has no peers to check.
//
// A two-process job on one node, with the rank from the command line and the token from the
// launcher (or use FromEnv under torchrun); the example of NewUnix runs both ranks in one
// process:
//
//	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
//	defer cancel()
//	dir, err := bootstrap.SocketDir()
//	if err != nil {
//		return err
//	}
//	b, err := bootstrap.NewUnix(ctx, filepath.Join(dir, "myjob.sock"), rank, 2) // token: $GOCCL_JOB_TOKEN
//	if err != nil {
//		return err
//	}
//	defer b.Close()
//	handles, err := b.AllGather(ctx, myHandle[:]) // handles[r] is rank r's
package bootstrap
