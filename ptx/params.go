package ptx

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Param is one kernel parameter as the launcher must pass it: Size bytes,
// aligned to Align bytes in the parameter buffer.
type Param struct {
	Name  string
	Size  int
	Align int
}

// Params returns the parameter list shared by every kernel of the given
// world size, in launch order (docs/kernel-abi.md, "Parameters"). It is the
// one Go-side declaration of that list: the launcher packs its arguments from
// it and a test checks it against the .entry of every generated kernel. The
// caller owns the returned slice.
func Params(worldSize int) []Param {
	return []Param{
		{"p_inputs", 8, 8},  // oneshot/twoshot: table of ws input pointers; push: own input
		{"p_outputs", 8, 8}, // twoshot: table of ws output pointers (direct), or 0; oneshot: the input to stage (FlagStageInput), or 0
		{"p_out", 8, 8},     // own output (in place: see the package doc)
		{"p_nvec", 4, 4},    // number of 16-byte vectors
		{"p_rank", 4, 4},    // this rank
		{"p_err", 8, 8},     // own error record (host-mapped)
		{"p_timeout", 8, 8},
		{"p_sig", 8 * worldSize, 8}, // every rank's signal region
		{"p_buf", 8 * worldSize, 8}, // twoshot: tmp buffers; push: receive buffers
		{"p_slot", 8, 8},            // push: bytes of one receive slot
		{"p_flags", 4, 4},           // FlagEarlyTrigger, FlagStageInput, FlagEntryTrigger
		{"p_tail", 4, 4},            // bytes of the last vector that are the message's, 2..16
		{"p_call", 8, 8},            // this rank's Call.Fingerprint, checked against the peers'
	}
}

var (
	entryRE = regexp.MustCompile(`\.entry\s+([A-Za-z_$%][\w$]*)\s*\(([^)]*)\)`)
	// .param [.align N] .type name[ '[' count ']' ]
	paramRE       = regexp.MustCompile(`^\.param\s+(?:\.align\s+(\d+)\s+)?\.([bsuf])(8|16|32|64)\s+([A-Za-z_$%][\w$]*)\s*(?:\[\s*(\d+)\s*\])?$`)
	lineCommentRE = regexp.MustCompile(`//[^\n]*`)
)

// ParseEntryParams reads the name and the parameter list of the single
// .entry of a PTX module. It understands the parameter forms goccl kernels
// use: scalar .bN/.uN/.sN/.fN parameters and byte arrays with an optional
// .align.
func ParseEntryParams(src []byte) (entry string, params []Param, err error) {
	text := lineCommentRE.ReplaceAll(src, nil)
	matches := entryRE.FindAllSubmatch(text, -1)
	switch len(matches) {
	case 0:
		return "", nil, fmt.Errorf("parse PTX: no .entry with a parameter list found")
	case 1:
	default:
		return "", nil, fmt.Errorf("parse PTX: %d .entry directives, want exactly one", len(matches))
	}
	entry = string(matches[0][1])
	list := bytes.TrimSpace(matches[0][2])
	if len(list) == 0 {
		return entry, nil, nil
	}
	for _, decl := range strings.Split(string(list), ",") {
		decl = strings.Join(strings.Fields(decl), " ")
		m := paramRE.FindStringSubmatch(decl)
		if m == nil {
			return "", nil, fmt.Errorf("parse PTX: entry %s: cannot read parameter %q", entry, decl)
		}
		bits, _ := strconv.Atoi(m[3]) // the pattern admits 8, 16, 32 or 64 only
		size, align := bits/8, bits/8
		if m[1] != "" {
			align, _ = strconv.Atoi(m[1])
		}
		if m[5] != "" {
			n, _ := strconv.Atoi(m[5])
			size *= n
		}
		params = append(params, Param{Name: m[4], Size: size, Align: align})
	}
	return entry, params, nil
}
