package topology

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/goccl/goccl/driver"
)

// p2pCheckPTX is the copy kernel the peer check launches (sm_80 PTX, JIT-compiled by the
// driver for whatever GPU it runs on).
//
//go:embed p2pcheck.ptx
var p2pCheckPTX []byte

const (
	p2pCheckKernel = "goccl_p2p_copy"
	// p2pCheckBytes is enough to keep every SM storing over the link for a while, small
	// enough to allocate next to a running job.
	p2pCheckBytes = 1 << 20
)

// linkFault marks err as a verdict against the link: errors.Is(err, ErrPeerCheckFailed)
// holds and the text is unchanged. Only two outcomes earn it: data that arrived wrong, and a
// driver that refused the peer access it had offered. Discover caches those.
type linkFault struct{ error }

func (e linkFault) Is(target error) bool { return target == ErrPeerCheckFailed }
func (e linkFault) Unwrap() error        { return e.error }

// checkDevice is one GPU's primary context with the copy kernel loaded. hung is set when
// work queued in it did not finish: its resources are then leaked rather than freed, because
// freeing memory or a context under a running kernel waits for that kernel.
type checkDevice struct {
	ctx  *driver.Context
	mod  *driver.Module
	fn   *driver.Function
	hung bool
}

func openCheckDevice(ordinal int) (*checkDevice, error) {
	d, err := driver.GetDevice(ordinal)
	if err != nil {
		return nil, err
	}
	c, err := driver.PrimaryContext(d)
	if err != nil {
		return nil, err
	}
	mod, err := c.LoadModule(p2pCheckKernel, p2pCheckPTX)
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	fn, err := mod.Function(p2pCheckKernel)
	if err != nil {
		return nil, errors.Join(err, mod.Close(), c.Close())
	}
	return &checkDevice{ctx: c, mod: mod, fn: fn}, nil
}

func (d *checkDevice) close() error {
	if d.hung {
		return nil
	}
	return errors.Join(d.mod.Close(), d.ctx.Close())
}

// CheckPeers runs the peer check of each pair in turn (see checkPair).
func (driverCUDA) CheckPeers(ctx context.Context, pairs []Pair, timeout time.Duration) ([]error, error) {
	errs := make([]error, len(pairs))
	devs := map[int]*checkDevice{}
	open := func(ordinal int) (*checkDevice, error) {
		if d, ok := devs[ordinal]; ok {
			return d, nil
		}
		d, err := openCheckDevice(ordinal)
		if err != nil {
			return nil, fmt.Errorf("prepare GPU %d: %w", ordinal, err)
		}
		devs[ordinal] = d
		return d, nil
	}
	for k, p := range pairs {
		if err := ctx.Err(); err != nil {
			errs[k] = err
			continue
		}
		from, err := open(p.From)
		if err != nil {
			errs[k] = err
			continue
		}
		to, err := open(p.To)
		if err != nil {
			errs[k] = err
			continue
		}
		if hung := busy(p, from, to); hung >= 0 {
			// Work queued now would wait behind the unfinished copy and time out too:
			// skipping it makes a hung GPU cost one timeout, not one per pair.
			errs[k] = fmt.Errorf("not checked: GPU %d did not finish an earlier check within %v", hung, timeout)
			continue
		}
		errs[k] = checkPair(ctx, from, to, timeout)
	}
	var closeErrs []error
	for ordinal, d := range devs {
		if err := d.close(); err != nil {
			closeErrs = append(closeErrs, fmt.Errorf("release GPU %d: %w", ordinal, err))
		}
	}
	return errs, errors.Join(closeErrs...)
}

// busy is the ordinal of p's GPU whose earlier check did not finish, or -1.
func busy(p Pair, from, to *checkDevice) int {
	switch {
	case from.hung:
		return p.From
	case to.hung:
		return p.To
	}
	return -1
}

// checkPair writes random data from GPU from into memory on GPU to, with the copy kernel
// running on from (SM stores through the peer mapping, as the all-reduce does), reads it
// back on to and compares. Every wait has a deadline, so a link that swallows writes or
// hangs is an error, not a hung process. A hang or a fault fails the check but is no verdict
// (no linkFault): it may come from anything else on the GPU, and a later process checks again.
func checkPair(ctx context.Context, from, to *checkDevice, timeout time.Duration) (err error) {
	var undo []func() error
	defer func() {
		if from.hung || to.hung {
			return
		}
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](); uerr != nil && err == nil {
				err = fmt.Errorf("clean up: %w", uerr)
			}
		}
	}()

	if from != to {
		if err := from.ctx.EnablePeerAccess(to.ctx); err != nil {
			if errors.Is(err, driver.ErrPeerAccessUnsupported) {
				// CUDA offered peer access (cuDeviceCanAccessPeer) and then refused it.
				return linkFault{fmt.Errorf("enable peer access: %w", err)}
			}
			return fmt.Errorf("enable peer access: %w", err)
		}
	}
	src, err := from.ctx.Alloc(p2pCheckBytes)
	if err != nil {
		return err
	}
	undo = append(undo, func() error { return from.ctx.Free(src) })
	dst, err := to.ctx.Alloc(p2pCheckBytes)
	if err != nil {
		return err
	}
	undo = append(undo, func() error { return to.ctx.Free(dst) })
	in, err := from.ctx.AllocHost(p2pCheckBytes)
	if err != nil {
		return err
	}
	undo = append(undo, in.Close)
	out, err := to.ctx.AllocHost(p2pCheckBytes)
	if err != nil {
		return err
	}
	undo = append(undo, out.Close)
	sFrom, err := from.ctx.NewStream()
	if err != nil {
		return err
	}
	undo = append(undo, sFrom.Close)
	sTo, err := to.ctx.NewStream()
	if err != nil {
		return err
	}
	undo = append(undo, sTo.Close)
	cleared, err := to.ctx.NewEvent(false)
	if err != nil {
		return err
	}
	undo = append(undo, cleared.Close)
	copied, err := from.ctx.NewEvent(false)
	if err != nil {
		return err
	}
	undo = append(undo, copied.Close)

	want := in.Bytes()
	rand.Read(want) // never fails (crypto/rand since Go 1.24)
	var args driver.Args
	args.Ptr(dst)
	args.Ptr(src)
	args.U64(p2pCheckBytes / 16)
	cfg := driver.LaunchConfig{Grid: [3]uint32{64, 1, 1}, Block: [3]uint32{256, 1, 1}}
	// On to: clear the destination. On from: upload the data, wait for the clear, copy it
	// over the link. On to again: wait for the copy, read the destination back.
	for _, step := range []func() error{
		func() error { return sTo.MemsetD8Async(dst, 0, p2pCheckBytes) },
		func() error { return cleared.Record(sTo) },
		func() error { return sFrom.CopyHtoDAsync(src, in, 0, p2pCheckBytes) },
		func() error { return sFrom.WaitEvent(cleared) },
		func() error { return driver.Launch(sFrom, from.fn, &cfg, &args) },
		func() error { return copied.Record(sFrom) },
		func() error { return sTo.WaitEvent(copied) },
		func() error { return sTo.CopyDtoHAsync(out, 0, dst, p2pCheckBytes) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	// from's stream first: a fault of the kernel shows there, with its own error.
	if err := waitStreams(ctx, timeout, sFrom, sTo); err != nil {
		if ctx.Err() != nil || errors.Is(err, driver.ErrTimeout) {
			// The copy may still be running: what it uses must not be freed under it.
			from.hung, to.hung = true, true
		}
		return err
	}
	if got := out.Bytes(); !bytes.Equal(got, want) {
		return linkFault{mismatch(want, got)}
	}
	return nil
}

// waitStreams waits for the streams in turn, all within timeout. A timeout is an error
// matching driver.ErrTimeout.
func waitStreams(ctx context.Context, timeout time.Duration, streams ...*driver.Stream) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, s := range streams {
		if err := s.Wait(wctx); err != nil {
			if ctx.Err() == nil && errors.Is(err, driver.ErrTimeout) {
				return fmt.Errorf("copy over the link did not finish within %v: %w", timeout, err)
			}
			return err
		}
	}
	return nil
}

// mismatch describes how got differs from want.
func mismatch(want, got []byte) error {
	first, n := -1, 0
	for i := range want {
		if want[i] != got[i] {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	return fmt.Errorf("data written through the peer mapping did not arrive: %d of %d bytes differ (first at byte %d: wrote %#02x, read %#02x)",
		n, len(want), first, want[first], got[first])
}
