package importpolicy

import (
	"encoding/base64"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// redactor removes secret values from text shown to people: error messages, conditions and
// the preview. Template errors can quote the data they failed on ({{ fail .x }}, a date that
// does not parse, ...), so every message is scrubbed, not just the fields known to be secret.
type redactor struct {
	secrets []string
	sorted  bool
}

// Shorter values are not redacted: "true" or "1" would blank every message, and so short a
// value is no secret worth the name.
const (
	minSecret = 8
	// window is the length of a piece of a secret that is redacted wherever it appears, so a
	// message quoting a secret cut short (or a line of a decoded kubeconfig) loses it too.
	window = 16
)

const redacted = "[redacted]"

func (r *redactor) add(s string) {
	if len(s) < minSecret {
		return
	}
	r.secrets = append(r.secrets, s)
	// Messages may quote with Go escaping (strconv.Quote): "\n" instead of a newline.
	if q := strconv.Quote(s); q[1:len(q)-1] != s {
		r.secrets = append(r.secrets, q[1:len(q)-1])
	}
	r.sorted = false
}

// addBytes adds b as it is and as the base64 a document or a Secret's data would hold.
func (r *redactor) addBytes(b []byte) {
	if len(b) == 0 {
		return
	}
	r.add(string(b))
	r.add(base64.StdEncoding.EncodeToString(b))
}

// addSecretObject adds the values of a Secret's data (base64 and decoded) and stringData.
func (r *redactor) addSecretObject(obj map[string]any) {
	for _, field := range []string{"data", "stringData"} {
		m, _ := obj[field].(map[string]any)
		for _, v := range m {
			s, ok := v.(string)
			if !ok {
				continue
			}
			r.add(s)
			if field == "data" {
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					r.add(string(b))
				}
			}
		}
	}
}

// addCredentials adds the credentials proper that a Secret holds: values under credential-like
// keys (token, password, key, cert, ...), looked for in the Secret's own data and inside values
// that are YAML or JSON documents (a kubeconfig's users, an Argo CD cluster config). Values
// under other keys (a server URL, a cluster name) are not credentials and may be shown.
func (r *redactor) addCredentials(obj map[string]any) {
	for _, field := range []string{"data", "stringData"} {
		m, _ := obj[field].(map[string]any)
		for k, v := range m {
			s, ok := v.(string)
			if !ok {
				continue
			}
			if field == "data" {
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					continue
				}
				if credentialKey(k) {
					r.add(s)
				}
				s = string(b)
			}
			if credentialKey(k) {
				r.add(s)
			}
			if len(s) <= maxParsedSecret {
				var doc any
				if yaml.Unmarshal([]byte(s), &doc) == nil {
					r.addCredentialLeaves(doc, 0)
				}
			}
		}
	}
}

// maxParsedSecret bounds the Secret values parsed for nested credentials.
const maxParsedSecret = 64 << 10

func (r *redactor) addCredentialLeaves(v any, depth int) {
	if depth > maxDepth {
		return
	}
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && credentialKey(k) {
				r.add(s)
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					r.add(string(b))
				}
				continue
			}
			r.addCredentialLeaves(e, depth+1)
		}
	case []any:
		for _, e := range v {
			r.addCredentialLeaves(e, depth+1)
		}
	}
}

// credentialKey reports whether a key names a credential, by the words such keys use.
func credentialKey(k string) bool {
	k = strings.ToLower(k)
	for _, w := range []string{"token", "password", "passwd", "secret", "key", "cert", "crt", "credential"} {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// contains reports whether s holds a secret or a window of one.
func (r *redactor) contains(s string) bool { return r.redact(s) != s }

// redact replaces every secret, and every window-long piece of one, in s.
func (r *redactor) redact(s string) string {
	if len(r.secrets) == 0 || s == "" {
		return s
	}
	if !r.sorted {
		// Longest first, so a secret containing another is replaced whole.
		sort.Slice(r.secrets, func(i, j int) bool { return len(r.secrets[i]) > len(r.secrets[j]) })
		r.sorted = true
	}
	for _, sec := range r.secrets {
		s = strings.ReplaceAll(s, sec, redacted)
	}
	if len(s) < window {
		return s
	}
	marked := make([]bool, len(s))
	any := false
	for i := 0; i+window <= len(s); i++ {
		piece := s[i : i+window]
		if strings.Contains(piece, redacted) {
			continue
		}
		for _, sec := range r.secrets {
			if len(sec) >= window && strings.Contains(sec, piece) {
				for j := i; j < i+window; j++ {
					marked[j] = true
				}
				any = true
				break
			}
		}
	}
	if !any {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		if !marked[i] {
			b.WriteByte(s[i])
			i++
			continue
		}
		b.WriteString(redacted)
		for i < len(s) && (marked[i] || !utf8.RuneStart(s[i])) {
			i++
		}
	}
	return b.String()
}

// maxShown is how much of a value an error message quotes.
const maxShown = 64

// short quotes s for a message, cut when long: errors say what was wrong without echoing a
// large input back.
func short(s string) string {
	if len(s) <= maxShown {
		return strconv.Quote(s)
	}
	cut := maxShown
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
