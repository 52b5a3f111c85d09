package topology

import "fmt"

// addNVML adds NVML's facts to t: NVML index per GPU and, per pair, P2P status, NVLink count
// and common ancestor. It is all or nothing: on error t is unchanged, so a half-read NVML
// never mixes with CUDA's facts.
func (t *Topology) addNVML(nv NVML) (err error) {
	if err := nv.Init(); err != nil {
		return err
	}
	defer func() {
		if serr := nv.Shutdown(); serr != nil && err == nil {
			t.note("%v", serr)
		}
	}()
	drv, err := nv.DriverVersion()
	if err != nil {
		return err
	}

	// NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES: index every GPU it
	// sees by bus id, then look up CUDA's.
	count, err := nv.DeviceCount()
	if err != nil {
		return err
	}
	type nvmlGPU struct {
		dev   NVMLDevice
		index int
	}
	byBus := make(map[string]nvmlGPU, count)
	for k := range count {
		d, err := nv.DeviceByIndex(k)
		if err != nil {
			return fmt.Errorf("NVML GPU %d: %w", k, err)
		}
		raw, err := d.PCIBusID()
		if err != nil {
			return fmt.Errorf("NVML GPU %d: %w", k, err)
		}
		bus, ok := NormalizeBusID(raw)
		if !ok {
			return fmt.Errorf("NVML GPU %d: unreadable PCI bus id %q", k, raw)
		}
		byBus[bus] = nvmlGPU{dev: d, index: k}
	}

	n := len(t.GPUs)
	devs := make([]NVMLDevice, n)
	index := make([]int, n)
	for i, g := range t.GPUs {
		ng, ok := byBus[g.BusID]
		if !ok {
			return fmt.Errorf("NVML does not list CUDA GPU %d (bus %s)", i, g.BusID)
		}
		uuid, err := ng.dev.UUID()
		if err != nil {
			return fmt.Errorf("NVML GPU %d: %w", ng.index, err)
		}
		if uuid != g.UUID {
			return fmt.Errorf("NVML GPU %d at bus %s has UUID %s but CUDA GPU %d there has %s (MIG or a container remapping?)",
				ng.index, g.BusID, uuid, i, g.UUID)
		}
		devs[i], index[i] = ng.dev, ng.index
	}

	// Count each GPU's active links per remote GPU; links whose far end is not a GPU go to
	// an NVSwitch, which connects the GPU to every other GPU on the switch fabric.
	direct := make([]map[string]int, n)
	switched := make([]int, n)
	for i, d := range devs {
		direct[i] = map[string]int{}
		for link := range NVLinkMaxLinks {
			up, err := d.NVLinkActive(link)
			if code := nvmlCode(err); code == NVMLErrorInvalidArgument || code == NVMLErrorNotSupported {
				continue // no such link on this GPU
			}
			if err != nil {
				return fmt.Errorf("GPU %d link %d: %w", i, link, err)
			}
			if !up {
				continue
			}
			raw, err := d.NVLinkRemoteBusID(link)
			if err != nil {
				return fmt.Errorf("GPU %d link %d: %w", i, link, err)
			}
			if bus, ok := NormalizeBusID(raw); ok && byBus[bus].dev != nil {
				direct[i][bus]++
			} else {
				switched[i]++
			}
		}
	}

	links := make([][]*NVMLLink, n)
	for i := range n {
		links[i] = make([]*NVMLLink, n)
		for j := range n {
			if i == j {
				continue
			}
			l, err := pairFacts(devs[i], devs[j])
			if err != nil {
				return fmt.Errorf("GPUs %d and %d: %w", i, j, err)
			}
			l.NVLinks = direct[i][t.GPUs[j].BusID]
			// Through switches the pair gets the links of its narrower side, but only when
			// NVML confirms the two share a fabric (a partitioned fabric may separate them).
			if l.NVLink == P2POK && switched[i] > 0 && switched[j] > 0 {
				l.NVLinks += min(switched[i], switched[j])
			}
			links[i][j] = l
		}
	}

	t.HasNVML, t.NVMLDriver = true, drv
	for i := range n {
		t.GPUs[i].NVMLIndex = index[i]
		for j := range n {
			t.Links[i][j].NVML = links[i][j]
		}
	}
	return nil
}

// pairFacts asks NVML about the path from a to b, NVLinks aside.
func pairFacts(a, b NVMLDevice) (*NVMLLink, error) {
	l := &NVMLLink{}
	for _, c := range []struct {
		cap P2PCap
		dst *P2PStatus
	}{{P2PRead, &l.Read}, {P2PWrite, &l.Write}, {P2PNVLink, &l.NVLink}, {P2PAtomics, &l.Atomics}} {
		st, err := a.P2PStatus(b, c.cap)
		if err != nil {
			return nil, fmt.Errorf("P2P %s status: %w", c.cap, err)
		}
		*c.dst = st
	}
	// Virtual machines often hide the PCIe tree: the level is then unknown, not an error.
	lvl, err := a.CommonAncestor(b)
	if err != nil && nvmlCode(err) != NVMLErrorNotSupported {
		return nil, err
	}
	l.Level = lvl
	return l, nil
}
