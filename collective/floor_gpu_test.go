package collective_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/driver"
)

const emptyKernelPTX = `
.version 7.8
.target sm_80
.address_size 64
.visible .entry goccl_floor_empty()
{
	ret;
}
`

// BenchmarkGraphForkJoinFloor measures the harness of the graph benchmarks without any
// all-reduce: a graph of 200 layers, each an event fork from a main stream to ws streams,
// one empty kernel per stream and a join back. Whatever an all-reduce layer costs above this
// is the all-reduce's own.
func BenchmarkGraphForkJoinFloor(b *testing.B) {
	requireGPU(b)
	dev, err := driver.GetDevice(0)
	require.NoError(b, err)
	c, err := driver.PrimaryContext(dev)
	require.NoError(b, err)
	defer c.Close()
	mod, err := c.LoadModule("goccl_floor_empty", []byte(emptyKernelPTX))
	require.NoError(b, err)
	defer mod.Close()
	fn, err := mod.Function("goccl_floor_empty")
	require.NoError(b, err)
	for _, ws := range []int{2, 4, 8} {
		b.Run(fmt.Sprintf("ws%d", ws), func(b *testing.B) {
			const layers = 200
			main, err := c.NewStream()
			require.NoError(b, err)
			defer main.Close()
			fork, err := c.NewEvent(false)
			require.NoError(b, err)
			defer fork.Close()
			streams := make([]*driver.Stream, ws)
			joins := make([]*driver.Event, ws)
			for r := range ws {
				streams[r], err = c.NewStream()
				require.NoError(b, err)
				defer streams[r].Close()
				joins[r], err = c.NewEvent(false)
				require.NoError(b, err)
				defer joins[r].Close()
			}
			var args driver.Args
			cfg := driver.LaunchConfig{Grid: [3]uint32{2, 1, 1}, Block: [3]uint32{512, 1, 1}}
			require.NoError(b, main.BeginCapture(driver.CaptureRelaxed))
			for range layers {
				require.NoError(b, fork.Record(main))
				for r, s := range streams {
					require.NoError(b, s.WaitEvent(fork))
					require.NoError(b, driver.Launch(s, fn, &cfg, &args))
					require.NoError(b, joins[r].Record(s))
					require.NoError(b, main.WaitEvent(joins[r]))
				}
			}
			g, err := main.EndCapture()
			require.NoError(b, err)
			x, err := g.Instantiate()
			require.NoError(b, err)
			require.NoError(b, g.Close())
			defer x.Close()
			require.NoError(b, x.Launch(main))
			require.NoError(b, main.Synchronize())
			start, err := c.NewEvent(true)
			require.NoError(b, err)
			defer start.Close()
			end, err := c.NewEvent(true)
			require.NoError(b, err)
			defer end.Close()
			b.ResetTimer()
			require.NoError(b, start.Record(main))
			for range b.N {
				require.NoError(b, x.Launch(main))
			}
			require.NoError(b, end.Record(main))
			require.NoError(b, main.Synchronize())
			d, err := driver.Elapsed(start, end)
			require.NoError(b, err)
			b.ReportMetric(float64(d)/float64(time.Microsecond)/float64(b.N*layers), "us/layer")
		})
	}
}
