package collective_test

import (
	"os"
	"strings"
	"testing"

	"github.com/goccl/goccl/collective"
)

// TestMain gives the GPU tests' virtual ranks a hardware queue each (see NewGroup): CUDA reads
// the variable when it starts, so it is set before any test runs.
// The children of TestMultiProcess (one rank each, under MPS) must not get it: MPS serves every
// process's queues from one pool, which 32 per process exhausts.
func TestMain(m *testing.M) {
	if _, set := os.LookupEnv(collective.MaxConnectionsEnv); !set && os.Getenv(envMPRank) == "" {
		os.Setenv(collective.MaxConnectionsEnv, "32")
		raisedConnections = true
	}
	os.Exit(m.Run())
}

// raisedConnections is set when TestMain set the variable (the user had not).
var raisedConnections bool

// childEnv is this process's environment for a child process of a test, without the queue
// count that TestMain added.
func childEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !raisedConnections || !strings.HasPrefix(kv, collective.MaxConnectionsEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}
