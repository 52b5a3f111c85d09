package bootstrap

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The multi-process tests re-run this test binary as the other ranks: TestHelperProcess,
// with the scenario in the environment, plays one rank and prints its outcome as one
// "RESULT {json}" line. The parent test plays rank 0 itself.
const (
	envScenario = "GOCCL_BOOTSTRAP_TEST_SCENARIO"
	envPath     = "GOCCL_BOOTSTRAP_TEST_PATH"
	envRank     = "GOCCL_BOOTSTRAP_TEST_RANK"
	envSize     = "GOCCL_BOOTSTRAP_TEST_SIZE"
	envTimeout  = "GOCCL_BOOTSTRAP_TEST_TIMEOUT"
	// envTransport is "tcp" for NewTCP at envPath (host:port), else NewUnix at envPath.
	envTransport = "GOCCL_BOOTSTRAP_TEST_TRANSPORT"
	resultTag    = "RESULT "
	// diesExit is the exit code of the rank that dies on purpose in the "dies" scenario.
	diesExit = 3
)

// outcome is what a rank reports.
type outcome struct {
	Rank      int
	Err       string
	Deadline  bool // errors.Is(err, context.DeadlineExceeded)
	PeerLost  bool
	Mismatch  bool
	Handshake bool
	Elapsed   time.Duration
}

// playRank is one rank of a scenario, in whichever process it runs.
// Every rank takes the job token from the environment (TokenEnv), as under a launcher.
func playRank(transport, scenario, path string, rank, size int, timeout time.Duration) outcome {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := func() error {
		var b Bootstrap
		var err error
		if transport == "tcp" {
			b, err = NewTCP(ctx, rank, size, path, os.Getenv(TokenEnv), Options{})
		} else {
			b, err = NewUnix(ctx, path, rank, size)
		}
		if err != nil {
			return err
		}
		defer b.Close()
		switch scenario {
		case "exchange":
			// 90 fds per rank: a peer receives 270, more than one message holds.
			return exerciseRank(ctx, b, 90)
		case "join":
			return b.Barrier(ctx)
		case "dies":
			if _, err := b.AllGather(ctx, blobFor(rank)); err != nil {
				return err
			}
			if rank == 2 {
				os.Exit(diesExit) // no Close, no goodbye: a crash
			}
			return b.Barrier(ctx)
		case "mismatch":
			if rank == 2 {
				return b.Barrier(ctx)
			}
			_, err := b.AllGather(ctx, blobFor(rank))
			return err
		}
		return fmt.Errorf("unknown scenario %q", scenario)
	}()
	o := outcome{Rank: rank, Elapsed: time.Since(start)}
	if err != nil {
		o.Err = err.Error()
		o.Deadline = errors.Is(err, context.DeadlineExceeded)
		o.PeerLost = errors.Is(err, ErrPeerLost)
		o.Mismatch = errors.Is(err, ErrMismatch)
		o.Handshake = errors.Is(err, ErrHandshake)
	}
	return o
}

func TestHelperProcess(t *testing.T) {
	scenario := os.Getenv(envScenario)
	if scenario == "" {
		t.Skip("a rank of the multi-process tests; runs only when they start it")
	}
	rank, err1 := strconv.Atoi(os.Getenv(envRank))
	size, err2 := strconv.Atoi(os.Getenv(envSize))
	timeout, err3 := time.ParseDuration(os.Getenv(envTimeout))
	require.NoError(t, errors.Join(err1, err2, err3))
	o := playRank(os.Getenv(envTransport), scenario, os.Getenv(envPath), rank, size, timeout)
	line, err := json.Marshal(o)
	require.NoError(t, err)
	fmt.Printf("%s%s\n", resultTag, line)
}

// child is a rank running in its own process.
type child struct {
	rank   int
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
}

func startChild(t *testing.T, run scenarioRun, scenario, path string, rank, size int, timeout time.Duration) *child {
	c := &child{rank: rank}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=60s")
	c.cmd.Env = append(os.Environ(),
		envTransport+"="+run.transport,
		envScenario+"="+scenario,
		envPath+"="+path,
		envRank+"="+strconv.Itoa(rank),
		envSize+"="+strconv.Itoa(size),
		envTimeout+"="+timeout.String(),
	)
	if token, ok := run.tokens[rank]; ok {
		c.cmd.Env = append(c.cmd.Env, TokenEnv+"="+token) // the last one counts
	}
	c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
	require.NoError(t, c.cmd.Start())
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	return c
}

// wait waits for the child to exit with code want and returns its outcome (none when it
// died on purpose).
func (c *child) wait(t *testing.T, want int) outcome {
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-done
		t.Fatalf("rank %d hung; stdout:\n%s\nstderr:\n%s", c.rank, &c.stdout, &c.stderr)
	}
	require.Equal(t, want, c.cmd.ProcessState.ExitCode(), "rank %d exit code; stdout:\n%s\nstderr:\n%s",
		c.rank, &c.stdout, &c.stderr)
	var o outcome
	found := false
	for sc := bufio.NewScanner(&c.stdout); sc.Scan(); {
		if line, ok := strings.CutPrefix(sc.Text(), resultTag); ok {
			require.NoError(t, json.Unmarshal([]byte(line), &o))
			found = true
		}
	}
	if want == 0 {
		require.True(t, found, "rank %d printed no result; stdout:\n%s\nstderr:\n%s", c.rank, &c.stdout, &c.stderr)
	}
	return o
}

// scenarioRun says how a scenario runs.
type scenarioRun struct {
	transport string      // "tcp" or "" for a Unix socket
	exits     map[int]int // exit codes other than 0, by rank
	absent    []int       // ranks never started
	tokens    map[int]string
}

// runScenario plays rank 0 here and ranks 1..size-1 (except those in absent) in child
// processes, over a Unix socket. It returns every rank's outcome by rank; a dead or absent
// rank's is zero.
func runScenario(t *testing.T, scenario string, size int, timeout time.Duration, exits map[int]int, absent ...int) []outcome {
	return runScenarioWith(t, scenarioRun{exits: exits, absent: absent}, scenario, size, timeout)
}

// runScenarioWith is runScenario as run says. Every rank gets one job token through the
// environment, except the ranks given their own in run.tokens.
func runScenarioWith(t *testing.T, run scenarioRun, scenario string, size int, timeout time.Duration) []outcome {
	t.Setenv(TokenEnv, testToken())
	path := socketPath(t)
	if run.transport == "tcp" {
		path = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	}
	children := make(map[int]*child)
	for r := 1; r < size; r++ {
		if !slices.Contains(run.absent, r) {
			children[r] = startChild(t, run, scenario, path, r, size, timeout)
		}
	}
	outcomes := make([]outcome, size)
	outcomes[0] = playRank(run.transport, scenario, path, 0, size, timeout)
	for r, c := range children {
		outcomes[r] = c.wait(t, run.exits[r])
	}
	for _, o := range outcomes {
		t.Logf("rank %d after %v: %s", o.Rank, o.Elapsed.Round(time.Millisecond), o.Err)
	}
	return outcomes
}

func TestProcessesExchange(t *testing.T) {
	for _, o := range runScenario(t, "exchange", 4, 20*time.Second, nil) {
		assert.Empty(t, o.Err, "rank %d", o.Rank)
	}
}

func TestProcessNeverJoins(t *testing.T) {
	const timeout = time.Second
	out := runScenario(t, "join", 4, timeout, nil, 3)
	for _, o := range out[:3] {
		assert.True(t, o.Deadline, "rank %d: want a timeout error, got %q", o.Rank, o.Err)
		assert.Less(t, o.Elapsed, timeout+slack, "rank %d", o.Rank)
	}
	assert.Contains(t, out[0].Err, "ranks [3] to join")
}

func TestProcessDies(t *testing.T) {
	out := runScenario(t, "dies", 4, 20*time.Second, map[int]int{2: diesExit})
	for _, r := range []int{0, 1, 3} {
		o := out[r]
		assert.True(t, o.PeerLost, "rank %d: want ErrPeerLost, got %q", r, o.Err)
		assert.Contains(t, o.Err, "rank 2 closed its connection", "rank %d", r)
		assert.Less(t, o.Elapsed, 10*time.Second, "rank %d waited for its deadline instead of noticing the death", r)
	}
}

func TestProcessesMismatch(t *testing.T) {
	out := runScenario(t, "mismatch", 4, 20*time.Second, nil)
	for _, o := range out {
		assert.True(t, o.Mismatch, "rank %d: want ErrMismatch, got %q", o.Rank, o.Err)
		assert.Contains(t, o.Err, "rank 2 called Barrier #1 where rank 0 called AllGather #1", "rank %d", o.Rank)
	}
}

func TestTCPProcessesExchange(t *testing.T) {
	for _, o := range runScenarioWith(t, scenarioRun{transport: "tcp"}, "exchange", 4, 20*time.Second) {
		assert.Empty(t, o.Err, "rank %d", o.Rank)
	}
}

func TestTCPProcessNeverJoins(t *testing.T) {
	const timeout = time.Second
	out := runScenarioWith(t, scenarioRun{transport: "tcp", absent: []int{3}}, "join", 4, timeout)
	for _, o := range out[:3] {
		assert.True(t, o.Deadline, "rank %d: want a timeout error, got %q", o.Rank, o.Err)
		assert.Less(t, o.Elapsed, timeout+slack, "rank %d", o.Rank)
	}
	assert.Contains(t, out[0].Err, "ranks [3] to join")
}

// A process with another token cannot join; rank 0 names what it refused once the group
// gives up waiting for that rank.
func TestTCPTokenMismatch(t *testing.T) {
	const timeout = 2 * time.Second
	out := runScenarioWith(t, scenarioRun{transport: "tcp", tokens: map[int]string{2: testToken()}}, "join", 3, timeout)
	assert.True(t, out[2].Handshake, "rank 2: want ErrHandshake, got %q", out[2].Err)
	assert.Contains(t, out[2].Err, "did not prove that it knows this rank's job token")
	for _, o := range out[:2] {
		assert.True(t, o.Deadline, "rank %d: want a timeout error, got %q", o.Rank, o.Err)
	}
	assert.Contains(t, out[0].Err, "ranks [2] to join; refused 1 connection(s): 127.0.0.1:")
}

func TestTCPProcessesMismatch(t *testing.T) {
	out := runScenarioWith(t, scenarioRun{transport: "tcp"}, "mismatch", 3, 20*time.Second)
	for _, o := range out {
		assert.True(t, o.Mismatch, "rank %d: want ErrMismatch, got %q", o.Rank, o.Err)
	}
}

func TestTCPProcessDies(t *testing.T) {
	out := runScenarioWith(t, scenarioRun{transport: "tcp", exits: map[int]int{2: diesExit}}, "dies", 4, 20*time.Second)
	for _, r := range []int{0, 1, 3} {
		o := out[r]
		assert.True(t, o.PeerLost, "rank %d: want ErrPeerLost, got %q", r, o.Err)
		assert.Contains(t, o.Err, "rank 2 closed its connection", "rank %d", r)
		assert.Less(t, o.Elapsed, 10*time.Second, "rank %d waited for its deadline instead of noticing the death", r)
	}
}
