// Package sealed encrypts small values at rest with AES-256-GCM under a keyring read from a
// key file, so a key can be rotated: the first key seals, every listed key opens, and each
// sealed value records the id of the key that sealed it.
//
// Key file format: one key per line, `<key-id>:<base64 of 32 random bytes>` (standard base64,
// padded or not). The key id is 1 to 64 characters of [A-Za-z0-9._-]. Blank lines and lines
// starting with # are ignored. The first key is the active one. Generate a line with
//
//	printf 'k2:%s\n' "$(head -c 32 /dev/urandom | base64)"
//
// Sealed value (the envelope): the byte 'S', the format version 1, the key id's length (one
// byte), the key id, a random 96-bit nonce, then the GCM ciphertext and tag. The additional
// authenticated data is the envelope's header (version and key id) followed by the caller's
// context, e.g. the bucket key the value is stored under, so a value moved to another key
// does not open.
package sealed

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

const (
	magic     = 'S'
	version   = 1
	keySize   = 32
	nonceSize = 12
	maxIDLen  = 64
)

var validID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ErrUnknownKey is returned (wrapped, naming the key id) when a value was sealed with a key
// the keyring does not hold.
var ErrUnknownKey = errors.New("unknown key id")

// ErrNotSealed is returned by KeyID and Open for bytes that are not a sealed envelope.
var ErrNotSealed = errors.New("not a sealed value")

// Keyring holds the keys of a key file: the first seals, all open.
type Keyring struct {
	ids   []string
	aeads map[string]cipher.AEAD
}

// Key is one key of a keyring.
type Key struct {
	ID    string
	Bytes []byte
}

// NewKeyring builds a keyring from keys, the first being the active one.
func NewKeyring(keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("keyring: no keys")
	}
	r := &Keyring{aeads: map[string]cipher.AEAD{}}
	for _, k := range keys {
		if !validID.MatchString(k.ID) {
			return nil, fmt.Errorf("keyring: key id %q: want 1 to %d characters of [A-Za-z0-9._-]", k.ID, maxIDLen)
		}
		if _, dup := r.aeads[k.ID]; dup {
			return nil, fmt.Errorf("keyring: key id %q listed twice", k.ID)
		}
		if len(k.Bytes) != keySize {
			return nil, fmt.Errorf("keyring: key %q is %d bytes, want %d", k.ID, len(k.Bytes), keySize)
		}
		block, err := aes.NewCipher(k.Bytes)
		if err != nil {
			return nil, fmt.Errorf("keyring: key %q: %w", k.ID, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("keyring: key %q: %w", k.ID, err)
		}
		r.ids = append(r.ids, k.ID)
		r.aeads[k.ID] = aead
	}
	return r, nil
}

// ParseKeyring parses a key file's content. Errors name the line and the key id, never the
// key material.
func ParseKeyring(data []byte) (*Keyring, error) {
	var keys []Key
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, enc, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("line %d: want key-id:base64-key", n)
		}
		id = strings.TrimSpace(id)
		if !validID.MatchString(id) {
			return nil, fmt.Errorf("line %d: key id: want 1 to %d characters of [A-Za-z0-9._-]", n, maxIDLen)
		}
		key, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(strings.TrimSpace(enc), "="))
		if err != nil {
			return nil, fmt.Errorf("line %d: key %q is not valid base64", n, id)
		}
		keys = append(keys, Key{ID: id, Bytes: key})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errors.New("no keys (want lines of key-id:base64-key)")
	}
	return NewKeyring(keys...)
}

// LoadKeyring reads a key file.
func LoadKeyring(path string) (*Keyring, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read key file: %w", err)
	}
	r, err := ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return r, nil
}

// ActiveID is the id of the key that seals.
func (r *Keyring) ActiveID() string { return r.ids[0] }

// IDs lists the key ids, the active one first.
func (r *Keyring) IDs() []string { return append([]string(nil), r.ids...) }

// Has tells whether the keyring holds key id.
func (r *Keyring) Has(id string) bool { _, ok := r.aeads[id]; return ok }

// Seal encrypts plaintext with the active key, bound to context.
func (r *Keyring) Seal(plaintext, context []byte) ([]byte, error) {
	id := r.ids[0]
	header := append([]byte{magic, version, byte(len(id))}, id...)
	out := make([]byte, len(header)+nonceSize, len(header)+nonceSize+len(plaintext)+r.aeads[id].Overhead())
	copy(out, header)
	if _, err := rand.Read(out[len(header):]); err != nil {
		return nil, fmt.Errorf("seal: nonce: %w", err)
	}
	return r.aeads[id].Seal(out, out[len(header):], plaintext, aad(header, context)), nil
}

// Open decrypts a value Seal made with any key of the keyring and the same context. Errors
// name the key id, never the content.
func (r *Keyring) Open(sealed, context []byte) ([]byte, error) {
	id, header, err := parseHeader(sealed)
	if err != nil {
		return nil, err
	}
	aead, ok := r.aeads[id]
	if !ok {
		return nil, fmt.Errorf("%w %q: the key file lists %s", ErrUnknownKey, id, strings.Join(r.ids, ", "))
	}
	rest := sealed[len(header):]
	if len(rest) < nonceSize+aead.Overhead() {
		return nil, fmt.Errorf("open value sealed with key %q: truncated", id)
	}
	out, err := aead.Open(nil, rest[:nonceSize], rest[nonceSize:], aad(header, context))
	if err != nil {
		return nil, fmt.Errorf("open value sealed with key %q: authentication failed (wrong key material, corrupted, or stored under another name)", id)
	}
	return out, nil
}

// KeyID returns the id of the key that sealed a value.
func KeyID(sealed []byte) (string, error) {
	id, _, err := parseHeader(sealed)
	return id, err
}

func parseHeader(b []byte) (id string, header []byte, err error) {
	if len(b) < 3 || b[0] != magic {
		return "", nil, ErrNotSealed
	}
	if b[1] != version {
		return "", nil, fmt.Errorf("sealed value of format version %d, this build reads %d", b[1], version)
	}
	n := int(b[2])
	if n == 0 || n > maxIDLen || len(b) < 3+n {
		return "", nil, fmt.Errorf("%w: bad key id length", ErrNotSealed)
	}
	return string(b[3 : 3+n]), b[:3+n], nil
}

func aad(header, context []byte) []byte {
	return append(append([]byte(nil), header...), context...)
}

// NewKeyLine returns a fresh key file line: an id made of today's date and random hex, and
// 32 random bytes.
func NewKeyLine(now time.Time) (id, line string, err error) {
	suffix := make([]byte, 3)
	key := make([]byte, keySize)
	if _, err := rand.Read(suffix); err != nil {
		return "", "", fmt.Errorf("generate key: %w", err)
	}
	if _, err := rand.Read(key); err != nil {
		return "", "", fmt.Errorf("generate key: %w", err)
	}
	id = now.UTC().Format("20060102") + "-" + hex.EncodeToString(suffix)
	return id, id + ":" + base64.StdEncoding.EncodeToString(key) + "\n", nil
}

// CreateKeyFile writes a key file with one fresh key, readable by its owner only. It fails if
// the file exists, so a key that sealed something is never overwritten.
func CreateKeyFile(path string, now time.Time) (id string, err error) {
	id, line, err := NewKeyLine(now)
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("create key file: %w", err)
	}
	content := "# Fleetstream credentials keys, key-id:base64 (first line seals; all open). Keep this file.\n" + line
	if _, err := f.WriteString(content); err != nil {
		_ = f.Close()
		return "", fmt.Errorf("write key file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write key file %s: %w", path, err)
	}
	return id, nil
}

// PrependNewKey makes a fresh key the active one of an existing key file, keeping every other
// line (so the old keys still open). The file is replaced atomically and keeps its mode.
func PrependNewKey(path string, now time.Time) (id string, err error) {
	old, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read key file: %w", err)
	}
	if _, err := ParseKeyring(old); err != nil {
		return "", fmt.Errorf("key file %s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	id, line, err := NewKeyLine(now)
	if err != nil {
		return "", err
	}
	// Comments at the top stay at the top; the new key goes before the first key line.
	var head, tail []string
	lines := strings.SplitAfter(string(old), "\n")
	i := 0
	for ; i < len(lines); i++ {
		if t := strings.TrimSpace(lines[i]); t != "" && !strings.HasPrefix(t, "#") {
			break
		}
		head = append(head, lines[i])
	}
	tail = lines[i:]
	content := strings.Join(head, "") + line + strings.Join(tail, "")
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return "", fmt.Errorf("rewrite key file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(st.Mode().Perm()); err == nil {
		if _, err = tmp.WriteString(content); err == nil {
			err = tmp.Sync()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("rewrite key file %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("rewrite key file %s: %w", path, err)
	}
	return id, nil
}
