package bootstrap

import (
	"context"
	"os"
	"path/filepath"
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
			name:    "multi-node",
			changes: map[string]string{"WORLD_SIZE": "16", "RANK": "10", "LOCAL_RANK": "2"},
			wantErr: "WORLD_SIZE=16 but LOCAL_WORLD_SIZE=4: the job spans several nodes",
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
			got, err := configFromEnv(with(tc.changes), "/tmp")
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
	} {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A file in the way shows which path FromEnv chose.
	path := filepath.Join(dir, "goccl-localhost-29500.sock")
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
}
