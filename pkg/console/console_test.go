package console_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/console"
)

func TestServesAssetsWithStrictHeaders(t *testing.T) {
	mux := http.NewServeMux()
	console.Mount(mux, console.Options{})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, tc := range []struct {
		path, contentType, contains string
	}{
		{"/ui/", "text/html; charset=utf-8", `<script type="module" src="/ui/app.js">`},
		{"/ui/api.js", "text/javascript; charset=utf-8", "sessionStorage"},
		{"/ui/style.css", "text/css; charset=utf-8", ":focus-visible"},
		// A reload of a path the page made up still gets the page.
		{"/ui/projects/x", "text/html; charset=utf-8", "<title>"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			res, err := http.Get(srv.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var b bytes.Buffer
			if _, err := b.ReadFrom(res.Body); err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusOK {
				t.Fatalf("HTTP %d", res.StatusCode)
			}
			for k, want := range map[string]string{
				"Content-Type":            tc.contentType,
				"Content-Security-Policy": console.ContentSecurityPolicy,
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
			} {
				if got := res.Header.Get(k); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
			if !strings.Contains(b.String(), tc.contains) {
				t.Errorf("body lacks %q", tc.contains)
			}
			// A second load with the ETag costs no body.
			req, _ := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
			req.Header.Set("If-None-Match", res.Header.Get("ETag"))
			res2, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res2.Body.Close()
			if res2.StatusCode != http.StatusNotModified {
				t.Errorf("revalidation: HTTP %d, want 304", res2.StatusCode)
			}
		})
	}
	res, err := http.Post(srv.URL+"/ui/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: HTTP %d, want 405", res.StatusCode)
	}
}

// The CSP already refuses inline script and style; the assets must not need them, and no
// script may parse markup (every string is rendered as text).
func TestAssetsNeedNoInlineCodeAndParseNoMarkup(t *testing.T) {
	forbidden := map[string]*regexp.Regexp{
		"inline script":      regexp.MustCompile(`<script(?:\s+type="module")?>`),
		"inline style":       regexp.MustCompile(`<style|\sstyle="`),
		"inline handler":     regexp.MustCompile(`\son[a-z]+="`),
		"markup parsing":     regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|DOMParser|createContextualFragment`),
		"eval":               regexp.MustCompile(`\beval\(|new Function\(`),
		"persistent storage": regexp.MustCompile(`localStorage|document\.cookie`),
		"external resource":  regexp.MustCompile(`https?://`),
	}
	for name, body := range console.Assets() {
		for what, re := range forbidden {
			if m := re.FindString(string(body)); m != "" {
				t.Errorf("%s: %s (%q)", name, what, m)
			}
		}
	}
}
