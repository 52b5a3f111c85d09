package collective_test

import (
	"os"
	"testing"

	"github.com/goccl/goccl/collective"
)

// TestMain gives the GPU tests' virtual ranks a hardware queue each (see NewGroup): CUDA reads
// the variable when it starts, so it is set before any test runs.
func TestMain(m *testing.M) {
	if _, set := os.LookupEnv(collective.MaxConnectionsEnv); !set {
		os.Setenv(collective.MaxConnectionsEnv, "32")
	}
	os.Exit(m.Run())
}
