package bootstrap_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/goccl/goccl/collective/bootstrap"
)

// Two processes, rank 0 and rank 1, trade their IPC handles. Each would run joinAndShare with
// its own rank (from its command line) and the job's token (from its launcher, which makes a
// fresh random one per job, usually through $GOCCL_JOB_TOKEN); here two goroutines stand in
// for them. Only a process that knows the token can join, or pass as rank 0.
func ExampleNewUnixWith() {
	dir, err := bootstrap.SocketDir() // private to this user
	if err != nil {
		log.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("example-%d.sock", os.Getpid())) // the same for every rank
	token := "a per-job secret, the same for every rank"

	joinAndShare := func(rank int) ([][]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := bootstrap.NewUnixWith(ctx, path, rank, 2, token, bootstrap.Options{})
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

// Ranks on several machines meet over TCP: rank 0 listens at an address of its own machine,
// the others dial it. The token is mandatory. Here both ranks run on loopback.
func ExampleNewTCP() {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // find a free port for the example
	if err != nil {
		log.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	token := "at least 16 bytes of secret, shared by every rank"

	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			b, err := bootstrap.NewTCP(ctx, rank, 2, addr, token, bootstrap.Options{})
			if err != nil {
				log.Fatal(err)
			}
			defer b.Close()
			if err := b.Barrier(ctx); err != nil {
				log.Fatal(err)
			}
			_, err = b.AllGatherFDs(ctx, nil)
			if rank == 0 {
				fmt.Println("descriptors over TCP:", errors.Is(err, bootstrap.ErrFDPassingUnsupported))
			}
		})
	}
	wg.Wait()
	// Output:
	// descriptors over TCP: true
}
