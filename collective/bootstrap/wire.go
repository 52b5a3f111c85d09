package bootstrap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// The Unix-socket protocol. Every message is a frame on a stream socket:
//
//	header  magic u32 | kind u8 | 3 zero bytes | seq u64 | payload length u32 | fd count u32
//	payload
//	chunks  magic u32 | fd count u32, one per further maxFDsPerMsg descriptors
//
// Little endian. The first maxFDsPerMsg descriptors ride on the header as SCM_RIGHTS, the rest on
// the chunks. Descriptors are attached to the sendmsg of a small fixed-size piece and the reader
// reads exactly that piece with recvmsg, never more (no buffering): on a stream socket the kernel
// hands descriptors to the read that returns the first byte they were sent with, and a plain read
// of those bytes would drop them.
const (
	frameMagic   = 0x42434f47 // "GOCB"
	protoVersion = 1
	headerLen    = 24
	chunkLen     = 8
	// maxFDsPerMsg stays under Linux's SCM_MAX_FD (253 descriptors per message).
	maxFDsPerMsg = 250
	// maxPayload bounds what a reader allocates for a length it was sent: bootstrap blobs are
	// small, so a larger length means a corrupt or foreign stream.
	maxPayload = 1 << 30
)

type frame struct {
	kind    kind
	seq     uint64
	payload []byte
	fds     []int
}

// writeFrame sends f on c; the caller sets c's deadline.
func writeFrame(c *net.UnixConn, f frame) error {
	hdr := make([]byte, headerLen)
	binary.LittleEndian.PutUint32(hdr[0:], frameMagic)
	hdr[4] = byte(f.kind)
	binary.LittleEndian.PutUint64(hdr[8:], f.seq)
	binary.LittleEndian.PutUint32(hdr[16:], uint32(len(f.payload)))
	binary.LittleEndian.PutUint32(hdr[20:], uint32(len(f.fds)))
	first := f.fds[:min(len(f.fds), maxFDsPerMsg)]
	if err := writeWithFDs(c, hdr, first); err != nil {
		return err
	}
	// Not even an empty write once the frame is complete: the receiver may have answered and
	// closed already, and a write of nothing to a closed peer still fails with EPIPE.
	if len(f.payload) > 0 {
		if _, err := c.Write(f.payload); err != nil {
			return err
		}
	}
	for rest := f.fds[len(first):]; len(rest) > 0; {
		chunk := rest[:min(len(rest), maxFDsPerMsg)]
		rest = rest[len(chunk):]
		b := make([]byte, chunkLen)
		binary.LittleEndian.PutUint32(b[0:], frameMagic)
		binary.LittleEndian.PutUint32(b[4:], uint32(len(chunk)))
		if err := writeWithFDs(c, b, chunk); err != nil {
			return err
		}
	}
	return nil
}

// writeWithFDs sends a piece of at most a few dozen bytes in one sendmsg, which the kernel
// never splits, with fds attached.
func writeWithFDs(c *net.UnixConn, b []byte, fds []int) error {
	if len(fds) == 0 {
		_, err := c.Write(b)
		return err
	}
	n, _, err := c.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	if err == nil && n != len(b) {
		err = fmt.Errorf("short write with file descriptors: %d of %d bytes", n, len(b))
	}
	return err
}

// readFrame reads one frame from c; the caller sets c's deadline. It returns io.EOF when c
// closed cleanly before the frame began. Descriptors received are closed on error.
func readFrame(c *net.UnixConn) (frame, error) {
	hdr := make([]byte, headerLen)
	fds, err := readWithFDs(c, hdr)
	if err != nil {
		return frame{}, err
	}
	f := frame{
		kind: kind(hdr[4]),
		seq:  binary.LittleEndian.Uint64(hdr[8:]),
		fds:  fds,
	}
	err = func() error {
		if m := binary.LittleEndian.Uint32(hdr[0:]); m != frameMagic {
			return fmt.Errorf("bad frame magic %#x: not a goccl bootstrap peer, or the stream is out of step", m)
		}
		size := binary.LittleEndian.Uint32(hdr[16:])
		nfds := int(binary.LittleEndian.Uint32(hdr[20:]))
		if size > maxPayload {
			return fmt.Errorf("%s frame announces %d bytes, more than the %d a bootstrap accepts", f.kind, size, maxPayload)
		}
		if len(f.fds) != min(nfds, maxFDsPerMsg) {
			return fmt.Errorf("%s frame announces %d fds but carried %d", f.kind, nfds, len(f.fds))
		}
		f.payload = make([]byte, size)
		if _, err := io.ReadFull(c, f.payload); err != nil {
			return noEOF(err)
		}
		for len(f.fds) < nfds {
			b := make([]byte, chunkLen)
			got, err := readWithFDs(c, b)
			f.fds = append(f.fds, got...)
			if err != nil {
				return noEOF(err)
			}
			if m := binary.LittleEndian.Uint32(b[0:]); m != frameMagic {
				return fmt.Errorf("bad fd chunk magic %#x: the stream is out of step", m)
			}
			if n := int(binary.LittleEndian.Uint32(b[4:])); n != len(got) || len(f.fds) > nfds {
				return fmt.Errorf("fd chunk announces %d fds but carried %d (%d of %d so far)", n, len(got), len(f.fds), nfds)
			}
		}
		return nil
	}()
	if err != nil {
		closeFDs(f.fds)
		return frame{}, err
	}
	return f, nil
}

// readWithFDs fills b, taking the descriptors sent with its first byte.
func readWithFDs(c *net.UnixConn, b []byte) ([]int, error) {
	oob := make([]byte, unix.CmsgSpace(maxFDsPerMsg*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		return nil, err
	}
	fds, perr := parseRights(oob[:oobn])
	switch {
	case perr != nil:
	case flags&unix.MSG_CTRUNC != 0:
		perr = errors.New("file descriptors were dropped in transit (MSG_CTRUNC): is this process out of descriptors? raise `ulimit -n`")
	case n == 0:
		perr = io.EOF // ReadMsgUnix reports a closed stream as 0 bytes, nil error
	}
	if perr == nil && n < len(b) {
		_, perr = io.ReadFull(c, b[n:])
		perr = noEOF(perr)
	}
	if perr != nil {
		closeFDs(fds)
		return nil, perr
	}
	return fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			closeFDs(fds)
			return nil, fmt.Errorf("parse SCM_RIGHTS: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// noEOF turns EOF in the middle of a frame into io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// watchCtx bounds c's reads and writes by ctx: its deadline now, its cancellation when it
// happens. stop must be called before the next watchCtx on c; it returns only once a pending
// cancellation has been applied, so it cannot clobber the next call's deadline.
func watchCtx(ctx context.Context, c net.Conn) (stop func()) {
	d, _ := ctx.Deadline()
	_ = c.SetDeadline(d) // fails only on a closed conn, which the I/O reports
	fired := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		_ = c.SetDeadline(time.Unix(1, 0)) // a past deadline wakes blocked I/O
		close(fired)
	})
	return func() {
		if !stopAfter() {
			<-fired
		}
	}
}

// encodeBlobs packs an AllGather result: count u32, then per blob length u32 and bytes.
func encodeBlobs(blobs [][]byte) []byte {
	n := 4
	for _, b := range blobs {
		n += 4 + len(b)
	}
	out := binary.LittleEndian.AppendUint32(make([]byte, 0, n), uint32(len(blobs)))
	for _, b := range blobs {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out
}

func decodeBlobs(p []byte, want int) ([][]byte, error) {
	bad := func(why string) error { return fmt.Errorf("malformed AllGather result from rank 0: %s", why) }
	if len(p) < 4 {
		return nil, bad("no count")
	}
	if n := int(binary.LittleEndian.Uint32(p)); n != want {
		return nil, bad(fmt.Sprintf("%d blobs for %d ranks", n, want))
	}
	p = p[4:]
	blobs := make([][]byte, want)
	for r := range blobs {
		if len(p) < 4 {
			return nil, bad(fmt.Sprintf("truncated at rank %d", r))
		}
		n := binary.LittleEndian.Uint32(p)
		p = p[4:]
		if uint64(n) > uint64(len(p)) {
			return nil, bad(fmt.Sprintf("rank %d's blob runs past the end", r))
		}
		blobs[r] = cloneBlob(p[:n])
		p = p[n:]
	}
	if len(p) != 0 {
		return nil, bad(fmt.Sprintf("%d trailing bytes", len(p)))
	}
	return blobs, nil
}

// hello is what a rank sends rank 0 on connecting.
type hello struct{ version, rank, size uint32 }

func (h hello) encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, h.version)
	b = binary.LittleEndian.AppendUint32(b, h.rank)
	return binary.LittleEndian.AppendUint32(b, h.size)
}

func decodeHello(p []byte) (hello, error) {
	if len(p) != 12 {
		return hello{}, fmt.Errorf("hello of %d bytes, want 12", len(p))
	}
	return hello{
		version: binary.LittleEndian.Uint32(p[0:]),
		rank:    binary.LittleEndian.Uint32(p[4:]),
		size:    binary.LittleEndian.Uint32(p[8:]),
	}, nil
}

// An abort frame carries a rank's failure to the others (from rank 0 to every rank, or from a
// rank to rank 0): a code saying which sentinel the failure wraps, then its text.
const (
	abortOther byte = iota
	abortPeerLost
	abortMismatch
	abortHandshake
	abortDeadline
	abortCanceled
)

var abortSentinels = []struct {
	code byte
	err  error
}{
	{abortPeerLost, ErrPeerLost},
	{abortMismatch, ErrMismatch},
	{abortHandshake, ErrHandshake},
	{abortDeadline, context.DeadlineExceeded},
	{abortCanceled, context.Canceled},
}

func encodeAbort(from int, cause error) []byte {
	code := abortOther
	for _, s := range abortSentinels {
		if errors.Is(cause, s.err) {
			code = s.code
			break
		}
	}
	return append([]byte{code}, fmt.Sprintf("rank %d: %v", from, cause)...)
}

// remoteError is a failure reported by another rank: its text, and the sentinel it wrapped
// there.
type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }

func decodeAbort(from int, p []byte) error {
	if len(p) == 0 {
		return &remoteError{msg: fmt.Sprintf("rank %d aborted without a reason", from), is: ErrPeerLost}
	}
	e := &remoteError{msg: string(p[1:]), is: ErrPeerLost}
	for _, s := range abortSentinels {
		if s.code == p[0] {
			e.is = s.err
		}
	}
	return e
}
