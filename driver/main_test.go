package driver

import (
	"fmt"
	"os"
	"testing"
)

// childEnv selects a child role when the test binary re-executes itself for the two-process
// tests (IPC handles, VMM file descriptors); see runChild.
const childEnv = "GOCCL_DRIVER_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		if err := runChild(role); err != nil {
			fmt.Fprintf(os.Stderr, "child %s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
