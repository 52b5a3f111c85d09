package bootstrap_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/goccl/goccl/collective/bootstrap"
)

// Two processes, rank 0 and rank 1, trade their IPC handles. Each would run joinAndShare with
// its own rank (from its command line); here two goroutines stand in for them.
func ExampleNewUnix() {
	dir, err := os.MkdirTemp("", "goccl-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "job.sock") // every rank must be given the same path

	joinAndShare := func(rank int) ([][]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := bootstrap.NewUnix(ctx, path, rank, 2)
		if err != nil {
			return nil, err
		}
		defer b.Close()
		myHandle := fmt.Appendf(nil, "IPC handle of rank %d", rank)
		return b.AllGather(ctx, myHandle)
	}

	var handles [2][][]byte
	var errs [2]error
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() { handles[rank], errs[rank] = joinAndShare(rank) })
	}
	wg.Wait()
	for rank := range 2 {
		if errs[rank] != nil {
			log.Fatal(errs[rank])
		}
		fmt.Printf("rank %d got %q\n", rank, handles[rank])
	}
	// Output:
	// rank 0 got ["IPC handle of rank 0" "IPC handle of rank 1"]
	// rank 1 got ["IPC handle of rank 0" "IPC handle of rank 1"]
}

// Ranks that are goroutines of one process (as in collective.NewGroup) share descriptors too:
// each rank passes the write end of its own pipe, and writes into its right neighbour's.
func ExampleNewInProcess() {
	const size = 3
	boots, err := bootstrap.NewInProcess(size)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	got := make([]string, size)
	var wg sync.WaitGroup
	for rank, b := range boots {
		wg.Go(func() {
			defer b.Close()
			note, err := passNote(ctx, b)
			if err != nil {
				log.Fatal(err)
			}
			got[rank] = note
		})
	}
	wg.Wait()
	for rank, note := range got {
		fmt.Printf("rank %d read %q\n", rank, note)
	}
	// Output:
	// rank 0 read "from rank 2"
	// rank 1 read "from rank 0"
	// rank 2 read "from rank 1"
}

func passNote(ctx context.Context, b bootstrap.Bootstrap) (string, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return "", err
	}
	defer r.Close()
	defer w.Close()
	fdsets, err := b.AllGatherFDs(ctx, []int{int(w.Fd())})
	if err != nil {
		return "", err
	}
	right := (b.Rank() + 1) % b.Size()
	for rank, fds := range fdsets {
		if rank == b.Rank() {
			continue // our own write end, still owned by w
		}
		f := os.NewFile(uintptr(fds[0]), "pipe") // a new descriptor we own
		if rank == right {
			fmt.Fprintf(f, "from rank %d", b.Rank())
		}
		f.Close()
	}
	// Every note is written once every rank is past its loop.
	if err := b.Barrier(ctx); err != nil {
		return "", err
	}
	note := make([]byte, 64)
	n, err := r.Read(note)
	return string(note[:n]), err
}
