package sealed_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/sealed"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func line(id string, b byte) string {
	return id + ":" + base64.StdEncoding.EncodeToString(key(b)) + "\n"
}

func ring(t *testing.T, content string) *sealed.Keyring {
	t.Helper()
	r, err := sealed.ParseKeyring([]byte(content))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSealOpenRoundTripAndKeyID(t *testing.T) {
	r := ring(t, "# comment\n\n"+line("k1", 1)+line("k0", 0))
	if r.ActiveID() != "k1" || strings.Join(r.IDs(), ",") != "k1,k0" {
		t.Fatalf("ids %v", r.IDs())
	}
	secret := []byte("the-plaintext-secret")
	a, err := r.Seal(secret, []byte("cluster-a"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := r.Seal(secret, []byte("cluster-a"))
	if bytes.Equal(a, b) {
		t.Fatal("two seals of one value are equal: nonce reused")
	}
	if bytes.Contains(a, secret) {
		t.Fatal("plaintext in the sealed value")
	}
	if id, err := sealed.KeyID(a); err != nil || id != "k1" {
		t.Fatalf("key id %q %v", id, err)
	}
	got, err := r.Open(a, []byte("cluster-a"))
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("open: %q %v", got, err)
	}
	// A keyring whose active key is another one still opens values of a listed older key.
	r2 := ring(t, line("k2", 2)+line("k1", 1))
	if got, err := r2.Open(a, []byte("cluster-a")); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("open with rotated ring: %q %v", got, err)
	}
	if _, err := sealed.KeyID([]byte("\x0a\x03abc")); !errors.Is(err, sealed.ErrNotSealed) {
		t.Fatalf("protobuf bytes taken for a sealed value: %v", err)
	}
}

func TestOpenFailures(t *testing.T) {
	r := ring(t, line("k1", 1))
	secret := []byte("the-plaintext-secret")
	good, err := r.Seal(secret, []byte("cluster-a"))
	if err != nil {
		t.Fatal(err)
	}
	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x01
		return b
	}
	cases := []struct {
		name    string
		ring    *sealed.Keyring
		value   []byte
		context string
		want    []string
	}{
		{"flipped ciphertext byte", r, flip(len(good) - 20), "cluster-a", []string{`"k1"`, "authentication failed"}},
		{"flipped tag byte", r, flip(len(good) - 1), "cluster-a", []string{`"k1"`, "authentication failed"}},
		{"flipped nonce byte", r, flip(3 + 2 + 1), "cluster-a", []string{`"k1"`, "authentication failed"}},
		{"swapped cluster", r, good, "cluster-b", []string{`"k1"`, "authentication failed"}},
		{"same id, other key material", ring(t, line("k1", 9)), good, "cluster-a", []string{`"k1"`, "authentication failed"}},
		{"unknown key id", ring(t, line("k2", 2)), good, "cluster-a", []string{`unknown key id "k1"`, "k2"}},
		{"truncated", r, good[:10], "cluster-a", []string{"truncated"}},
		{"not sealed", r, []byte("plain"), "cluster-a", []string{"not a sealed value"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.ring.Open(tc.value, []byte(tc.context))
			if err == nil {
				t.Fatalf("opened: %q", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), string(secret)) {
				t.Errorf("error reveals the value: %v", err)
			}
		})
	}
	// A key id rewritten in the header to another listed key fails too: the header is
	// authenticated and the key differs.
	two := ring(t, line("k1", 1)+line("k9", 9))
	b := bytes.Clone(good)
	b[4] = '9'
	if _, err := two.Open(b, []byte("cluster-a")); err == nil || !strings.Contains(err.Error(), `"k9"`) {
		t.Fatalf("swapped key id: %v", err)
	}
}

func TestParseKeyringErrorsNeverShowKeyMaterial(t *testing.T) {
	material := base64.StdEncoding.EncodeToString(key(7))
	cases := []struct {
		name, content, want string
	}{
		{"empty", "# only a comment\n", "no keys"},
		{"no colon", material + "\n", "line 1: want key-id:base64-key"},
		{"bad id", "bad id:" + material + "\n", "line 1: key id"},
		{"short key", "k1:" + base64.StdEncoding.EncodeToString(key(7)[:31]) + "\n", `key "k1" is 31 bytes, want 32`},
		{"not base64", "k1:" + material[:10] + "!!" + material[12:] + "\n", `line 1: key "k1" is not valid base64`},
		{"duplicate id", line("k1", 1) + "k1:" + material + "\n", `key id "k1" listed twice`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sealed.ParseKeyring([]byte(tc.content))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), material[:12]) {
				t.Fatalf("error shows key material: %v", err)
			}
		})
	}
	// Unpadded base64 is accepted too.
	ring(t, "k1:"+strings.TrimRight(material, "=")+"\n")
}

func TestKeyFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credentials.key")
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	first, err := sealed.CreateKeyFile(path, now)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first, "20260102-") {
		t.Fatalf("id %q", first)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	if _, err := sealed.CreateKeyFile(path, now); err == nil {
		t.Fatal("existing key file overwritten")
	}
	r1, err := sealed.LoadKeyring(path)
	if err != nil || r1.ActiveID() != first {
		t.Fatalf("load: %v %v", r1, err)
	}
	v, _ := r1.Seal([]byte("x"), nil)
	second, err := sealed.PrependNewKey(path, now)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := sealed.LoadKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	if r2.ActiveID() != second || second == first || !r2.Has(first) {
		t.Fatalf("after prepend: %v", r2.IDs())
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode after prepend %v", st.Mode())
	}
	if got, err := r2.Open(v, nil); err != nil || string(got) != "x" {
		t.Fatalf("old value after prepend: %v", err)
	}
	data, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(data), "#") {
		t.Fatalf("comment no longer first:\n%s", data)
	}
}
