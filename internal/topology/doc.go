// Package topology finds the GPUs this process can use, how they are linked, and whether
// peer access between them really works. collective/ asks it whether the custom all-reduce
// may run (Topology.CheckCustomAllReduce); arsmoke --topo prints it (Topology.Render).
//
// Facts come from two sources matched by PCI bus id, never by number: CUDA (through package
// driver, numbering GPUs after CUDA_VISIBLE_DEVICES narrowed and reordered them) and NVML
// (P2P capabilities, NVLinks, PCIe levels; it numbers GPUs in PCI order and ignores
// CUDA_VISIBLE_DEVICES). NVML is optional. Built with cgo it is NVIDIA's go-nvml; without
// cgo a purego binding of the same calls in libnvidia-ml.so.1 ($GOCCL_LIBNVML first).
// Without it the topology holds CUDA's facts only and its Notes say why.
//
// Drivers have been seen to advertise peer access that drops writes or hangs, so with
// Options.CheckP2P every ordered pair (i, j), and each GPU with itself, is checked for real:
// a copy kernel on GPU i stores random data into GPU j's memory through the peer mapping,
// then j reads it back, all within a timeout. The results are cached under
// os.UserCacheDir()/goccl per driver version and set of GPUs; Options.Force checks again.
//
//	topo, err := topology.Discover(ctx, topology.Options{CheckP2P: true})
//	...
//	if err := topo.CheckCustomAllReduce([]int{0, 1, 2, 3}, topology.PolicyOptions{}); err != nil {
//		// errors.Is(err, topology.ErrNotEligible): use another backend; err says which pair and why
//	}
package topology
