package topology

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Render writes t for people: a link matrix like nvidia-smi topo -m, each GPU's facts, the
// peer-access matrix, the peer-check results and the notes. It is what arsmoke --topo prints.
func (t *Topology) Render(w io.Writer) error {
	var b strings.Builder
	nvml := "NVML unavailable"
	if t.HasNVML {
		nvml = "NVIDIA driver " + t.NVMLDriver
	}
	fmt.Fprintf(&b, "%d GPU(s), CUDA driver %d.%d, %s\n\n", len(t.GPUs), t.CUDADriver/1000, t.CUDADriver%1000/10, nvml)

	t.matrix(&b, false, func(i, j int) string {
		n := t.Links[i][j].NVML
		switch {
		case n == nil:
			return "?"
		case n.NVLinks > 0:
			return fmt.Sprintf("NV%d", n.NVLinks)
		}
		return n.Level.String()
	})
	b.WriteString(`
  X = self, NV# = # NVLinks (via NVSwitch counted as nvidia-smi does),
  SYS = across NUMA nodes, NODE = across host bridges in a NUMA node, PHB = through a host bridge,
  PXB = several PCIe bridges, PIX = at most one PCIe bridge, INT = one board, ? = unknown

`)

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tNVML\tName\tUUID\tBus id\tSMs\tCC")
	for _, g := range t.GPUs {
		idx := "-"
		if g.NVMLIndex >= 0 {
			idx = fmt.Sprint(g.NVMLIndex)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d.%d\n", g.Ordinal, idx, g.Name, g.UUID, g.BusID, g.SMs, g.Major, g.Minor)
	}
	tw.Flush()

	b.WriteString("\nPeer access (CUDA can-access-peer; NVML P2P Read/Write/NVLink/Atomics):\n")
	t.matrix(&b, false, func(i, j int) string {
		l := t.Links[i][j]
		s := "no"
		if l.CanAccessPeer {
			s = "yes"
		}
		if n := l.NVML; n != nil {
			s += " " + capLetter(n.Read, 'R') + capLetter(n.Write, 'W') + capLetter(n.NVLink, 'N') + capLetter(n.Atomics, 'A')
		}
		return s
	})

	fmt.Fprintf(&b, "\nPeer check (%s", t.PeerCheck)
	if t.PeerCheck == CheckFromCache {
		fmt.Fprintf(&b, " %s; %s=1 or Options.Force checks again", t.CachePath, RecheckEnv)
	}
	b.WriteString("): write from row GPU into column GPU, read back\n")
	var failures []string
	t.matrix(&b, true, func(i, j int) string {
		l := t.Links[i][j]
		switch {
		case l.Check.Passed():
			return "ok"
		case l.Check.Ran:
			failures = append(failures, fmt.Sprintf("  GPU%d -> GPU%d: %s\n", i, j, l.Check.Err))
			return "FAIL"
		case !l.CanAccessPeer:
			return "no"
		}
		return "-"
	})
	b.WriteString("  ok = intact, FAIL = see below, no = no CUDA peer access, - = not run\n")
	for _, f := range failures {
		b.WriteString(f)
	}

	if len(t.Notes) > 0 {
		b.WriteString("\nNotes:\n")
		for _, n := range t.Notes {
			fmt.Fprintf(&b, "  - %s\n", n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// matrix writes a GPU-by-GPU table of cell(i, j), with "X" on the diagonal unless diag.
func (t *Topology) matrix(b *strings.Builder, diag bool, cell func(i, j int) string) {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for i := range t.GPUs {
		fmt.Fprintf(tw, "\tGPU%d", i)
	}
	fmt.Fprintln(tw)
	for i := range t.GPUs {
		fmt.Fprintf(tw, "GPU%d", i)
		for j := range t.GPUs {
			c := "X"
			if i != j || diag {
				c = cell(i, j)
			}
			fmt.Fprintf(tw, "\t%s", c)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// capLetter is letter when NVML reports the capability working, else '-'.
func capLetter(s P2PStatus, letter byte) string {
	if s == P2POK {
		return string(letter)
	}
	return "-"
}
