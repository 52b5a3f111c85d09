package topology

import (
	"fmt"

	"github.com/goccl/goccl/driver"
)

// driverCUDA is the CUDA side of discovery through package driver.
type driverCUDA struct{}

func (driverCUDA) DriverVersion() (int, error) {
	if err := driver.Init(); err != nil {
		return 0, err
	}
	return driver.DriverVersion()
}

func (driverCUDA) GPUs() ([]GPU, error) {
	n, err := driver.DeviceCount()
	if err != nil {
		return nil, err
	}
	gpus := make([]GPU, n)
	for i := range gpus {
		g, err := deviceFacts(i)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		gpus[i] = g
	}
	return gpus, nil
}

// deviceFacts asks the driver about CUDA device ordinal.
func deviceFacts(ordinal int) (GPU, error) {
	g := GPU{Ordinal: ordinal}
	d, err := driver.GetDevice(ordinal)
	if err != nil {
		return g, err
	}
	if g.Name, err = d.Name(); err != nil {
		return g, err
	}
	if g.BusID, err = d.PCIBusID(); err != nil {
		return g, err
	}
	u, err := d.UUID()
	if err != nil {
		return g, err
	}
	g.UUID = fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	if g.SMs, err = d.SMCount(); err != nil {
		return g, err
	}
	g.Major, g.Minor, err = d.ComputeCapability()
	return g, err
}

func (driverCUDA) CanAccessPeer(from, to int) (bool, error) {
	a, err := driver.GetDevice(from)
	if err != nil {
		return false, err
	}
	b, err := driver.GetDevice(to)
	if err != nil {
		return false, err
	}
	return driver.CanAccessPeer(a, b)
}
