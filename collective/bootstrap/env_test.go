package bootstrap

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigFromEnv(t *testing.T) {
	torchrun := map[string]string{
		"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
	}
	with := func(changes map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := changes[k]; ok {
				return v
			}
			return torchrun[k]
		}
	}
	for _, tc := range []struct {
		name    string
		changes map[string]string
		want    envConfig
		wantErr string
	}{
		{name: "torchrun", want: envConfig{path: "/tmp/goccl-127.0.0.1-29500.sock", rank: 2, size: 4}},
		{
			name:    "socket variable wins, MASTER_* not needed",
			changes: map[string]string{SocketEnv: "/run/job.sock", "MASTER_ADDR": "", "MASTER_PORT": ""},
			want:    envConfig{path: "/run/job.sock", rank: 2, size: 4},
		},
		{
			name:    "address made file-safe",
			changes: map[string]string{"MASTER_ADDR": "::1/../x"},
			want:    envConfig{path: "/tmp/goccl-__1_.._x-29500.sock", rank: 2, size: 4},
		},
		{
			name:    "missing",
			changes: map[string]string{"RANK": "", "MASTER_PORT": ""},
			wantErr: "RANK, MASTER_PORT not set",
		},
		{
			name:    "multi-node: TCP next to torch's store",
			changes: map[string]string{"WORLD_SIZE": "16", "RANK": "10", "LOCAL_RANK": "2"},
			want:    envConfig{addr: "127.0.0.1:29501", rank: 10, size: 16},
		},
		{
			name:    "multi-node: address variable wins, MASTER_* not needed",
			changes: map[string]string{"WORLD_SIZE": "16", "RANK": "10", AddrEnv: "[::1]:4000", "MASTER_ADDR": "", "MASTER_PORT": ""},
			want:    envConfig{addr: "[::1]:4000", rank: 10, size: 16},
		},
		{
			name:    "multi-node: IPv6 master",
			changes: map[string]string{"WORLD_SIZE": "8", "MASTER_ADDR": "fe80::1"},
			want:    envConfig{addr: "[fe80::1]:29501", rank: 2, size: 8},
		},
		{
			name:    "multi-node: no port above MASTER_PORT",
			changes: map[string]string{"WORLD_SIZE": "8", "MASTER_PORT": "65535"},
			wantErr: "set GOCCL_BOOTSTRAP_ADDR",
		},
		{
			name:    "multi-node: local world larger than the world",
			changes: map[string]string{"WORLD_SIZE": "2"},
			wantErr: "WORLD_SIZE=2 but LOCAL_WORLD_SIZE=4: the launcher's environment is inconsistent",
		},
		{name: "rank not local rank", changes: map[string]string{"RANK": "3"}, wantErr: "RANK=3 but LOCAL_RANK=2"},
		{name: "not a number", changes: map[string]string{"WORLD_SIZE": "four"}, wantErr: `WORLD_SIZE="four" is not an integer`},
		{name: "bad port", changes: map[string]string{"MASTER_PORT": "../../etc"}, wantErr: "not a port number"},
		{
			name:    "socket path too long",
			changes: map[string]string{SocketEnv: "/" + strings.Repeat("x", 200)},
			wantErr: "set GOCCL_BOOTSTRAP_SOCKET, or a shorter TMPDIR",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := configFromEnv(with(tc.changes), func() (string, error) { return "/tmp", nil })
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestFromEnv(t *testing.T) {
	dir, err := os.MkdirTemp("", "gbs")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	for k, v := range map[string]string{
		"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
		"MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "TMPDIR": dir, SocketEnv: "",
		"XDG_RUNTIME_DIR": "", TokenEnv: "",
	} {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A file in the way shows which path FromEnv chose.
	path := filepath.Join(dir, fmt.Sprintf("goccl-%d", os.Getuid()), "goccl-localhost-29500.sock")
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, err = FromEnv(ctx)
	require.ErrorContains(t, err, path+" exists and is not a socket")
	require.NoError(t, os.Remove(path))

	b, err := FromEnv(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, b.Rank())
	assert.Equal(t, 1, b.Size())
	blobs, err := b.AllGather(ctx, []byte("solo"))
	require.NoError(t, err)
	assert.Equal(t, [][]byte{[]byte("solo")}, blobs)
	require.NoError(t, b.Close())
	assert.NoFileExists(t, path)

	t.Setenv("LOCAL_WORLD_SIZE", "2")
	_, err = FromEnv(ctx)
	require.ErrorContains(t, err, "bootstrap from environment: WORLD_SIZE=1 but LOCAL_WORLD_SIZE=2")

	// Several nodes: TCP, which refuses to start without a token.
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("LOCAL_WORLD_SIZE", "1")
	b, err = FromEnv(ctx)
	require.ErrorContains(t, err, "a TCP bootstrap needs a job token")
	require.True(t, b == nil, "a failed FromEnv returns a nil interface, not a typed nil")
}

// TestFromEnvTCP forms a two-rank multi-node group from the environment over loopback; the
// other rank plays its part with NewTCP, as another node's FromEnv would.
func TestFromEnvTCP(t *testing.T) {
	port := freePort(t)
	token := testToken()
	for k, v := range map[string]string{
		"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(port - 1), AddrEnv: "", TokenEnv: token,
	} {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	boots := make([]Bootstrap, 2)
	errs := eachRank(2, func(r int) (err error) {
		if r == 0 {
			boots[0], err = FromEnv(ctx)
		} else {
			boots[1], err = NewTCP(ctx, 1, 2, fmt.Sprintf("127.0.0.1:%d", port), token, Options{})
		}
		return err
	})
	defer closeAll(boots)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for r, err := range eachRank(2, func(r int) error { return boots[r].Barrier(ctx) }) {
		require.NoError(t, err, "rank %d", r)
	}
}
