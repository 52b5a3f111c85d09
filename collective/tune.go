package collective

// Tuning tables: a per-machine replacement for the built-in selection table and launch grids
// (select.go), measured by arsmoke --tune. docs/tuning.md describes the format; this file
// reads, checks and writes it, and decides at New which part of it a communicator uses.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/internal/atomicfile"
	"github.com/goccl/goccl/internal/topology"
	"github.com/goccl/goccl/ptx"
)

// The format of a tuning table file and where goccl looks for one.
const (
	// TuneFormat is the "format" of every tuning table file.
	TuneFormat = "goccl-tune"
	// TuneVersion is the version of the format this goccl reads and writes. A file of another
	// version is ignored with a note (see Comm.Notes).
	TuneVersion = 1
	// TuneFileEnv names the environment variable that points New at a tuning table file
	// instead of the default one (DefaultTunePath). Options.TuneFile takes precedence.
	TuneFileEnv = "GOCCL_TUNE_FILE"
	// TuneEnv names the environment variable that turns tuning tables off: "off" (or 0,
	// false) makes every communicator use the built-in selection, whatever Options say; "on",
	// 1, true or unset leave it to Options.
	TuneEnv = "GOCCL_TUNE"
)

// Scopes and modes as tuning tables name them.
const (
	// TuneScopeGPU: every rank runs on one GPU, whose barriers are GPU-scope (ptx.ScopeGPU).
	TuneScopeGPU = "gpu"
	// TuneScopeSystem: system-scope barriers (several GPUs, or Options.SystemScope).
	TuneScopeSystem = "system"
	// TuneModeGraph: calls recorded by Comm.Capture and replayed in a CUDA graph.
	TuneModeGraph = "graph"
	// TuneModeEager: every other call.
	TuneModeEager = "eager"
)

// TuneKey names the machine a tuning table was measured on. A table whose key differs from
// the GPU's and driver's a communicator runs on is ignored with a note.
type TuneKey struct {
	// GPU is the device name CUDA reports (cuDeviceGetName), e.g. "NVIDIA H200".
	GPU string `json:"gpu"`
	// Capability is the compute capability, e.g. "9.0".
	Capability string `json:"capability"`
	// Driver is the CUDA driver version (cuDriverGetVersion), e.g. 12080 for 12.8.
	Driver int `json:"driver"`
}

// String says it as a person would read it.
func (k TuneKey) String() string {
	return fmt.Sprintf("%s (compute capability %s, CUDA driver %d.%d)", k.GPU, k.Capability, k.Driver/1000, k.Driver%1000/10)
}

// fileName is the key in the default file name: lower-case letters and digits only.
func (k TuneKey) fileName() string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(k.GPU) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	gpu := strings.TrimSuffix(b.String(), "-")
	if gpu == "" {
		gpu = "gpu"
	}
	return fmt.Sprintf("tune-%s-sm%s-cuda%d.json", gpu, strings.ReplaceAll(k.Capability, ".", ""), k.Driver)
}

// TuneTopology describes how a communicator's ranks sit on GPUs: a section of a tuning table
// applies to communicators with exactly this topology.
type TuneTopology struct {
	// GPUs is the number of distinct GPUs of the communicator.
	GPUs int `json:"gpus"`
	// RanksPerGPU is the largest number of ranks on one GPU (1: one rank per GPU).
	RanksPerGPU int `json:"ranks_per_gpu"`
	// Processes is the number of processes the ranks run in, when ranks share a GPU (virtual
	// ranks in one process and processes under MPS differ a lot); 0 when they do not.
	Processes int `json:"processes,omitempty"`
	// Links sums up how the GPUs are linked, pair by pair, as NVML reports it: "NV18 x28" (28
	// pairs with 18 NVLinks each), a PCIe level (PIX, PXB, PHB, NODE, SYS) for pairs without
	// NVLink, "unknown" where NVML or a GPU cannot be seen; "" for one GPU.
	Links string `json:"links,omitempty"`
}

// linksUnknown is TuneTopology.Links when the links cannot be learnt.
const linksUnknown = "unknown"

// String says it as a person would read it.
func (t TuneTopology) String() string {
	var s string
	if t.GPUs == 1 {
		s = "1 GPU"
	} else {
		s = fmt.Sprintf("%d GPUs", t.GPUs)
	}
	switch {
	case t.RanksPerGPU > 1 && t.GPUs == 1:
		s += fmt.Sprintf(", %d ranks in %s", t.RanksPerGPU, plural(t.Processes, "process", "processes"))
	case t.RanksPerGPU > 1:
		s += fmt.Sprintf(", up to %d ranks each, in %s", t.RanksPerGPU, plural(t.Processes, "process", "processes"))
	default:
		s += ", one rank each"
	}
	if t.Links != "" {
		s += ", links " + t.Links
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// TuneTable is a tuning table: for one machine (Key), sections that each replace the built-in
// selection and grids of the communicators of one world size, topology and barrier scope.
// docs/tuning.md describes it field by field. The zero value is not valid: see Validate.
type TuneTable struct {
	// Format is TuneFormat.
	Format string `json:"format"`
	// Version is TuneVersion.
	Version int `json:"version"`
	TuneKey
	// Created is when the table was measured; it is for people.
	Created time.Time `json:"created,omitzero"`
	// Tool is what measured the table (arsmoke and its version); it is for people.
	Tool string `json:"tool,omitempty"`
	// Sections, at most one per (world size, topology, scope).
	Sections []TuneSection `json:"sections"`
}

// TuneSection is the part of a table for communicators of one world size, topology and scope.
type TuneSection struct {
	// WorldSize is the number of ranks, 2 to 16.
	WorldSize int `json:"world_size"`
	// Topology is how those ranks sit on GPUs.
	Topology TuneTopology `json:"topology"`
	// Scope is TuneScopeGPU or TuneScopeSystem.
	Scope string `json:"scope"`
	// PushBlocks is the grid of every Push launch (0: Options.PushBlocks' default). It is one
	// number for the whole section because the push kernel's per-block state must see the
	// same grid on every call of a communicator.
	PushBlocks int `json:"push_blocks,omitempty"`
	// Entries, at most one per (mode, direct). A call whose (mode, direct) has no entry uses
	// the built-in selection.
	Entries []TuneEntry `json:"entries"`
}

// TuneEntry is the choice for the calls of one mode whose output is shared or not.
type TuneEntry struct {
	// Mode is TuneModeGraph (calls recorded by Capture) or TuneModeEager.
	Mode string `json:"mode"`
	// Direct is true for calls whose output the peers can write into (registered, or any
	// captured call: graph entries are always direct), where TwoShot writes straight into
	// every rank's output.
	Direct bool `json:"direct"`
	// Bands, by increasing UpTo: the first band whose UpTo is at least a call's bytes
	// decides it. Calls past the last band's UpTo use the built-in selection.
	Bands []TuneBand `json:"bands"`
}

// TuneBand is the algorithm and grid for the calls of one range of sizes.
type TuneBand struct {
	// UpTo is the largest call of the band in bytes; 0 (only in the last band): no limit.
	UpTo int64 `json:"up_to,omitempty"`
	// Algorithm is "oneshot", "twoshot" or "push". A Push band past the communicator's
	// PushMaxBytes falls back to the built-in selection.
	Algorithm string `json:"algorithm"`
	// Blocks is the largest grid of a OneShot or TwoShot launch (launchShape's limit; 0:
	// Options.Blocks' default); for Push, 0 or the section's PushBlocks.
	Blocks int `json:"blocks,omitempty"`
	// Threads is the block size of the band's launches: 0 (automatic, as without a table) or
	// a multiple of 32 in [MinThreadsPerBlock, 512].
	Threads int `json:"threads,omitempty"`
}

// ParseTuneTable reads a tuning table from its JSON text and checks it (Validate). It does not
// check that the table was measured on this machine: New does, by its key.
func ParseTuneTable(data []byte) (*TuneTable, error) {
	var head struct {
		Format  string `json:"format"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("not a valid JSON tuning table: %w", err)
	}
	if head.Format != TuneFormat {
		return nil, fmt.Errorf("not a goccl tuning table (format %q, want %q)", head.Format, TuneFormat)
	}
	if head.Version != TuneVersion {
		return nil, fmt.Errorf("format version %d, but this goccl reads version %d: measure it again with this goccl's arsmoke --tune", head.Version, TuneVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	// A misspelt field would otherwise vanish silently and change what the table says.
	dec.DisallowUnknownFields()
	var t TuneTable
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("malformed tuning table: %w", err)
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &t, nil
}

// ReadTuneTable reads and checks the tuning table file at path (ParseTuneTable).
func ReadTuneTable(path string) (*TuneTable, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := ParseTuneTable(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Write checks t and writes it to path as indented JSON, creating the folder if needed. It
// replaces the file atomically, so that a communicator being created never reads half a table.
func (t *TuneTable) Write(path string) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("write tuning table %s: %w", path, err)
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, ".tune-*.tmp", append(b, '\n'), 0o644)
}

// Validate checks everything about t that does not depend on the GPU it runs on: the format
// and version, the key's fields, and every section, entry and band (known names, world sizes
// 2 to 16, grids of at most ptx.MaxBlocks blocks, block sizes that are multiples of 32 in
// [MinThreadsPerBlock, 512], band limits that increase). That grids fit the occupancy of the
// GPU is checked by New, which knows it. The error names the first problem and where it is.
func (t *TuneTable) Validate() error {
	switch {
	case t.Format != TuneFormat:
		return fmt.Errorf("format %q, want %q", t.Format, TuneFormat)
	case t.Version != TuneVersion:
		return fmt.Errorf("format version %d, want %d", t.Version, TuneVersion)
	case t.GPU == "":
		return errors.New("no gpu: the key names the GPU the table was measured on")
	case !validCapability(t.Capability):
		return fmt.Errorf("capability %q: want major.minor, e.g. 9.0", t.Capability)
	case t.Driver <= 0:
		return fmt.Errorf("driver %d: want the CUDA driver version, e.g. 12080", t.Driver)
	}
	type sectionKey struct {
		ws    int
		topo  TuneTopology
		scope string
	}
	seen := map[sectionKey]int{}
	for i, s := range t.Sections {
		if err := s.validate(); err != nil {
			return fmt.Errorf("sections[%d]: %w", i, err)
		}
		k := sectionKey{s.WorldSize, s.Topology, s.Scope}
		if j, dup := seen[k]; dup {
			return fmt.Errorf("sections[%d]: the same world size, topology and scope as sections[%d]", i, j)
		}
		seen[k] = i
	}
	return nil
}

func validCapability(s string) bool {
	major, minor, ok := strings.Cut(s, ".")
	_, err1 := strconv.ParseUint(major, 10, 8)
	_, err2 := strconv.ParseUint(minor, 10, 8)
	return ok && err1 == nil && err2 == nil
}

func (s TuneSection) validate() error {
	tp := s.Topology
	switch {
	case s.WorldSize < 2 || s.WorldSize > ptx.MaxRanks:
		return fmt.Errorf("world_size %d: goccl's kernels take 2 to %d ranks", s.WorldSize, ptx.MaxRanks)
	case tp.GPUs < 1 || tp.RanksPerGPU < 1 || tp.GPUs > s.WorldSize || tp.RanksPerGPU > s.WorldSize || tp.GPUs*tp.RanksPerGPU < s.WorldSize:
		return fmt.Errorf("topology %+v cannot hold %d ranks", tp, s.WorldSize)
	case tp.RanksPerGPU > 1 && (tp.Processes < 1 || tp.Processes > s.WorldSize):
		return fmt.Errorf("topology: ranks share a GPU, so processes must be 1 to %d, not %d", s.WorldSize, tp.Processes)
	case tp.RanksPerGPU == 1 && tp.Processes != 0:
		return fmt.Errorf("topology: processes is only given when ranks share a GPU")
	case tp.GPUs == 1 && tp.Links != "":
		return fmt.Errorf("topology: one GPU has no links, but links is %q", tp.Links)
	case tp.GPUs > 1 && tp.Links == "":
		return fmt.Errorf("topology: %d GPUs need their links (%q where they are not known)", tp.GPUs, linksUnknown)
	case s.Scope != TuneScopeGPU && s.Scope != TuneScopeSystem:
		return fmt.Errorf("scope %q: want %q or %q", s.Scope, TuneScopeGPU, TuneScopeSystem)
	case s.Scope == TuneScopeGPU && tp.GPUs != 1:
		return fmt.Errorf("scope %q needs every rank on one GPU, not %d GPUs", s.Scope, tp.GPUs)
	case s.PushBlocks < 0 || s.PushBlocks > ptx.MaxBlocks:
		return fmt.Errorf("push_blocks %d: want 0 (the default) to %d", s.PushBlocks, ptx.MaxBlocks)
	}
	seen := map[[2]any]int{}
	for i, e := range s.Entries {
		if err := e.validate(s.PushBlocks); err != nil {
			return fmt.Errorf("entries[%d]: %w", i, err)
		}
		k := [2]any{e.Mode, e.Direct}
		if j, dup := seen[k]; dup {
			return fmt.Errorf("entries[%d]: the same mode and direct as entries[%d]", i, j)
		}
		seen[k] = i
	}
	return nil
}

func (e TuneEntry) validate(pushBlocks int) error {
	switch {
	case e.Mode != TuneModeGraph && e.Mode != TuneModeEager:
		return fmt.Errorf("mode %q: want %q or %q", e.Mode, TuneModeGraph, TuneModeEager)
	case e.Mode == TuneModeGraph && !e.Direct:
		return errors.New("a graph entry must be direct: Capture shares every captured call's output")
	case len(e.Bands) == 0:
		return errors.New("no bands")
	}
	var prev int64
	for i, b := range e.Bands {
		if err := b.validate(pushBlocks); err != nil {
			return fmt.Errorf("bands[%d]: %w", i, err)
		}
		switch {
		case b.UpTo == 0 && i != len(e.Bands)-1:
			return fmt.Errorf("bands[%d]: only the last band may leave up_to out (no limit)", i)
		case b.UpTo != 0 && b.UpTo <= prev:
			return fmt.Errorf("bands[%d]: up_to %d does not follow %d: bands must go by increasing size", i, b.UpTo, prev)
		}
		prev = b.UpTo
	}
	return nil
}

func (b TuneBand) validate(pushBlocks int) error {
	algo, err := ParseAlgorithm(b.Algorithm)
	if _, kernel := algo.kernel(); err != nil || !kernel {
		return fmt.Errorf("algorithm %q: want oneshot, twoshot or push", b.Algorithm)
	}
	switch {
	case b.UpTo < 0:
		return fmt.Errorf("up_to %d is negative", b.UpTo)
	case b.Blocks < 0 || b.Blocks > ptx.MaxBlocks:
		return fmt.Errorf("blocks %d: want 0 (the default) to %d", b.Blocks, ptx.MaxBlocks)
	case algo == Push && b.Blocks != 0 && b.Blocks != pushBlocks:
		return fmt.Errorf("blocks %d: a push band's grid is the section's push_blocks (%d)", b.Blocks, pushBlocks)
	case b.Threads != 0 && (b.Threads < MinThreadsPerBlock || b.Threads > ptx.ThreadsPerBlock || b.Threads%32 != 0):
		return fmt.Errorf("threads %d: want 0 (automatic) or a multiple of 32 in [%d, %d]", b.Threads, MinThreadsPerBlock, ptx.ThreadsPerBlock)
	}
	return nil
}

// DefaultTunePath is where New looks for the tuning table of machines with key k when neither
// Options.TuneFile nor GOCCL_TUNE_FILE names one: goccl/tune-<gpu>-sm<cc>-cuda<driver>.json in
// the user cache directory (os.UserCacheDir: $XDG_CACHE_HOME or ~/.cache on Linux), beside the
// peer-check cache. arsmoke --tune writes there by default.
func DefaultTunePath(k TuneKey) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no user cache directory (%w): name the tuning table with %s", err, TuneFileEnv)
	}
	return filepath.Join(base, "goccl", k.fileName()), nil
}

// TuneTarget is what a section of a tuning table for a communicator is keyed by, and the limits
// of its grids: arsmoke --tune measures a communicator and files what it found under it.
type TuneTarget struct {
	// Key names this rank's GPU and driver.
	Key TuneKey
	// Topology is how the ranks sit on GPUs, links included.
	Topology TuneTopology
	// WorldSize is the number of ranks.
	WorldSize int
	// Scope is the scope of the communicator's barriers: TuneScopeGPU or TuneScopeSystem.
	Scope string
	// MaxBlocks is the largest grid that every rank can keep resident beside the grids of
	// the other ranks on its GPU: tables naming more are ignored.
	MaxBlocks int
	// Blocks and PushBlocks are the communicator's grids where no table band sets them.
	Blocks, PushBlocks int
	// PushMaxBytes is the largest call Push may take.
	PushMaxBytes int64
}

// TuneTarget returns what a tuning table section for this communicator is keyed by. Over
// several GPUs it asks NVML for their links (once per process and set of GPUs).
func (c *Comm) TuneTarget(ctx context.Context) (TuneTarget, error) {
	if c == nil {
		return TuneTarget{}, errNilComm
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.custom {
		return TuneTarget{}, invalid("goccl's kernels do not serve this communicator (%s): there is nothing to tune", c.noCustomWhy)
	}
	key, err := c.tuneKey()
	if err != nil {
		return TuneTarget{}, err
	}
	topo := c.tuning.topo
	if topo.GPUs > 1 {
		topo.Links = commLinks(ctx, c.tuning.uuids)
	}
	return TuneTarget{Key: key, Topology: topo, WorldSize: c.size, Scope: scopeName(c.scope),
		MaxBlocks: c.tuning.cap, Blocks: c.blocks, PushBlocks: c.pushBlocks, PushMaxBytes: c.opts.PushMaxBytes}, nil
}

// TuneFile returns the tuning table file whose section this communicator uses, "" when it uses
// the built-in selection (no table, or one that was ignored: Notes says why).
func (c *Comm) TuneFile() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tuning.table == nil {
		return ""
	}
	return c.tuning.path
}

// SelectedCaptured is Selected for an out-of-place call recorded by Capture (whose output the
// peers always see): a tuning table may choose differently for graphs than for eager calls.
func (c *Comm) SelectedCaptured(nbytes int64) Algorithm {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.selectedIn(true, nbytes, true, false)
}

// Notes returns what went wrong at New without failing it, one sentence each: a tuning table
// that was ignored, and why. Each note also went to Options.Logf, or to the standard logger.
func (c *Comm) Notes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.notes)
}

// note records a problem that does not fail New and tells the user: through Options.Logf, or
// the standard logger, once per process and text (the ranks of NewGroup meet the same
// problems, and a line per rank would say nothing more).
func (c *Comm) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.notes = append(c.notes, msg)
	if c.opts.Logf != nil {
		c.opts.Logf("goccl: rank %d: %s", c.rank, msg)
		return
	}
	logged.Lock()
	defer logged.Unlock()
	if logged.seen[msg] {
		return
	}
	if len(logged.seen) >= maxLoggedNotes {
		clear(logged.seen)
	}
	logged.seen[msg] = true
	log.Printf("goccl: %s", msg)
}

// logged remembers the notes the standard logger has printed; maxLoggedNotes bounds it.
var logged = struct {
	sync.Mutex
	seen map[string]bool
}{seen: map[string]bool{}}

const maxLoggedNotes = 256

// tuneState is what a communicator knows of tuning tables.
type tuneState struct {
	topo     TuneTopology  // how the ranks sit on GPUs (Links filled in only where needed)
	uuids    []string      // the distinct GPUs, sorted, to learn their links
	path     string        // the file sections came from
	sections []TuneSection // the file's sections for this world size and topology, any scope
	cap      int           // the largest grid every rank can keep resident
	table    *tuning       // the section in use; nil: the built-in selection
}

// tuneKey is the key of this rank's GPU and driver.
func (c *Comm) tuneKey() (TuneKey, error) {
	name, err := c.dev.Name()
	if err != nil {
		return TuneKey{}, err
	}
	major, minor, err := c.dev.ComputeCapability()
	if err != nil {
		return TuneKey{}, err
	}
	v, err := driver.DriverVersion()
	if err != nil {
		return TuneKey{}, err
	}
	return TuneKey{GPU: name, Capability: fmt.Sprintf("%d.%d", major, minor), Driver: v}, nil
}

// placement is the topology of ranks with these facts, without the links, and their distinct
// GPUs.
func placement(infos []rankInfo) (TuneTopology, []string) {
	perGPU := map[[16]byte]int{}
	processes := map[uint64]bool{}
	for _, ri := range infos {
		perGPU[ri.UUID]++
		processes[ri.Process] = true
	}
	t := TuneTopology{GPUs: len(perGPU), RanksPerGPU: ranksPerGPU(infos)}
	if t.RanksPerGPU > 1 {
		t.Processes = len(processes)
	}
	uuids := make([]string, 0, len(perGPU))
	for u := range perGPU {
		uuids = append(uuids, formatUUID(u))
	}
	slices.Sort(uuids)
	return t, uuids
}

// tuneSource says which tuning table file o asks for: a path, whether it was named (a missing
// file is then worth a note), and a note when the environment is not understood.
func tuneSource(o Options, key TuneKey) (path string, named bool, problem string) {
	if o.NoTune {
		return "", false, ""
	}
	switch v := os.Getenv(TuneEnv); strings.ToLower(v) {
	case "", "on", "1", "true":
	case "off", "0", "false":
		return "", false, ""
	default:
		return "", false, fmt.Sprintf("%s=%q is not understood (use off or on): the built-in selection is used", TuneEnv, v)
	}
	if o.TuneFile != "" {
		return o.TuneFile, true, ""
	}
	if p := os.Getenv(TuneFileEnv); p != "" {
		return p, true, ""
	}
	p, err := DefaultTunePath(key)
	if err != nil {
		// No cache directory, so no table was ever written to it.
		return "", false, ""
	}
	return p, false, ""
}

// loadTuning reads this rank's tuning table, if any, keeps its sections for this
// communicator's world size and topology (infos: every rank's facts), and returns their
// digest, which every rank compares in adoptTuning: all zero when there are none.
func (c *Comm) loadTuning(ctx context.Context, infos []rankInfo) [16]byte {
	c.tuning.topo, c.tuning.uuids = placement(infos)
	if c.opts.NoTune {
		return [16]byte{}
	}
	key, err := c.tuneKey()
	if err != nil {
		c.note("no tuning table read: the GPU's name or the driver's version is unknown (%v); the built-in selection is used", err)
		return [16]byte{}
	}
	return c.readTuning(key, func() string { return commLinks(ctx, c.tuning.uuids) })
}

// readTuning is loadTuning past the facts: key is this rank's, links learns the GPUs' links
// if a section needs them.
func (c *Comm) readTuning(key TuneKey, links func() string) [16]byte {
	path, named, problem := tuneSource(c.opts, key)
	if problem != "" {
		c.note("%s", problem)
	}
	if path == "" {
		return [16]byte{}
	}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !named:
		return [16]byte{}
	case err != nil:
		c.note("tuning table not read: %v; the built-in selection is used", err)
		return [16]byte{}
	}
	t, err := ParseTuneTable(data)
	if err != nil {
		c.note("tuning table %s ignored: %v; the built-in selection is used", path, err)
		return [16]byte{}
	}
	if t.TuneKey != key {
		c.note("tuning table %s ignored: it was measured on %v, this is %v; measure this machine with arsmoke --tune", path, t.TuneKey, key)
		return [16]byte{}
	}
	sections := matchSections(t.Sections, c.size, c.tuning.topo, links)
	if len(sections) == 0 {
		c.note("tuning table %s has no section for %d ranks on %v; the built-in selection is used (arsmoke --tune measures these ranks)", path, c.size, c.tuning.topo)
		return [16]byte{}
	}
	c.tuning.path, c.tuning.sections = path, sections
	return tuneDigest(sections, c.opts)
}

// matchSections returns the sections for world size ws on topology topo (whose links are
// asked of links only if some section needs them).
func matchSections(all []TuneSection, ws int, topo TuneTopology, links func() string) []TuneSection {
	var out []TuneSection
	for _, s := range all {
		if s.WorldSize != ws || s.Topology.GPUs != topo.GPUs || s.Topology.RanksPerGPU != topo.RanksPerGPU || s.Topology.Processes != topo.Processes {
			continue
		}
		if topo.GPUs > 1 && topo.Links == "" {
			topo.Links = links()
		}
		if s.Topology.Links == topo.Links {
			out = append(out, s)
		}
	}
	return out
}

// tuneDigest sums up what a rank would use of its table: the sections, and which grid fields
// the caller left to it. Ranks whose digests differ would launch different grids or algorithms.
func tuneDigest(sections []TuneSection, o Options) [16]byte {
	var d [16]byte
	if len(sections) == 0 {
		return d
	}
	h := sha256.New()
	_ = json.NewEncoder(h).Encode(sections) // plain structs of strings and numbers: cannot fail
	fmt.Fprintf(h, "blocks %t push %t threads %d", o.defaultBlocks, o.defaultPushBlocks, o.ThreadsPerBlock)
	copy(d[:], h.Sum(nil))
	return d
}

// adoptTuning decides, alike on every rank, whether the communicator uses the tuning table
// section of its scope: only if every rank loaded the same (infos[r].Tune, their digests) and
// every grid in it fits the occupancy of the GPUs (sms SMs with blocksPerSM resident blocks
// each, shared by up to onGPU ranks). It sets c.tuning.table, and c.pushBlocks from the
// section where the caller left PushBlocks to it.
func (c *Comm) adoptTuning(infos []rankInfo, sms, blocksPerSM, onGPU int) {
	c.tuning.cap = blockCap(ptx.MaxBlocks, sms, blocksPerSM, onGPU)
	if len(infos) == 0 {
		return
	}
	var differ []string
	for r, ri := range infos {
		if ri.Tune != infos[0].Tune {
			differ = append(differ, strconv.Itoa(r))
		}
	}
	if len(differ) > 0 {
		c.note("rank %s loaded another tuning table than rank 0, or another part of one, or none: every rank uses the built-in selection (give every rank the same table, e.g. with %s, or none)",
			strings.Join(differ, ", "), TuneFileEnv)
		return
	}
	if infos[0].Tune == ([16]byte{}) {
		return
	}
	scope := scopeName(c.scope)
	i := slices.IndexFunc(c.tuning.sections, func(s TuneSection) bool { return s.Scope == scope })
	if i < 0 {
		c.note("tuning table %s has no section for %s-scope barriers on %v; the built-in selection is used", c.tuning.path, scope, c.tuning.topo)
		return
	}
	t, err := compileTuning(c.tuning.sections[i], c.opts, c.tuning.cap)
	if err != nil {
		c.note("tuning table %s ignored: %v; the built-in selection is used", c.tuning.path, err)
		return
	}
	c.tuning.table = t
	if t.pushBlocks > 0 {
		c.pushBlocks = t.pushBlocks
	}
}

// scopeName is a barrier scope as tuning tables name it.
func scopeName(s ptx.Scope) string {
	if s == ptx.ScopeGPU {
		return TuneScopeGPU
	}
	return TuneScopeSystem
}

// commLinks is TuneTopology.Links for the GPUs with these UUIDs, learnt from NVML once per
// process and set of GPUs (an answer that could not be learnt is asked again next time).
func commLinks(ctx context.Context, uuids []string) string {
	key := strings.Join(uuids, ",")
	linkCache.Lock()
	defer linkCache.Unlock()
	if s, ok := linkCache.m[key]; ok {
		return s
	}
	s := discoverLinks(ctx, uuids)
	if s != linksUnknown {
		linkCache.m[key] = s
	}
	return s
}

var linkCache = struct {
	sync.Mutex
	m map[string]string
}{m: map[string]string{}}

// discoverLinks asks NVML how each pair of the GPUs is linked.
func discoverLinks(ctx context.Context, uuids []string) string {
	t, err := topology.Discover(ctx, topology.Options{})
	if err != nil || !t.HasNVML {
		return linksUnknown
	}
	ordinal := map[string]int{}
	for _, g := range t.GPUs {
		ordinal[g.UUID] = g.Ordinal
	}
	var pairs []string
	for i := range uuids {
		for j := i + 1; j < len(uuids); j++ {
			a, okA := ordinal[uuids[i]]
			b, okB := ordinal[uuids[j]]
			if !okA || !okB || t.Links[a][b].NVML == nil {
				return linksUnknown // a GPU this process cannot see (CUDA_VISIBLE_DEVICES)
			}
			pairs = append(pairs, linkName(*t.Links[a][b].NVML))
		}
	}
	return summarizeLinks(pairs)
}

// linkName names one pair's link: its NVLinks, or without any its PCIe level.
func linkName(l topology.NVMLLink) string {
	if l.NVLinks > 0 {
		return fmt.Sprintf("NV%d", l.NVLinks)
	}
	return l.Level.String()
}

// summarizeLinks counts the pairs' link names: "NV18 x28", "NV4 x2, SYS x4" (sorted by name).
func summarizeLinks(pairs []string) string {
	if len(pairs) == 0 {
		return ""
	}
	count := map[string]int{}
	for _, p := range pairs {
		if p == linksUnknown {
			return linksUnknown
		}
		count[p]++
	}
	names := make([]string, 0, len(count))
	for n := range count {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s x%d", n, count[n])
	}
	return strings.Join(parts, ", ")
}
