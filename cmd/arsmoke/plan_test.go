package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPlanDevices(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		visible, world, device int
		want                   []int
		err                    string
	}{
		{name: "default on one GPU", visible: 1, device: -1, want: []int{0, 0, 0, 0, 0, 0, 0, 0}},
		{name: "default on four", visible: 4, device: -1, want: []int{0, 1, 2, 3}},
		{name: "default caps at 16", visible: 20, device: -1, want: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}},
		{name: "device alone", visible: 4, device: 2, want: []int{2, 2, 2, 2, 2, 2, 2, 2}},
		{name: "ranks on one GPU", visible: 1, world: 4, device: -1, want: []int{0, 0, 0, 0}},
		{name: "ranks on many", visible: 8, world: 3, device: -1, want: []int{0, 1, 2}},
		{name: "ranks on a device", visible: 8, world: 3, device: 5, want: []int{5, 5, 5}},
		{name: "fewer GPUs", visible: 2, world: 4, device: -1, err: "fewer GPUs than asked: 4 ranks need 4 GPUs, 2 visible"},
		{name: "no such device", visible: 2, world: 2, device: 2, err: "fewer GPUs than asked: --device 2, but only 2 visible"},
		{name: "no GPU", visible: 0, device: -1, err: "no GPU visible"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planDevices(tc.visible, tc.world, tc.device)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestPlanNamesVisibleDevices(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "3,5")
	_, err := planDevices(2, 4, -1)
	assert.ErrorContains(t, err, `CUDA_VISIBLE_DEVICES="3,5"`)
}

func TestDescribeMode(t *testing.T) {
	assert.Equal(t, "8 ranks, 1 process, virtual ranks on GPU 0", describeMode([]int{0, 0, 0, 0, 0, 0, 0, 0}, 0))
	assert.Equal(t, "2 ranks, 1 process, one GPU each (GPUs 0,1)", describeMode([]int{0, 1}, 0))
	assert.Equal(t, "4 ranks, 4 processes, all on GPU 3", describeMode([]int{3, 3, 3, 3}, 4))
	assert.Equal(t, "2 ranks, 2 processes, one GPU each (GPUs 0,1)", describeMode([]int{0, 1}, 2))
}

// TestGraphReplays: with -g, -w rounds up to whole replays of the timed graph, and -w 0 means
// no warm-up at all.
func TestGraphReplays(t *testing.T) {
	for _, tc := range []struct{ warmup, iters, want int }{
		{0, 100, 0}, {1, 100, 1}, {10, 100, 1}, {100, 100, 1}, {101, 100, 2}, {250, 100, 3}, {5, 1, 5},
	} {
		assert.Equal(t, tc.want, graphReplays(tc.warmup, tc.iters), "-w %d -n %d", tc.warmup, tc.iters)
	}
}
