package collective

import (
	"fmt"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/memory"
	"golang.org/x/sys/unix"
)

// mapPeers makes every rank's arena addressable here, enabling peer access to other devices
// of this process. It owns the received VMM fds (fds[r], r != own rank): each is consumed by
// memory.Open or closed on failure.
func (c *Comm) mapPeers(infos []rankInfo, fds [][]int) error {
	c.peers = make([]*memory.Mapping, c.size)
	for r, ri := range infos {
		fd := -1
		if len(fds[r]) > 0 && r != c.rank {
			fd = fds[r][0]
		}
		var err error
		if ri.Arena.Local() && ri.Device != int64(c.dev) {
			if err = c.enablePeer(int(ri.Device)); err != nil {
				err = fmt.Errorf("peer access to rank %d on device %d: %w", r, ri.Device, err)
			}
		}
		if err == nil {
			if c.peers[r], err = memory.Open(c.ctx, ri.Arena, fd); err != nil {
				err = fmt.Errorf("map the arena of rank %d: %w", r, err)
			}
			fd = -1 // Open consumed it
		}
		if err != nil {
			if fd >= 0 {
				unix.Close(fd)
			}
			for later := r + 1; later < c.size; later++ {
				if later != c.rank && len(fds[later]) > 0 {
					unix.Close(fds[later][0])
				}
			}
			return err
		}
	}
	return nil
}

func (c *Comm) enablePeer(ordinal int) error {
	dev, err := driver.GetDevice(ordinal)
	if err != nil {
		return err
	}
	for _, p := range c.peerCtx {
		if p.Device() == dev {
			return nil
		}
	}
	pctx, err := driver.PrimaryContext(dev)
	if err != nil {
		return err
	}
	c.peerCtx = append(c.peerCtx, pctx)
	return c.ctx.EnablePeerAccess(pctx)
}

// openedBuffer is a peer's user allocation mapped through IPC, shared by every registration
// and captured graph that uses it: an IPC handle may be opened only once per process.
type openedBuffer struct {
	m    *memory.Mapping
	refs int
}

// open maps a peer's user buffer, reusing an earlier mapping of the same allocation, and
// returns its address here and the key to release it with (nil for memory of this process,
// which needs no mapping).
func (c *Comm) open(d memory.Descriptor) (driver.DevicePtr, *ipcKey, error) {
	if d.Local() {
		return driver.DevicePtr(d.Ptr), nil, nil
	}
	key := ipcKey{process: d.Process, handle: d.Handle}
	ob, ok := c.opened[key]
	if !ok {
		base := d
		base.Offset = 0
		m, err := memory.Open(c.ctx, base, -1)
		if err != nil {
			return 0, nil, err
		}
		ob = &openedBuffer{m: m}
		c.opened[key] = ob
	}
	ob.refs++
	return ob.m.Ptr() + driver.DevicePtr(d.Offset), &key, nil
}

// unopen drops one reference to a peer buffer taken by open and unmaps it with the last. The
// caller makes sure no queued kernel still reads it.
func (c *Comm) unopen(keys []ipcKey) error {
	var first error
	for _, k := range keys {
		ob := c.opened[k]
		if ob == nil {
			continue
		}
		if ob.refs--; ob.refs > 0 {
			continue
		}
		delete(c.opened, k)
		if err := ob.m.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
