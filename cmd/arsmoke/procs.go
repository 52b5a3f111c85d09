package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goccl/goccl/collective/bootstrap"
)

// The environment that makes arsmoke a --procs child: the parent sets both
// for each process it starts; the flags are the parent's own.
const (
	envRank   = "ARSMOKE_RANK"
	envSocket = "ARSMOKE_SOCKET"
	// envParent is the parent's process id, which the child watches (watchParent): read from
	// the environment, it is right even for a child orphaned before it could ask.
	envParent = "ARSMOKE_PARENT"
)

// childFromEnv returns who this process is when a --procs parent started
// it, or nil when it is not a child.
func childFromEnv(c config) (*procInfo, error) {
	s, ok := os.LookupEnv(envRank)
	if !ok {
		return nil, nil
	}
	rank, err := strconv.Atoi(s)
	if err != nil || c.procs == 0 || rank < 0 || rank >= c.procs {
		return nil, fmt.Errorf("%s=%q: arsmoke --procs N sets it to 0..N-1 for the processes it starts; unset it", envRank, s)
	}
	sock := os.Getenv(envSocket)
	if sock == "" {
		return nil, fmt.Errorf("%s is set but %s is not: arsmoke --procs sets both; unset %s", envRank, envSocket, envRank)
	}
	if os.Getenv(bootstrap.TokenEnv) == "" {
		// The bootstrap would then admit any process of this user as a rank.
		return nil, fmt.Errorf("%s is set but %s is not: arsmoke --procs gives its ranks a job token; unset %s", envRank, bootstrap.TokenEnv, envRank)
	}
	parent, _ := strconv.Atoi(os.Getenv(envParent)) // 0 when unset: the parent when asked
	return &procInfo{Rank: rank, World: c.procs, Socket: sock, Parent: parent}, nil
}

// exitAgreedFail is the exit code of a --procs child whose run ended with a failure every
// rank agreed on (wrong results, a failed set-up), after rank 0 printed it: the parent takes
// it for the run's verdict, not for a rank that failed first, and exits with exitFail.
const exitAgreedFail = 3

// runParent starts c.procs copies of this executable with the same
// arguments, one rank each, and waits for them. When the ranks use NCCL and
// share a GPU, each process gets its own NCCL_HOSTID (see ncclHostEnv). Rank 0's stdout becomes
// ours; every rank's stderr comes through prefixed with its rank. When one
// fails, the others are killed at once; when one finishes, the others get
// --timeout to follow, so that a rank stuck outside its watchdog cannot hang
// the run.
//
// With --json, rank 0's stdout is held until the run ends: stdout is one JSON document
// whatever happens, rank 0's report, or, where rank 0 printed none (it was stopped, or the
// run failed before it could), one that says why the run failed.
func runParent(ctx context.Context, c config, args []string, stdout, stderr io.Writer) int {
	if !c.json {
		code, _ := superviseRanks(ctx, c, args, stdout, stderr)
		return code
	}
	var out bytes.Buffer
	code, cause := superviseRanks(ctx, c, args, &out, stderr)
	if doc := bytes.TrimSpace(out.Bytes()); len(doc) > 0 && json.Valid(doc) {
		if _, err := stdout.Write(out.Bytes()); err != nil {
			fmt.Fprintf(stderr, "arsmoke: write the results: %v\n", err)
			return exitFail
		}
		return code
	}
	if cause == "" {
		cause = "rank 0 printed no report"
	}
	r := newReport(c)
	r.finish(fmt.Errorf("--procs %d: %s", c.procs, cause))
	if err := renderJSON(stdout, r); err != nil {
		fmt.Fprintf(stderr, "arsmoke: write the results: %v\n", err)
	}
	return exitFail
}

// superviseRanks is runParent but for what it prints on stdout: rank 0's output goes to
// stdout as it comes. It returns the exit code and, for a failure, what failed.
func superviseRanks(ctx context.Context, c config, args []string, stdout, stderr io.Writer) (code int, cause string) {
	errOut := &lockedWriter{w: stderr}
	fail := func(format string, a ...any) (int, string) {
		msg := fmt.Sprintf(format, a...)
		fmt.Fprintf(errOut, "arsmoke: --procs %d: %s\n", c.procs, msg)
		return exitFail, msg
	}
	hostIDs := false
	if c.backend != backendGoccl {
		// NCCL takes ranks that share a GPU only from different hosts: plan the ranks here to
		// know whether each process must be a host of its own.
		devices, err := findDevices(c)
		if err != nil {
			return fail("%v", err)
		}
		hostIDs = hostIDEnv(c, devices)
	}
	tag := runTag()
	exe, err := os.Executable()
	if err != nil {
		return fail("find this executable to start the ranks: %v", err)
	}
	dir, err := os.MkdirTemp("", "arsmoke-")
	if err != nil {
		return fail("make a folder for the bootstrap socket: %v (set TMPDIR to a writable folder)", err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "bootstrap.sock")
	token, err := newJobToken()
	if err != nil {
		return fail("%v", err)
	}

	type exited struct {
		rank int
		err  error
	}
	done := make(chan exited, c.procs)
	cmds := make([]*exec.Cmd, 0, c.procs)
	for rank := range c.procs {
		cmd := exec.Command(exe, args...)
		cmd.Env = rankEnv(childEnv(), rank, sock, token)
		if hostIDs {
			cmd.Env = ncclHostEnv(cmd.Env, rank, tag)
		}
		if rank == 0 {
			cmd.Stdout = stdout
		}
		lines := &prefixWriter{out: errOut, prefix: fmt.Sprintf("rank %d: ", rank)}
		cmd.Stderr = lines
		// A grandchild holding the pipes open must not keep Wait waiting.
		cmd.WaitDelay = time.Second
		if err := cmd.Start(); err != nil {
			for _, started := range cmds {
				_ = started.Process.Kill()
			}
			for range cmds {
				<-done
			}
			return fail("start rank %d: %v", rank, err)
		}
		cmds = append(cmds, cmd)
		go func() {
			err := cmd.Wait()
			lines.flush()
			done <- exited{rank, err}
		}()
	}

	running := make(map[int]bool, c.procs)
	for rank := range c.procs {
		running[rank] = true
	}
	stop := func() (stopped []int) {
		for rank := range running {
			if cmds[rank].Process.Kill() == nil {
				stopped = append(stopped, rank)
			}
		}
		return stopped
	}
	var (
		finished    = -1
		grace       <-chan time.Time
		interrupted = ctx.Done()
		stopped     []int
		agreedFail  bool // a rank ended with the failure every rank agreed on
	)
	for len(running) > 0 {
		select {
		case e := <-done:
			delete(running, e.rank)
			var exit *exec.ExitError
			agreed := errors.As(e.err, &exit) && exit.ExitCode() == exitAgreedFail
			agreedFail = agreedFail || agreed
			switch {
			case cause != "":
				// One we stopped: its end is no news.
			case e.err != nil && !agreed:
				cause = fmt.Sprintf("rank %d failed (%v)", e.rank, e.err)
				stopped = stop()
			case finished < 0:
				finished = e.rank
				grace = time.After(c.timeout)
			}
		case <-grace:
			grace = nil
			cause = fmt.Sprintf("rank %d finished, but ranks %s did not exit within --timeout %v", finished, ranks(running), c.timeout)
			stopped = stop()
		case <-interrupted:
			interrupted = nil
			cause = "interrupted"
			stopped = stop()
		}
	}
	switch {
	case cause == "" && agreedFail:
		// Rank 0 printed the verdict, which every rank agreed on.
		return exitFail, "the ranks' verdict: FAIL (see rank 0's report)"
	case cause == "":
		return exitPass, ""
	}
	if len(stopped) > 0 {
		cause += fmt.Sprintf("; stopped ranks %s", ranksOf(stopped))
	}
	return fail("%s", cause)
}

// watchParent cancels a --procs child's run once its parent is gone (ppid is no longer parent:
// the child was handed to init or a subreaper), also after a SIGKILL, which leaves the parent
// no chance to stop its ranks: the child then stops as on an interrupt, instead of holding its
// GPU until its own timeouts end it. parent 0 takes ppid's answer now. It checks at once, then
// every period until ctx ends.
func watchParent(ctx context.Context, cancel context.CancelFunc, ppid func() int, parent int, every time.Duration) {
	if parent <= 0 {
		parent = ppid()
	}
	if ppid() != parent {
		cancel()
		return
	}
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if ppid() != parent {
					cancel()
					return
				}
			}
		}
	}()
}

// newJobToken makes the secret that the ranks of one --procs run prove to each other when
// they join (bootstrap.TokenEnv): no other process can take a rank's place or pose as rank 0.
func newJobToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make a job token for the ranks: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// rankEnv is the environment of rank's process: env with who it is, where to meet the others
// and the run's job token, which replaces any token env holds.
func rankEnv(env []string, rank int, sock, token string) []string {
	out := make([]string, 0, len(env)+3)
	for _, kv := range env {
		if !strings.HasPrefix(kv, bootstrap.TokenEnv+"=") {
			out = append(out, kv)
		}
	}
	return append(out, envRank+"="+strconv.Itoa(rank), envSocket+"="+sock, bootstrap.TokenEnv+"="+token,
		envParent+"="+strconv.Itoa(os.Getpid()))
}

func ranks(set map[int]bool) string {
	var list []int
	for r := range set {
		list = append(list, r)
	}
	return ranksOf(list)
}

func ranksOf(list []int) string {
	slices.Sort(list)
	s := make([]string, len(list))
	for i, r := range list {
		s[i] = strconv.Itoa(r)
	}
	return strings.Join(s, ", ")
}

// lockedWriter serialises the writes of several children.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// prefixWriter writes whole lines, each behind a prefix, so that lines of
// different ranks never mix.
type prefixWriter struct {
	out     io.Writer
	prefix  string
	pending []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.pending = append(p.pending, b...)
	for {
		i := bytes.IndexByte(p.pending, '\n')
		if i < 0 {
			return len(b), nil
		}
		if _, err := p.out.Write(append([]byte(p.prefix), p.pending[:i+1]...)); err != nil {
			return len(b), err
		}
		p.pending = p.pending[i+1:]
	}
}

// flush writes a last line that had no newline.
func (p *prefixWriter) flush() {
	if len(p.pending) > 0 {
		_, _ = p.Write([]byte("\n"))
	}
}
