package nccl

import (
	"fmt"
	"os"
	"testing"
)

// childEnv selects a child role when the test binary re-executes itself for the
// multi-process GPU test; see runChild.
const childEnv = "GOCCL_NCCL_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		if err := runChild(role); err != nil {
			fmt.Fprintf(os.Stderr, "child %s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if builtFakes.dir != "" {
		os.RemoveAll(builtFakes.dir)
	}
	os.Exit(code)
}
