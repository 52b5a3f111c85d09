// Package topology finds the GPUs this process can use, how they are linked, and whether
// peer access between them really works. collective/ asks it whether the custom all-reduce
// may run (Topology.CheckCustomAllReduce); arsmoke --topo prints it (Topology.Render).
//
// Facts come from two sources matched by PCI bus id, never by number: CUDA (through package
// driver, numbering GPUs after CUDA_VISIBLE_DEVICES narrowed and reordered them) and NVML
// (P2P capabilities, NVLinks, PCIe levels; it numbers GPUs in PCI order and ignores
// CUDA_VISIBLE_DEVICES). NVML is optional: without it the topology holds CUDA's facts only
// and its Notes say why.
//
// # NVML bindings
//
// Every build, with cgo or without, binds libnvidia-ml.so.1 ($GOCCL_LIBNVML first) through
// purego: a program importing goccl needs no C compiler and links no cgo. NVIDIA's go-nvml
// is the other binding of the same calls, chosen by the goccl_nvml_cgo build tag (it needs
// CGO_ENABLED=1 and a C compiler; its C headers warn about deprecated calls, so
// CGO_CFLAGS=-Wno-deprecated-declarations keeps the build quiet):
//
//	CGO_ENABLED=1 go build -tags goccl_nvml_cgo ./...
//
// The tests of that build run go-nvml's mock servers (a DGX H100) through the topology
// logic; make test runs them.
//
// # Peer check
//
// A driver can advertise peer access that drops writes or hangs, so with Options.CheckP2P
// every ordered pair (i, j), and each GPU with itself, is checked for real: a copy kernel on
// GPU i stores random data into GPU j's memory through the peer mapping, then j reads it
// back, all within a timeout. The results are cached under os.UserCacheDir()/goccl per
// driver version and set of GPUs (their bus ids and UUIDs: a slot holds another GPU on
// another host, or after a swap) when every pair ended in a verdict: passed, data that came
// back wrong, or peer access the driver offered and then refused. A check that timed out or
// failed in any other way fails its pair for this process only, and nothing of that run is
// cached. An error that comes from a cached verdict names the cache file; GOCCL_P2P_RECHECK=1
// in the environment, or Options.Force, checks again and replaces the file.
//
//	topo, err := topology.Discover(ctx, topology.Options{CheckP2P: true})
//	...
//	if err := topo.CheckCustomAllReduce([]int{0, 1, 2, 3}, topology.PolicyOptions{}); err != nil {
//		// errors.Is(err, topology.ErrNotEligible): use another backend; err says which pair and why
//	}
package topology
