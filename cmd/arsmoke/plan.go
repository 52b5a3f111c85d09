package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// loneGPURanks is the number of virtual ranks of the default run on a
// machine with one GPU: the usual tensor-parallel width.
const loneGPURanks = 8

// findDevices asks the driver how many GPUs are visible and places the
// ranks on them.
func findDevices(c config) ([]int, error) {
	visible, err := countDevices()
	if errors.Is(err, errNoDriver) {
		return nil, fmt.Errorf("find GPUs: %w (set GOCCL_LIBCUDA to the path of libcuda.so.1 if the NVIDIA driver is installed in an unusual place)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("find GPUs: %w", err)
	}
	world := c.ranks
	if c.procs != 0 {
		world = c.procs
	}
	return planDevices(visible, world, c.device)
}

// planDevices returns the device of each rank. world 0 asks for the default:
// every visible GPU, or loneGPURanks virtual ranks when there is one. Ranks
// share a GPU when --device names one or when only one is visible;
// otherwise each rank needs its own GPU.
func planDevices(visible, world, device int) ([]int, error) {
	if visible <= 0 {
		return nil, fmt.Errorf("no GPU visible (CUDA_VISIBLE_DEVICES=%s)", visibleDevicesEnv())
	}
	if device >= visible {
		return nil, fmt.Errorf("fewer GPUs than asked: --device %d, but only %d visible (CUDA_VISIBLE_DEVICES=%s); devices count from 0",
			device, visible, visibleDevicesEnv())
	}
	if world == 0 {
		world = min(visible, maxWorld)
		if visible == 1 || device >= 0 {
			world = loneGPURanks
		}
	}
	if device < 0 && visible == 1 {
		device = 0
	}
	devs := make([]int, world)
	if device >= 0 {
		for i := range devs {
			devs[i] = device
		}
		return devs, nil
	}
	if world > visible {
		return nil, fmt.Errorf("fewer GPUs than asked: %d ranks need %d GPUs, %d visible (CUDA_VISIBLE_DEVICES=%s); add --device D to run them as virtual ranks on one GPU",
			world, world, visible, visibleDevicesEnv())
	}
	for i := range devs {
		devs[i] = i
	}
	return devs, nil
}

func visibleDevicesEnv() string {
	v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	if !ok {
		return "<unset>"
	}
	return strconv.Quote(v)
}

// describeMode says how the ranks are spread over processes and GPUs, for
// the header.
func describeMode(devices []int, procs int) string {
	who := "1 process"
	if procs > 0 {
		who = fmt.Sprintf("%d processes", procs)
	}
	shared := true
	ids := make([]string, len(devices))
	for i, d := range devices {
		shared = shared && d == devices[0]
		ids[i] = strconv.Itoa(d)
	}
	switch {
	case shared && procs > 0:
		return fmt.Sprintf("%d ranks, %s, all on GPU %d", len(devices), who, devices[0])
	case shared:
		return fmt.Sprintf("%d ranks, %s, virtual ranks on GPU %d", len(devices), who, devices[0])
	}
	return fmt.Sprintf("%d ranks, %s, one GPU each (GPUs %s)", len(devices), who, strings.Join(ids, ","))
}
