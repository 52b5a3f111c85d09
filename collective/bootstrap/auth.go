package bootstrap

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// TokenEnv names the environment variable that holds the job token: a secret that every rank
// of one job shares and no other process knows (for example 32 random bytes in hex, made by the
// launcher for each job). NewUnix and FromEnv read it; NewTCP requires one.
//
// With a token, rank 0 admits only processes that prove they know it, and the other ranks
// accept a rank 0 only once it has proven it too (an HMAC-SHA256 of both sides' fresh nonces:
// the token itself never travels). Without one, any process of the same user that reaches the
// socket can join a job, or pose as its rank 0.
const TokenEnv = "GOCCL_JOB_TOKEN"

// MinTCPToken is the shortest token NewTCP accepts: over a network the token is the only
// thing that keeps other machines out, so it must not be guessable.
const MinTCPToken = 16

// Handshake defaults (Options).
const (
	// DefaultHandshakeTimeout bounds each connection's handshake on rank 0.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxPending bounds the connections rank 0 handshakes with at once.
	DefaultMaxPending = 64
)

// The handshake, before any call: the joining rank sends a hello; rank 0 answers with a
// challenge that proves it knows the token; the rank answers with its own proof; once every
// rank has joined, rank 0 sends each a welcome. Both proofs cover the hello (so its rank and
// size) and both nonces, so neither can be replayed on another connection.
//
//	hello      version u32 | flags u32 | rank u32 | size u32 | rank's nonce [32]
//	challenge  flags u32 | rank 0's nonce [32] | rank 0's proof [32]
//	proof      the rank's proof [32]
//
// A proof is HMAC-SHA256(token, role | hello | rank 0's nonce); without a token the key is
// empty and a proof shows only that both sides speak the protocol.
const (
	nonceLen     = 32
	proofLen     = sha256.Size
	helloLen     = 16 + nonceLen
	challengeLen = 4 + nonceLen + proofLen
	// flagToken says the sender has a token (so its proofs use it).
	flagToken uint32 = 1
	// roleRoot and roleRank keep rank 0's proof and a rank's apart: one can never pass for the
	// other.
	roleRoot = "goccl bootstrap: rank 0\x00"
	roleRank = "goccl bootstrap: rank\x00"
)

// hello is what a rank sends rank 0 on connecting.
type hello struct {
	version, flags, rank, size uint32
	nonce                      [nonceLen]byte
}

func (h hello) encode() []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, helloLen), h.version)
	b = binary.LittleEndian.AppendUint32(b, h.flags)
	b = binary.LittleEndian.AppendUint32(b, h.rank)
	b = binary.LittleEndian.AppendUint32(b, h.size)
	return append(b, h.nonce[:]...)
}

func decodeHello(p []byte) (hello, error) {
	if len(p) >= 4 {
		if v := binary.LittleEndian.Uint32(p); v != protoVersion {
			return hello{}, fmt.Errorf("it speaks bootstrap protocol version %d, rank 0 speaks %d (different goccl versions?)", v, protoVersion)
		}
	}
	if len(p) != helloLen {
		return hello{}, fmt.Errorf("hello of %d bytes, want %d", len(p), helloLen)
	}
	h := hello{
		version: binary.LittleEndian.Uint32(p[0:]),
		flags:   binary.LittleEndian.Uint32(p[4:]),
		rank:    binary.LittleEndian.Uint32(p[8:]),
		size:    binary.LittleEndian.Uint32(p[12:]),
	}
	copy(h.nonce[:], p[16:])
	return h, nil
}

type challenge struct {
	flags uint32
	nonce [nonceLen]byte
	proof [proofLen]byte
}

func (c challenge) encode() []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, challengeLen), c.flags)
	b = append(b, c.nonce[:]...)
	return append(b, c.proof[:]...)
}

func decodeChallenge(p []byte) (challenge, error) {
	if len(p) != challengeLen {
		return challenge{}, fmt.Errorf("challenge of %d bytes, want %d", len(p), challengeLen)
	}
	c := challenge{flags: binary.LittleEndian.Uint32(p)}
	copy(c.nonce[:], p[4:])
	copy(c.proof[:], p[4+nonceLen:])
	return c, nil
}

// prove is the proof of role over one handshake.
func prove(token []byte, role string, helloBytes []byte, rootNonce [nonceLen]byte) [proofLen]byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(role))
	m.Write(helloBytes)
	m.Write(rootNonce[:])
	var p [proofLen]byte
	m.Sum(p[:0])
	return p
}

func newNonce() ([nonceLen]byte, error) {
	var n [nonceLen]byte
	if _, err := rand.Read(n[:]); err != nil {
		return n, fmt.Errorf("make a handshake nonce: %w", err)
	}
	return n, nil
}

// auth is how one rank authenticates the others: the job's token and, on Unix sockets, the
// user its peers must run as.
type auth struct {
	token []byte // empty: no token
	// uid is the user id every peer must run as (SO_PEERCRED), or -1 where the transport
	// cannot tell (TCP).
	uid        int
	timeout    time.Duration // each handshake, on rank 0
	maxPending int
}

func newAuth(token string, peerUID bool, o Options) (*auth, error) {
	a := &auth{token: []byte(token), uid: -1, timeout: o.HandshakeTimeout, maxPending: o.MaxPending}
	if peerUID {
		a.uid = os.Getuid()
	}
	switch {
	case a.timeout < 0:
		return nil, fmt.Errorf("Options.HandshakeTimeout %v is negative", a.timeout)
	case a.timeout == 0:
		a.timeout = DefaultHandshakeTimeout
	}
	switch {
	case a.maxPending < 0:
		return nil, fmt.Errorf("Options.MaxPending %d is negative", a.maxPending)
	case a.maxPending == 0:
		a.maxPending = DefaultMaxPending
	}
	return a, nil
}

func (a *auth) flags() uint32 {
	if len(a.token) > 0 {
		return flagToken
	}
	return 0
}

// noTokenNote is added where a handshake fails without a token, to say what that means.
func (a *auth) noTokenNote() string {
	if len(a.token) > 0 {
		return ""
	}
	return fmt.Sprintf(" (no job token is set: any process of this user can join or disrupt this job; set %s to a per-job secret for every rank)", TokenEnv)
}

// arrival is a connection to rank 0 after its handshake.
type arrival struct {
	c   net.Conn // nil once refused
	h   hello
	who string // who connected, as far as the transport tells
	// err is why the connection was refused; nil for a rank that proved the token (or, without
	// a token, one of this user that speaks the protocol).
	err       error
	probe     bool  // it connected and left without a word (another rank 0's stale-socket check)
	acceptErr error // the listener failed
}

// noticeTimeout bounds the notice rank 0 sends a refused connection: the peer may be hostile.
const noticeTimeout = 250 * time.Millisecond

// serve runs rank 0's side of one connection's handshake, within ctx and a.timeout. It never
// fails the group: a refused connection gets a notice of why (best effort) and is closed, and
// the arrival says why it was refused.
func (a *auth) serve(ctx context.Context, c net.Conn) arrival {
	ar := arrival{c: c, who: c.RemoteAddr().String()}
	err := a.admitConn(ctx, c, &ar)
	switch {
	case ar.probe:
		c.Close()
		ar.c = nil
	case err != nil:
		ar.err = fmt.Errorf("%s: %w", ar.who, err)
		_ = c.SetWriteDeadline(time.Now().Add(noticeTimeout))
		_ = writeFrame(c, frame{kind: kindAbort, payload: encodeAbort(0, fmt.Errorf("refused this connection: %w", err))})
		c.Close()
		ar.c = nil
	}
	return ar
}

func (a *auth) admitConn(ctx context.Context, c net.Conn, ar *arrival) error {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	stop := watchCtx(ctx, c)
	defer stop()
	if a.uid >= 0 {
		cred, err := peerCred(c)
		if err != nil {
			return err
		}
		ar.who = fmt.Sprintf("pid %d (uid %d)", cred.Pid, cred.Uid)
		if int(cred.Uid) != a.uid {
			return fmt.Errorf("it runs as uid %d, this job as uid %d", cred.Uid, a.uid)
		}
	}
	timedOut := func(err error, what string) error {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("no %s within %v", what, a.timeout)
		}
		return err
	}
	f, err := readFrame(c, func(h header) error {
		switch {
		case h.kind != kindHello:
			return fmt.Errorf("first message is %s, not hello", h.kind)
		case h.size > maxHandshake || h.nfds != 0:
			return fmt.Errorf("hello announces %d bytes and %d fds; a hello has %d bytes and none", h.size, h.nfds, helloLen)
		}
		return nil
	})
	if errors.Is(err, io.EOF) {
		ar.probe = true
		return nil
	}
	if err != nil {
		return timedOut(err, "hello")
	}
	h, err := decodeHello(f.payload)
	if err != nil {
		return err
	}
	ar.h = h
	if len(a.token) > 0 && h.flags&flagToken == 0 {
		return fmt.Errorf("it has no job token, and this job has one: set the same %s for every rank", TokenEnv)
	}
	ch := challenge{flags: a.flags()}
	if ch.nonce, err = newNonce(); err != nil {
		return err
	}
	ch.proof = prove(a.token, roleRoot, f.payload, ch.nonce)
	if err := writeFrame(c, frame{kind: kindChallenge, payload: ch.encode()}); err != nil {
		return timedOut(err, "room to send the challenge")
	}
	p, err := readFrame(c, func(h header) error {
		switch {
		case h.kind == kindAbort:
			return checkAbort(h)
		case h.kind != kindProof:
			return fmt.Errorf("answered the challenge with %s, not a proof", h.kind)
		case h.size != proofLen || h.nfds != 0:
			return fmt.Errorf("proof announces %d bytes and %d fds; a proof has %d bytes and none", h.size, h.nfds, proofLen)
		}
		return nil
	})
	switch {
	case err != nil:
		return timedOut(noEOF(err), "proof")
	case p.kind == kindAbort:
		return fmt.Errorf("it gave up the handshake: %q", decodeAbort(int(h.rank), p.payload).Error())
	}
	want := prove(a.token, roleRank, f.payload, ch.nonce)
	if !hmac.Equal(p.payload, want[:]) {
		return errors.New("wrong job token")
	}
	return nil
}

// join runs a rank's side of the handshake on c, a connection to where (what rank 0 was
// told to listen at), up to the welcome, which the caller awaits.
func (a *auth) join(ctx context.Context, c net.Conn, where string, rank, size int) error {
	start := time.Now()
	stop := watchCtx(ctx, c)
	defer stop()
	who := "rank 0 " + where
	if a.uid >= 0 {
		cred, err := peerCred(c)
		if err != nil {
			return err
		}
		who = fmt.Sprintf("the process listening %s (pid %d)", where, cred.Pid)
		if int(cred.Uid) != a.uid {
			return fmt.Errorf("%s runs as uid %d, this rank as uid %d: it is not this job's rank 0: %w", who, cred.Uid, a.uid, ErrHandshake)
		}
	}
	h := hello{version: protoVersion, flags: a.flags(), rank: uint32(rank), size: uint32(size)}
	var err error
	if h.nonce, err = newNonce(); err != nil {
		return err
	}
	hb := h.encode()
	werr := writeFrame(c, frame{kind: kindHello, payload: hb})
	// Even when the hello could not be sent, rank 0 may have said why it hung up.
	f, err := readFrame(c, func(h header) error {
		switch {
		case h.kind == kindAbort:
			return checkAbort(h)
		case h.kind != kindChallenge:
			return fmt.Errorf("%s answered the hello with %s, not a challenge: %w", who, h.kind, ErrHandshake)
		case h.size != challengeLen || h.nfds != 0:
			return fmt.Errorf("%s sent a challenge of %d bytes and %d fds, not %d bytes and none: %w", who, h.size, h.nfds, challengeLen, ErrHandshake)
		}
		return nil
	})
	switch {
	case werr != nil && (err != nil || f.kind != kindAbort):
		return fmt.Errorf("send hello to %s: %w", who, werr)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, unix.ECONNRESET):
		return fmt.Errorf("%s closed the connection during the handshake (does every rank have the same %s?)%s: %w",
			who, TokenEnv, a.noTokenNote(), ErrHandshake)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return timeoutError(ctx, time.Since(start), who+" to answer the hello (is it this job's rank 0?)")
	case err != nil:
		return err
	case f.kind == kindAbort:
		// Not yet authenticated: its text is shown as a quote, and its sentinel is not trusted.
		return fmt.Errorf("%s refused this rank: %q: %w", who, decodeAbort(0, f.payload).Error(), ErrHandshake)
	}
	ch, err := decodeChallenge(f.payload)
	if err != nil {
		return fmt.Errorf("%s: %w: %w", who, err, ErrHandshake)
	}
	giveUp := func(why error) error {
		_ = writeFrame(c, frame{kind: kindAbort, payload: encodeAbort(rank, why)})
		return fmt.Errorf("%w: %w", why, ErrHandshake)
	}
	switch {
	case ch.flags&flagToken != 0 && len(a.token) == 0:
		return giveUp(fmt.Errorf("%s has a job token and rank %d has none: set the same %s for every rank", who, rank, TokenEnv))
	case ch.flags&flagToken == 0 && len(a.token) > 0:
		return giveUp(fmt.Errorf("rank %d has a job token and %s has none: set the same %s for every rank, or it is not this job's rank 0", rank, who, TokenEnv))
	}
	want := prove(a.token, roleRoot, hb, ch.nonce)
	if !hmac.Equal(ch.proof[:], want[:]) {
		return giveUp(fmt.Errorf("%s did not prove that it knows this rank's job token: it is not this job's rank 0 (another job at the same address, or an impostor), or the ranks were given different tokens", who))
	}
	mine := prove(a.token, roleRank, hb, ch.nonce)
	if err := writeFrame(c, frame{kind: kindProof, payload: mine[:]}); err != nil {
		return fmt.Errorf("send proof to %s: %w", who, err)
	}
	return nil
}

// peerCred returns the credentials of the process at the other end of a Unix socket: the
// process that connected, or the one that listened.
func peerCred(c net.Conn) (*unix.Ucred, error) {
	u, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("peer credentials need a Unix socket, not %s", c.LocalAddr().Network())
	}
	raw, err := u.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("read peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("read peer credentials: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("read peer credentials (SO_PEERCRED): %w", cerr)
	}
	return cred, nil
}
