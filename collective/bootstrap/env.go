package bootstrap

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SocketEnv names the environment variable that sets FromEnv's socket path (single node).
const SocketEnv = "GOCCL_BOOTSTRAP_SOCKET"

// AddrEnv names the environment variable that sets the host:port rank 0 listens at in
// FromEnv's TCP bootstrap (several nodes).
const AddrEnv = "GOCCL_BOOTSTRAP_ADDR"

// FromEnv joins the group described by the environment torchrun gives each process: RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, with the job token in
// $GOCCL_JOB_TOKEN (TokenEnv). On error it returns a nil Bootstrap.
//
// A job on one node (WORLD_SIZE equals LOCAL_WORLD_SIZE) uses NewUnix, with the token if set.
// The socket is $GOCCL_BOOTSTRAP_SOCKET when set, else
// SocketDir()/goccl-<MASTER_ADDR>-<MASTER_PORT>.sock: named after torch's store so that
// concurrent jobs on one node do not meet, in a directory other users cannot enter.
//
// A job on several nodes uses NewTCP, which needs the token on every rank. Rank 0 listens at
// $GOCCL_BOOTSTRAP_ADDR when set, else at MASTER_ADDR and port MASTER_PORT+1: torchrun's
// own store usually holds MASTER_PORT itself.
func FromEnv(ctx context.Context) (Bootstrap, error) {
	cfg, err := configFromEnv(os.Getenv, SocketDir)
	if err != nil {
		return nil, fmt.Errorf("bootstrap from environment: %w", err)
	}
	token := os.Getenv(TokenEnv)
	if cfg.addr != "" {
		return NewTCP(ctx, cfg.rank, cfg.size, cfg.addr, token, Options{})
	}
	return NewUnixWith(ctx, cfg.path, cfg.rank, cfg.size, token, Options{})
}

type envConfig struct {
	path       string // Unix socket, on one node
	addr       string // rank 0's host:port, on several
	rank, size int
}

func configFromEnv(getenv func(string) string, socketDir func() (string, error)) (envConfig, error) {
	socket, addr := getenv(SocketEnv), getenv(AddrEnv)
	names := []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
	var missing []string
	for _, n := range names[:4] {
		if getenv(n) == "" {
			missing = append(missing, n)
		}
	}
	var v [4]int
	if len(missing) == 0 {
		for i, n := range names[:4] {
			x, err := strconv.Atoi(getenv(n))
			if err != nil {
				return envConfig{}, fmt.Errorf("%s=%q is not an integer", n, getenv(n))
			}
			v[i] = x
		}
	}
	rank, size, localRank, localSize := v[0], v[1], v[2], v[3]
	multiNode := len(missing) == 0 && size != localSize
	// MASTER_* name the socket or rank 0's address, unless those are given.
	if (!multiNode && socket == "") || (multiNode && addr == "") {
		for _, n := range names[4:] {
			if getenv(n) == "" {
				missing = append(missing, n)
			}
		}
	}
	if len(missing) > 0 {
		return envConfig{}, fmt.Errorf("%s not set: FromEnv expects the variables torchrun sets (%s)",
			strings.Join(missing, ", "), strings.Join(names, ", "))
	}
	var port uint64
	if getenv("MASTER_PORT") != "" {
		p, err := strconv.ParseUint(getenv("MASTER_PORT"), 10, 16)
		if err != nil {
			return envConfig{}, fmt.Errorf("MASTER_PORT=%q is not a port number", getenv("MASTER_PORT"))
		}
		port = p
	}
	if multiNode {
		if localSize < 1 || localSize > size {
			return envConfig{}, fmt.Errorf("WORLD_SIZE=%d but LOCAL_WORLD_SIZE=%d: the launcher's environment is inconsistent", size, localSize)
		}
		if addr == "" {
			if port == 65535 {
				return envConfig{}, fmt.Errorf("MASTER_PORT=%d leaves no port above it for the bootstrap: set %s", port, AddrEnv)
			}
			addr = net.JoinHostPort(getenv("MASTER_ADDR"), strconv.FormatUint(port+1, 10))
		}
		return envConfig{addr: addr, rank: rank, size: size}, nil
	}
	if rank != localRank {
		return envConfig{}, fmt.Errorf("RANK=%d but LOCAL_RANK=%d in a single-node job: the launcher's environment is inconsistent",
			rank, localRank)
	}
	if socket == "" {
		dir, err := socketDir()
		if err != nil {
			return envConfig{}, err
		}
		socket = filepath.Join(dir, fmt.Sprintf("goccl-%s-%d.sock", fileSafe(getenv("MASTER_ADDR")), port))
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
