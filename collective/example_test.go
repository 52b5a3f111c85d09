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
	const count = 4096 // bf16 elements: 8 KiB, a multiple of 16 bytes
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
	graphs := make([]*driver.GraphExec, len(comms))
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
