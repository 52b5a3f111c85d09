package bootstrap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// The socket protocol (Unix and TCP alike). Every message is a frame on a stream socket:
//
//	header  magic u32 | kind u8 | 3 zero bytes | seq u64 | payload length u32 | fd count u32
//	payload
//	chunks  magic u32 | fd count u32, one per further maxFDsPerMsg descriptors
//
// Little endian. The first maxFDsPerMsg descriptors ride on the header as SCM_RIGHTS, the rest on
// the chunks (Unix sockets only; a TCP frame carries none). Descriptors are attached to the
// sendmsg of a small fixed-size piece and the reader reads exactly that piece with recvmsg, never
// more (no buffering): on a stream socket the kernel hands descriptors to the read that returns
// the first byte they were sent with, and a plain read of those bytes would drop them.
//
// The reader decides from the header alone whether it wants the frame (its kind, sequence
// number, length and descriptor count), before it allocates the payload or reads further: a
// peer cannot make it reserve more than the limit of the message it expects, and descriptors
// that arrive where none are expected are closed at once.
const (
	frameMagic = 0x42434f47 // "GOCB"
	// protoVersion 2 added the token handshake (challenge and proof) to the hello.
	protoVersion = 2
	headerLen    = 24
	chunkLen     = 8
	// maxFDsPerMsg stays under Linux's SCM_MAX_FD (253 descriptors per message).
	maxFDsPerMsg = 250
	// maxHandshake bounds every frame of the handshake: hellos are 48 bytes, and a process
	// that has not proven who it is must not make rank 0 reserve more.
	maxHandshake = 4 << 10
	// maxAbort bounds a failure notice; longer texts are cut when sent.
	maxAbort = 16 << 10
)

type frame struct {
	kind    kind
	seq     uint64
	payload []byte
	fds     []int
}

// header is a frame's fixed part, as announced by its sender.
type header struct {
	kind kind
	seq  uint64
	size uint32 // payload bytes
	nfds uint32
}

// frameCheck decides from its header whether a frame is wanted. It runs before the payload is
// allocated and before any descriptor beyond the header's own is read; an error refuses the
// frame (its descriptors are closed).
type frameCheck func(h header) error

// encodeHeader is the header of f.
func encodeHeader(f frame) []byte {
	hdr := make([]byte, headerLen)
	binary.LittleEndian.PutUint32(hdr[0:], frameMagic)
	hdr[4] = byte(f.kind)
	binary.LittleEndian.PutUint64(hdr[8:], f.seq)
	binary.LittleEndian.PutUint32(hdr[16:], uint32(len(f.payload)))
	binary.LittleEndian.PutUint32(hdr[20:], uint32(len(f.fds)))
	return hdr
}

// parseHeader decodes a header of headerLen bytes.
func parseHeader(b []byte) (header, error) {
	if m := binary.LittleEndian.Uint32(b[0:]); m != frameMagic {
		return header{}, fmt.Errorf("bad frame magic %#x: not a goccl bootstrap peer, or the stream is out of step", m)
	}
	if b[5]|b[6]|b[7] != 0 {
		return header{}, errors.New("frame header has non-zero reserved bytes: not a goccl bootstrap peer, or the stream is out of step")
	}
	return header{
		kind: kind(b[4]),
		seq:  binary.LittleEndian.Uint64(b[8:]),
		size: binary.LittleEndian.Uint32(b[16:]),
		nfds: binary.LittleEndian.Uint32(b[20:]),
	}, nil
}

// writeFrame sends f on c; the caller sets c's deadline. Descriptors need a Unix socket.
func writeFrame(c net.Conn, f frame) error {
	if len(f.payload) > maxPayload || len(f.fds) > maxFrameFDs {
		return fmt.Errorf("%s frame of %d bytes and %d fds exceeds the protocol's limits", f.kind, len(f.payload), len(f.fds))
	}
	first := f.fds[:min(len(f.fds), maxFDsPerMsg)]
	if err := writeWithFDs(c, encodeHeader(f), first); err != nil {
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

// maxPayload and maxFrameFDs are what the wire format itself can carry; the limits that
// matter are the readers' (frameCheck).
const (
	maxPayload  = 1<<32 - 1
	maxFrameFDs = 1<<32 - 1
)

// writeWithFDs sends a piece of at most a few dozen bytes in one sendmsg, which the kernel
// never splits, with fds attached.
func writeWithFDs(c net.Conn, b []byte, fds []int) error {
	if len(fds) == 0 {
		_, err := c.Write(b)
		return err
	}
	u, ok := c.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("cannot send file descriptors over a %s connection: %w", c.LocalAddr().Network(), ErrFDPassingUnsupported)
	}
	n, _, err := u.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	if err == nil && n != len(b) {
		err = fmt.Errorf("short write with file descriptors: %d of %d bytes", n, len(b))
	}
	return err
}

// readFrame reads one frame from r (a *net.UnixConn receives descriptors; any other reader
// none), after check accepted its header; the caller sets r's deadline. It returns io.EOF when
// r closed cleanly before the frame began. Descriptors received are closed on every error,
// including a refusal by check.
func readFrame(r io.Reader, check frameCheck) (frame, error) {
	hdr := make([]byte, headerLen)
	fds, err := readPiece(r, hdr)
	if err != nil {
		return frame{}, err
	}
	f := frame{fds: fds} // every descriptor received so far, closed on error
	err = func() error {
		h, err := parseHeader(hdr)
		if err != nil {
			return err
		}
		f.kind, f.seq = h.kind, h.seq
		if err := check(h); err != nil {
			return err
		}
		nfds := int(h.nfds)
		if len(fds) != min(nfds, maxFDsPerMsg) {
			return fmt.Errorf("%s frame announces %d fds but carried %d", h.kind, nfds, len(fds))
		}
		f.payload = make([]byte, h.size)
		if _, err := io.ReadFull(r, f.payload); err != nil {
			return noEOF(err)
		}
		for len(f.fds) < nfds {
			b := make([]byte, chunkLen)
			got, err := readPiece(r, b)
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

// readPiece fills b; from a Unix socket it takes the descriptors sent with b's first byte.
func readPiece(r io.Reader, b []byte) ([]int, error) {
	u, ok := r.(*net.UnixConn)
	if !ok {
		_, err := io.ReadFull(r, b)
		return nil, err // io.EOF when nothing came: a clean close
	}
	oob := make([]byte, unix.CmsgSpace(maxFDsPerMsg*4))
	n, oobn, flags, _, err := u.ReadMsgUnix(b, oob)
	if err != nil {
		return nil, err
	}
	fds, perr := parseRights(oob[:oobn])
	switch {
	case perr != nil:
	case flags&unix.MSG_CTRUNC != 0:
		perr = errors.New("file descriptors were dropped in transit (MSG_CTRUNC): more than a frame may carry were attached, or this process is out of descriptors (raise `ulimit -n`)")
	case n == 0:
		perr = io.EOF // ReadMsgUnix reports a closed stream as 0 bytes, nil error
	}
	if perr == nil && n < len(b) {
		_, perr = io.ReadFull(u, b[n:])
		perr = noEOF(perr)
	}
	if perr != nil {
		closeFDs(fds)
		return nil, perr
	}
	return fds, nil
}

// parseRights returns the descriptors of every SCM_RIGHTS message in oob. On error it closes
// every descriptor it found, including those of messages after the bad one.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	var bad error
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			bad = fmt.Errorf("unexpected control message (level %d, type %d)", m.Header.Level, m.Header.Type)
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			bad = fmt.Errorf("parse SCM_RIGHTS: %w", err)
			continue
		}
		fds = append(fds, got...)
	}
	if bad != nil {
		closeFDs(fds)
		return nil, bad
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

// gatherLimit is the largest AllGather result rank 0 may send to a group of size ranks.
func gatherLimit(size int) uint64 {
	return 4 + 4*uint64(size) + min(uint64(size)*MaxBlob, MaxGather)
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
	if n := binary.LittleEndian.Uint32(p); uint64(n) != uint64(want) {
		return nil, bad(fmt.Sprintf("%d blobs for %d ranks", n, want))
	}
	p = p[4:]
	if uint64(len(p)) < 4*uint64(want) {
		return nil, bad(fmt.Sprintf("%d bytes cannot hold %d blob lengths", len(p), want))
	}
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
	msg := fmt.Sprintf("rank %d: %v", from, cause)
	if len(msg) > maxAbort-1 {
		msg = msg[:maxAbort-1]
		for len(msg) > 0 && !utf8.ValidString(msg) {
			msg = msg[:len(msg)-1] // never end in half a character
		}
	}
	return append([]byte{code}, msg...)
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

// checkAbort accepts an abort frame within its limits.
func checkAbort(h header) error {
	if h.size > maxAbort || h.nfds != 0 {
		return fmt.Errorf("abort frame of %d bytes with %d fds: more than a failure notice holds (a corrupt or foreign stream)", h.size, h.nfds)
	}
	return nil
}

// onlyAbort accepts an abort frame within its limits, and nothing else.
func onlyAbort(h header) error {
	if h.kind != kindAbort {
		return fmt.Errorf("got %s where only an abort could come (a corrupt stream)", h.kind)
	}
	return checkAbort(h)
}
