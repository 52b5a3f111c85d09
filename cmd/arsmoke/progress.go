package main

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// progress keeps one status line up to date on a terminal during a sweep.
// With a nil writer it prints nothing.
type progress struct {
	w           io.Writer
	done, total int
}

// newProgress returns a progress line on stderr when stderr is a terminal
// and the output is for people; otherwise a silent one, so that logs and
// pipes get no carriage returns.
func newProgress(stderr io.Writer, c config) *progress {
	if c.json || !isTerminal(stderr) {
		return &progress{}
	}
	return &progress{w: stderr}
}

func (p *progress) start(total int) { p.done, p.total = 0, total }

// step announces the case about to run.
func (p *progress) step(name string) {
	p.done++
	if p.w != nil {
		fmt.Fprintf(p.w, "\r\x1b[Karsmoke: [%d/%d] %s", p.done, p.total, name)
	}
}

// clear erases the line, so that what follows starts on a clean one.
func (p *progress) clear() {
	if p.w != nil {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
}

// isTerminal reports whether w is a terminal: a file whose terminal
// attributes can be read.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
