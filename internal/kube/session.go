package kube

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/istio-cni/istio-cni/internal/livetemp"
)

// MaxSessionFileBytes bounds a TLS session file (a ticket and the session's state,
// the server's certificate chain included: a few KiB). A larger file is not read.
const MaxSessionFileBytes = 64 << 10

// sessionMagic starts a session file; a file that does not start with it is not
// one of ours (or of an older format: version 1 had no refusal time) and is
// ignored.
const sessionMagic = "istio-cni tls session 2\n"

// ClassicalPause is how long resumed handshakes use the default key exchange
// after a server refused a session offered with the classical one (see
// resumeCurves): the refusal says the session may not be resumable there (an
// API server restarted, or one of several behind a load balancer, each with its
// own ticket keys), and each such refusal costs a second handshake. So a control
// plane of several API servers costs that at most once a ClassicalPause.
const ClassicalPause = 10 * time.Minute

// timeNow is the clock of the refusal times (a test's to set).
var timeNow = time.Now

// SessionFile keeps one TLS session to the API server in a file, so that the
// next process (the plugin runs once per pod) resumes it instead of a full
// handshake: the server then neither sends nor signs for its certificate, and the
// client verifies no chain. The key exchange still runs (TLS 1.3's psk_dhe_ke),
// so the connection keeps forward secrecy; a resumed handshake offers X25519
// alone (resumeCurves), its post-quantum protection coming from the stored
// session's secret, which only a full handshake with Go's default hybrid
// exchange makes: Save stores the session of a full handshake only.
//
// The file is bound to what authenticates the server and the client (the server
// URL, the CA, the client certificate, the server name): a session made under
// another kubeconfig is never offered. Anything unreadable, corrupt, of another
// binding or over MaxSessionFileBytes is ignored and the handshake is a full one.
// The file holds the session's secret, so it is written 0600 (a client
// certificate's session authenticates as that certificate, like the key beside
// it in the kubeconfig), and replaced whole by a rename.
//
// It implements tls.ClientSessionCache for one connection's life: Get offers the
// stored session, Put keeps what the server sent, Save writes it after a full
// handshake.
type SessionFile struct {
	path    string
	binding [sha256.Size]byte

	loaded bool
	stored *tls.ClientSessionState // offered by Get: the file's, or the latest Put
	dirty  bool                    // Put was called since the last Save
	// refused is when a server last refused a session offered with the classical
	// key exchange (zero: never, or more than a ClassicalPause ago when stored).
	refused time.Time
}

// NewSessionFile returns the session store at path for the client kc describes.
func NewSessionFile(path string, kc *Kubeconfig, serverName string) *SessionFile {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(kc.Server), kc.CAData, kc.ClientCertData, []byte(serverName), {boolByte(kc.InsecureSkipTLSVerify)}} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	s := &SessionFile{path: path}
	h.Sum(s.binding[:0])
	return s
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// Get offers the stored session, read from the file on first use.
func (s *SessionFile) Get(string) (*tls.ClientSessionState, bool) {
	if !s.loaded {
		s.loaded = true
		s.stored, s.refused, _ = s.load()
	}
	return s.stored, s.stored != nil
}

// OfferClassical says whether a handshake offering the stored session offers
// the classical key exchange (resumeCurves): there is a session, and no server
// refused one offered that way in the last ClassicalPause (a refusal dated in
// the future, by a clock set back since, counts as over).
func (s *SessionFile) OfferClassical() bool {
	if _, ok := s.Get(""); !ok {
		return false
	}
	return !s.pausing()
}

// pausing says whether a refusal is less than ClassicalPause old.
func (s *SessionFile) pausing() bool {
	if s.refused.IsZero() {
		return false
	}
	age := timeNow().Sub(s.refused)
	return age >= 0 && age < ClassicalPause
}

// Refused records that the server refused the stored session offered with the
// classical key exchange, and forgets the session; Save keeps the time with the
// next one.
func (s *SessionFile) Refused() {
	s.refused = timeNow()
	s.Put("", nil)
}

// Put keeps the session the server just sent, for Save and for the process's next
// connection (nil: the offered one is no longer valid, as crypto/tls says when it
// drops an expired session).
func (s *SessionFile) Put(_ string, cs *tls.ClientSessionState) {
	s.loaded, s.stored, s.dirty = true, cs, true
}

// load reads the stored session and the time of the last refusal stored with
// it; an error says why none is offered.
func (s *SessionFile) load() (*tls.ClientSessionState, time.Time, error) {
	data, err := readBounded(s.path, MaxSessionFileBytes)
	if err != nil {
		return nil, time.Time{}, err
	}
	rest, ok := bytes.CutPrefix(data, []byte(sessionMagic))
	if !ok {
		return nil, time.Time{}, fmt.Errorf("%s: not a session file", s.path)
	}
	if len(rest) < sha256.Size+8+2 || !bytes.Equal(rest[:sha256.Size], s.binding[:]) {
		return nil, time.Time{}, fmt.Errorf("%s: a session of another kubeconfig", s.path)
	}
	rest = rest[sha256.Size:]
	var refused time.Time
	if sec := int64(binary.BigEndian.Uint64(rest)); sec != 0 {
		refused = time.Unix(sec, 0)
	}
	rest = rest[8:]
	n := int(binary.BigEndian.Uint16(rest))
	if len(rest) < 2+n {
		return nil, time.Time{}, fmt.Errorf("%s: truncated", s.path)
	}
	ticket, state := rest[2:2+n], rest[2+n:]
	ss, err := tls.ParseSessionState(state)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%s: %w", s.path, err)
	}
	cs, err := tls.NewResumptionState(bytes.Clone(ticket), ss)
	return cs, refused, err
}

// Save writes the session the server sent during a full handshake (resumed is
// false), or removes the file when crypto/tls voided the stored one and nothing
// replaced it. After a resumed handshake the stored session stays: the server
// sends a new ticket then too, and writing it on every run would cost a file.
func (s *SessionFile) Save(resumed bool) error {
	dirty := s.dirty
	s.dirty = false
	if !dirty || resumed && s.stored != nil {
		return nil
	}
	if s.stored == nil {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("tls session: %w", err)
		}
		return nil
	}
	ticket, state, err := s.stored.ResumptionState()
	if err != nil || state == nil || len(ticket) > 0xffff {
		return nil // nothing resumable (a TLS 1.2 server without tickets, say)
	}
	sb, err := state.Bytes()
	if err != nil {
		return fmt.Errorf("tls session: %w", err)
	}
	var refused int64
	if s.pausing() {
		refused = s.refused.Unix()
	}
	var buf bytes.Buffer
	buf.WriteString(sessionMagic)
	buf.Write(s.binding[:])
	buf.Write(binary.BigEndian.AppendUint64(nil, uint64(refused)))
	buf.Write(binary.BigEndian.AppendUint16(nil, uint16(len(ticket))))
	buf.Write(ticket)
	buf.Write(sb)
	if buf.Len() > MaxSessionFileBytes {
		return nil // would not be read back
	}
	return writeReplacing(s.path, buf.Bytes())
}

// writeReplacing replaces path by a new 0600 file holding data, through a
// temporary file in the same directory and a rename: a reader (another plugin run)
// sees the old file or the new one whole.
func writeReplacing(path string, data []byte) (err error) {
	dir, base := filepath.Split(path)
	// Locked until after the rename: an agent's start removes it only once this
	// process is gone (livetemp).
	f, release, err := livetemp.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("tls session: %w", err)
	}
	defer release()
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("tls session: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("tls session: %w", err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("tls session: %w", err)
	}
	return nil
}

// IsSessionFileTemp says whether name is a temporary file of a session file named
// base that a process left when killed between write and rename.
func IsSessionFileTemp(name, base string) bool {
	return strings.HasPrefix(name, "."+base+".tmp-")
}
