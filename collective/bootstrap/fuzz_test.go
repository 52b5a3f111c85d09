package bootstrap

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzReadFrame feeds arbitrary bytes to the frame decoder and to the decoders of every
// payload, as a hostile peer would. They must never panic, never accept a frame over the
// limit the check sets, never allocate beyond it, and what they accept must encode back to
// the same bytes. The seeds under testdata/fuzz/FuzzReadFrame run with every `go test`.
func FuzzReadFrame(f *testing.F) {
	h := hello{version: protoVersion, flags: flagToken, rank: 1, size: 2}
	for _, fr := range []frame{
		{kind: kindHello, payload: h.encode()},
		{kind: kindChallenge, payload: challenge{flags: flagToken}.encode()},
		{kind: kindProof, payload: make([]byte, proofLen)},
		{kind: kindWelcome},
		{kind: kindAllGather, seq: 1, payload: []byte("blob")},
		{kind: kindAllGather, seq: 1, payload: encodeBlobs([][]byte{[]byte("a"), nil, []byte("ccc")})},
		{kind: kindBarrier, seq: 7},
		{kind: kindAbort, payload: encodeAbort(2, ErrMismatch)},
	} {
		f.Add(append(encodeHeader(fr), fr.payload...))
	}
	f.Add(rawHeader(kindHello, 0, 1<<30, 0))
	f.Add(rawHeader(kindAllGatherFDs, 1, 0, 3))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{})

	const limit = 4 << 10
	f.Fuzz(func(t *testing.T, data []byte) {
		var announced header
		fr, err := readFrame(bytes.NewReader(data), func(h header) error {
			announced = h
			if h.size > limit {
				return errTooBig
			}
			return nil
		})
		if err != nil {
			return
		}
		if len(fr.fds) != 0 {
			t.Fatalf("a byte stream produced descriptors %v", fr.fds)
		}
		if announced.nfds != 0 {
			t.Fatalf("accepted a frame announcing %d fds without any", announced.nfds)
		}
		if len(fr.payload) > limit || uint32(len(fr.payload)) != announced.size {
			t.Fatalf("payload of %d bytes, announced %d, limit %d", len(fr.payload), announced.size, limit)
		}
		if got := append(encodeHeader(fr), fr.payload...); !bytes.Equal(got, data[:len(got)]) {
			t.Fatalf("frame re-encodes to %x, read from %x", got, data[:len(got)])
		}
		p := fr.payload
		if h, err := decodeHello(p); err == nil && !bytes.Equal(h.encode(), p) {
			t.Fatalf("hello re-encodes to %x, decoded from %x", h.encode(), p)
		}
		if c, err := decodeChallenge(p); err == nil && !bytes.Equal(c.encode(), p) {
			t.Fatalf("challenge re-encodes to %x, decoded from %x", c.encode(), p)
		}
		ranks := 1
		if len(p) >= 4 {
			ranks = int(binary.LittleEndian.Uint32(p) % (MaxRanks + 1))
		}
		if blobs, err := decodeBlobs(p, ranks); err == nil {
			if len(blobs) != ranks || !bytes.Equal(encodeBlobs(blobs), p) {
				t.Fatalf("%d blobs re-encode to %x, decoded from %x", len(blobs), encodeBlobs(blobs), p)
			}
			for r, b := range blobs {
				if b == nil {
					t.Fatalf("blob %d is nil", r)
				}
			}
		}
		_ = decodeAbort(1, p).Error()
	})
}

var errTooBig = bytesError("frame over the fuzz limit")

type bytesError string

func (e bytesError) Error() string { return string(e) }
