package flagcheck

import (
	"strings"
	"testing"
	"time"
)

func TestChecks(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string // in the error; "" for none
	}{
		{"zero duration", NotNegative("grace", time.Duration(0)), ""},
		{"negative duration", NotNegative("grace", -90*time.Second), "--grace -1m30s: must not be negative"},
		{"negative int", NotNegative("workers", -1), "--workers -1: must not be negative"},
		{"negative int64", NotNegative("bytes", int64(-5)), "--bytes -5"},
		{"host:port", HostPort("listen", "127.0.0.1:8080", true), ""},
		{"any interface", HostPort("listen", ":8080", true), ""},
		{"ipv6", HostPort("listen", "[::1]:0", true), ""},
		{"empty optional", HostPort("xds-listen", "", false), ""},
		{"empty required", HostPort("listen", "", true), "--listen is required"},
		{"no port", HostPort("listen", "localhost", true), `--listen "localhost": want host:port`},
		{"named port", HostPort("listen", "localhost:http", true), `port "http" is not a number`},
		{"port too big", HostPort("listen", "localhost:65536", true), `port "65536" is not a number from 0 to 65535`},
		{"nats URLs", NATSURLs("nats-url", "nats://a:4222, tls://b:4222,c:4222"), ""},
		{"nats with user", NATSURLs("nats-url", "nats://u:p@a:4222"), ""},
		{"websocket", NATSURLs("nats-url", "wss://a"), ""},
		{"empty nats", NATSURLs("nats-url", " "), "--nats-url is required"},
		{"http scheme", NATSURLs("nats-url", "nats://a:4222,http://b"), `--nats-url "http://b": scheme "http"`},
		{"no host", NATSURLs("nats-url", "nats://:4222"), `--nats-url "nats://:4222": no host`},
		{"malformed", NATSURLs("nats-url", "nats://a:4222%"), `--nats-url: a URL that does not parse: invalid port ":4222%"`},
		{"password masked", NATSURLs("nats-url", "http://agent:S3cret@hub:4222"), `--nats-url "http://agent:xxxxx@hub:4222": scheme "http"`},
		{"user without password", NATSURLs("nats-url", "nats://agent@:4222"), `--nats-url "nats://agent@:4222": no host`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			switch {
			case tc.want == "" && tc.err != nil:
				t.Fatalf("error %v", tc.err)
			case tc.want != "" && (tc.err == nil || !strings.Contains(tc.err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", tc.err, tc.want)
			}
		})
	}
}
