package nccl_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goccl/goccl/nccl"
)

// One rank of a job: rank 0 makes the unique id and sends it to the others (here, a channel
// stands in for the job's own bootstrap), every rank joins, then all-reduces a bfloat16
// buffer in place on its stream.
func Example() {
	if err := nccl.Load(); errors.Is(err, nccl.ErrNotFound) {
		fmt.Println("no NCCL here:", err) // goccl's own kernels still work
		return
	}
	const rank, nranks = 0, 1
	ids := make(chan nccl.UniqueID, nranks)
	if rank == 0 {
		id, err := nccl.GetUniqueID()
		if err != nil {
			fmt.Println(err)
			return
		}
		ids <- id
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comm, err := nccl.InitRank(ctx, <-ids, nranks, rank, &nccl.Config{
		// Bind: make this rank's CUDA device current, e.g. with package driver.
	})
	if err != nil {
		fmt.Println(err) // a rank that never came: aborted, ErrTimeout
		return
	}
	defer comm.Destroy(ctx)

	var buf, stream uintptr // a device buffer and a CUstream, from package driver
	if err := comm.AllReduce(uint64(buf), uint64(buf), 4096, nccl.BFloat16, nccl.Sum, stream); err != nil {
		fmt.Println(err)
	}
}
