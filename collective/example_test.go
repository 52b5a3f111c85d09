package collective_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/driver"
)

// A process that drives two GPUs (or, with []int{0, 0}, two virtual ranks on one GPU) sums a
// bf16 tensor across them. The example needs a GPU, so go test compiles it but does not run it.
func ExampleNewGroup() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms, err := collective.NewGroup(ctx, []int{0, 1}, collective.Options{})
	if err != nil {
		log.Fatal(err)
	}
	const count = 4099 // bf16 elements: any count is fine
	for _, comm := range comms {
		stream, err := comm.Context().NewStream()
		if err != nil {
			log.Fatal(err)
		}
		buf, err := comm.Context().Alloc(count * 2)
		if err != nil {
			log.Fatal(err)
		}
		// ... fill buf ...
		if err := comm.AllReduce(stream, buf, buf, count, collective.BFloat16); err != nil {
			log.Fatal(err)
		}
		defer stream.Close()
		defer comm.Context().Free(buf)
		defer stream.Synchronize()
	}
	for _, comm := range comms {
		defer comm.Close()
	}
	fmt.Println("all-reduces enqueued")
}

// Capturing all-reduces into a CUDA graph: Capture is a collective call, so the ranks of one
// process capture from separate goroutines. Replays then cost one graph launch per rank.
func ExampleComm_Capture() {
	ctx := context.Background()
	comms, err := collective.NewGroup(ctx, []int{0, 0}, collective.Options{})
	if err != nil {
		log.Fatal(err)
	}
	const count = 1 << 20 // bf16 elements
	graphs := make([]*collective.Graph, len(comms))
	streams := make([]*driver.Stream, len(comms))
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, comm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := comm.Context()
			stream, _ := c.NewStream()
			in, _ := c.Alloc(2 * count)
			out, _ := c.Alloc(2 * count)
			streams[r] = stream
			graphs[r], errs[r] = comm.Capture(ctx, stream, func() error {
				return comm.AllReduce(stream, out, in, count, collective.BFloat16)
			})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		log.Fatal(err)
	}
	for r := range comms {
		graphs[r].Launch(streams[r]) // replay: every rank launches its graph
	}
	for r, comm := range comms {
		streams[r].Synchronize()
		if err := comm.Err(); err != nil {
			log.Fatal(err)
		}
	}
}

// A service registers the buffers it all-reduces every step, so that the kernels read them in
// place instead of copying them into the staging buffer, and releases them before freeing
// them. Register is collective: each rank of this process registers from its own goroutine.
func ExampleComm_Register() {
	ctx := context.Background()
	comms, err := collective.NewGroup(ctx, []int{0, 0}, collective.Options{})
	if err != nil {
		log.Fatal(err)
	}
	const count = 1 << 20 // bf16 elements
	var wg sync.WaitGroup
	for _, comm := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := comm.Context()
			buf, _ := c.Alloc(2 * count)
			defer c.Free(buf)
			reg, err := comm.Register(ctx, buf, 2*count)
			var refused *collective.RefusedError
			switch {
			case errors.As(err, &refused):
				log.Printf("a peer refused its buffer: %v", refused) // nothing was registered
				return
			case err != nil:
				log.Printf("this rank's buffer was refused: %v", err)
				return
			}
			defer reg.Release() // before Free
			stream, _ := c.NewStream()
			defer stream.Close()
			for range 10 { // steps of the service
				if err := comm.AllReduce(stream, buf, buf, count, collective.BFloat16); err != nil {
					log.Print(err)
					return
				}
			}
			stream.Synchronize()
		}()
	}
	wg.Wait()
	for _, comm := range comms {
		if err := comm.Err(); errors.Is(err, collective.ErrUnusable) {
			log.Printf("rank %d failed: %v", comm.Rank(), err) // ErrTimeout, ErrCallMismatch, driver.ErrContextLost...
		}
		comm.Close()
	}
}

// Streams made by another CUDA library (cgo code, another binding) are wrapped without being
// owned: goccl enqueues on them and never destroys them.
func ExampleComm_AllReduce_foreignStream() {
	var handles [2]uintptr // CUstreams created elsewhere, one on each rank's device
	comms, err := collective.NewGroup(context.Background(), []int{0, 1}, collective.Options{})
	if err != nil {
		log.Fatal(err)
	}
	for r, comm := range comms {
		stream, err := driver.WrapStream(handles[r])
		if err != nil {
			log.Fatal(err) // for example the default stream, which goccl does not take
		}
		defer stream.Close() // forgets it; the library that made it destroys it
		buf, _ := comm.Context().Alloc(4096)
		if err := comm.AllReduce(stream, buf, buf, 1024, collective.Float32); err != nil {
			log.Fatal(err)
		}
	}
}
