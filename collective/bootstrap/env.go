package bootstrap

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SocketEnv names the environment variable that sets FromEnv's socket path.
const SocketEnv = "GOCCL_BOOTSTRAP_SOCKET"

// FromEnv is NewUnix configured from the environment torchrun gives each process: RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. It is single-node:
// a job whose WORLD_SIZE is not its LOCAL_WORLD_SIZE spans nodes, which is NCCL's job, and is
// refused. The socket is $GOCCL_BOOTSTRAP_SOCKET when set, else
// os.TempDir()/goccl-<MASTER_ADDR>-<MASTER_PORT>.sock: a file next to torch's TCP store, named
// after it so that concurrent jobs on one node do not meet, without taking its port.
func FromEnv(ctx context.Context) (Bootstrap, error) {
	cfg, err := configFromEnv(os.Getenv, os.TempDir())
	if err != nil {
		return nil, fmt.Errorf("bootstrap from environment: %w", err)
	}
	return NewUnix(ctx, cfg.path, cfg.rank, cfg.size)
}

type envConfig struct {
	path       string
	rank, size int
}

func configFromEnv(getenv func(string) string, tempDir string) (envConfig, error) {
	socket := getenv(SocketEnv)
	names := []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
	if socket != "" {
		names = names[:4] // MASTER_* only name the socket
	}
	var missing []string
	for _, n := range names {
		if getenv(n) == "" {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return envConfig{}, fmt.Errorf("%s not set: FromEnv expects the variables torchrun sets (%s)",
			strings.Join(missing, ", "), strings.Join(names, ", "))
	}
	var v [4]int
	for i, n := range names[:4] {
		x, err := strconv.Atoi(getenv(n))
		if err != nil {
			return envConfig{}, fmt.Errorf("%s=%q is not an integer", n, getenv(n))
		}
		v[i] = x
	}
	rank, size, localRank, localSize := v[0], v[1], v[2], v[3]
	if size != localSize {
		return envConfig{}, fmt.Errorf("WORLD_SIZE=%d but LOCAL_WORLD_SIZE=%d: the job spans several nodes, and goccl's bootstrap is single-node (multi-node collectives are NCCL's job)",
			size, localSize)
	}
	if rank != localRank {
		return envConfig{}, fmt.Errorf("RANK=%d but LOCAL_RANK=%d in a single-node job: the launcher's environment is inconsistent",
			rank, localRank)
	}
	if socket == "" {
		port, err := strconv.ParseUint(getenv("MASTER_PORT"), 10, 16)
		if err != nil {
			return envConfig{}, fmt.Errorf("MASTER_PORT=%q is not a port number", getenv("MASTER_PORT"))
		}
		socket = filepath.Join(tempDir, fmt.Sprintf("goccl-%s-%d.sock", fileSafe(getenv("MASTER_ADDR")), port))
	}
	if err := checkSocketPath(socket); err != nil {
		return envConfig{}, fmt.Errorf("%w (set %s, or a shorter TMPDIR)", err, SocketEnv)
	}
	return envConfig{path: socket, rank: rank, size: size}, nil
}

// fileSafe maps an address (host name, IPv4 or IPv6) to a file name part.
func fileSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '_'
	}, s)
}
