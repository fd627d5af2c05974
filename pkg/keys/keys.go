// Package keys encodes arbitrary Kubernetes names into single NATS subject / KV key tokens and
// back. Names may hold '.', ':' and other characters that subjects and keys reserve or forbid;
// every service uses this one reversible encoding so keys written by one are readable by all.
package keys

import (
	"fmt"
	"strings"
)

// escape is not a character Kubernetes allows in any name, so it never needs escaping in
// practice, but it is escaped anyway so that every string round-trips.
const escape = '='

func safe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// Encode returns s as one token made only of [A-Za-z0-9_=-]: other bytes become '=' followed by
// two upper-case hex digits. The empty string encodes to "=" so that a token is never empty.
func Encode(s string) string {
	if s == "" {
		return string(escape)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if !safe(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if safe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte(escape)
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xF])
	}
	return b.String()
}

// Decode reverses Encode.
func Decode(tok string) (string, error) {
	if tok == string(escape) {
		return "", nil
	}
	if strings.IndexByte(tok, escape) < 0 {
		for i := 0; i < len(tok); i++ {
			if !safe(tok[i]) {
				return "", fmt.Errorf("decode key token %q: invalid byte %q at %d", tok, tok[i], i)
			}
		}
		return tok, nil
	}
	var b strings.Builder
	b.Grow(len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c != escape {
			if !safe(c) {
				return "", fmt.Errorf("decode key token %q: invalid byte %q at %d", tok, c, i)
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(tok) {
			return "", fmt.Errorf("decode key token %q: truncated escape at %d", tok, i)
		}
		hi, ok1 := unhex(tok[i+1])
		lo, ok2 := unhex(tok[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("decode key token %q: bad escape at %d", tok, i)
		}
		b.WriteByte(hi<<4 | lo)
		i += 2
	}
	return b.String(), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Join encodes each part and joins them with '.', giving a multi-token key or subject suffix.
func Join(parts ...string) string {
	enc := make([]string, len(parts))
	for i, p := range parts {
		enc[i] = Encode(p)
	}
	return strings.Join(enc, ".")
}

// Split reverses Join.
func Split(key string) ([]string, error) {
	toks := strings.Split(key, ".")
	for i, t := range toks {
		d, err := Decode(t)
		if err != nil {
			return nil, err
		}
		toks[i] = d
	}
	return toks, nil
}
