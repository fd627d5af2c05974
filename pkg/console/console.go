// Package console serves the web console at /ui/: static ES modules and CSS embedded in the
// binary, mounted by fleetd and the gateway alike. The page calls the same Connect APIs as
// fleetctl (JSON over POST, the user's own bearer token), so it can show and do exactly what
// that token may; this handler itself holds no data and needs no authentication.
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

// Prefix is where the console is served.
const Prefix = "/ui/"

// ContentSecurityPolicy allows only this origin's scripts, styles and API calls: no inline
// script or style (every user-controlled string is also rendered as text, this is the second
// wall), no plugins, no framing (clickjacking), no <base> tricks, forms post nowhere.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Mux is what the console mounts on (pkg/server.Server, http.ServeMux).
type Mux interface {
	Handle(pattern string, h http.Handler)
}

// Mount serves the console at /ui/ (and redirects /ui there).
func Mount(m Mux) {
	h := Handler()
	m.Handle("GET /ui/", h)
	m.Handle("GET /ui", http.RedirectHandler(Prefix, http.StatusMovedPermanently))
}

type file struct {
	body        []byte
	contentType string
	etag        string
}

// Handler serves the embedded assets under /ui/. Paths without an asset (a reload of
// /ui/projects, say) get index.html: the page routes by its own location hash, but a wrong
// path still lands on something that works.
func Handler() http.Handler {
	files := map[string]file{}
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		files[strings.TrimPrefix(p, "assets/")] = file{body: body, contentType: contentType(p), etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		// The assets are compiled in: failing to read them is a build defect.
		panic(fmt.Sprintf("console: reading embedded assets: %v", err))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(path.Clean("/"+strings.TrimPrefix(r.URL.Path, Prefix)), "/")
		f, ok := files[name]
		if !ok {
			f = files["index.html"]
		}
		h := w.Header()
		SecurityHeaders(h)
		h.Set("Content-Type", f.contentType)
		// Assets change only with the binary: revalidate every load, cheaply by ETag.
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", f.etag)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
	})
}

// SecurityHeaders sets the headers every console response carries.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// contentType is set by extension, never sniffed: nosniff makes browsers refuse a module
// script served as anything but JavaScript.
func contentType(p string) string {
	switch path.Ext(p) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}

// Assets returns every embedded asset by path under /ui/, for size checks.
func Assets() map[string][]byte {
	out := map[string][]byte{}
	_ = fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := assets.ReadFile(p)
			out[strings.TrimPrefix(p, "assets/")] = b
		}
		return nil
	})
	return out
}
