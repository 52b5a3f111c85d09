package main

import (
	_ "embed"
	"flag"
	"go/parser"
	"go/token"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

//go:embed doc.go
var docSource []byte

// TestManualCoversFlags keeps the package doc, which is the manual, in step
// with the flags: each flag is documented in the list, and the list names
// no flag that does not exist.
//
// doc.go is embedded, not read from the working folder, so that the test binary also runs
// where the sources are not (the GPU bundle).
func TestManualCoversFlags(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", docSource, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	manual := f.Doc.Text()

	var o options
	defined := map[string]bool{}
	o.flagSet().VisitAll(func(f *flag.Flag) {
		defined[f.Name] = true
		dashes := "-"
		if len(f.Name) > 1 {
			dashes = "--"
		}
		assert.Regexp(t, `(?m)^\t`+dashes+regexp.QuoteMeta(f.Name)+`\b`, manual, "the manual's flag list lacks %s%s", dashes, f.Name)
	})
	for _, m := range regexp.MustCompile(`(?m)^\t--?([a-z]+)`).FindAllStringSubmatch(manual, -1) {
		assert.True(t, defined[m[1]], "the manual documents -%s, which is no flag", m[1])
	}
}
