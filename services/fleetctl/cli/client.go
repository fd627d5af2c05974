package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
)

// Environment variables that supply a global flag's value when the flag is not given.
const (
	envServer    = "FLEETSTREAM_SERVER"
	envToken     = "FLEETSTREAM_TOKEN"
	envTokenFile = "FLEETSTREAM_TOKEN_FILE"

	defaultServer = "http://127.0.0.1:8080"
)

// factory holds the global flags and builds what every command needs from them: API clients,
// the printer, and request contexts. Command groups receive it from NewRootCommand.
type factory struct {
	streams IOStreams
	// root is the command the global flags live on; it tells whether a flag was given.
	root *cobra.Command

	server    string
	token     string
	tokenFile string
	output    string
	timeout   time.Duration
	// contextName is --context; the context itself is read once, when a command first
	// needs it (activeContext), and the HTTP client built once (httpClient), so that the
	// many concurrent calls of an apply share its connections.
	contextName string
	ctxOnce     sync.Once
	ctx         *fleetContext
	ctxErr      error
	hcOnce      sync.Once
	hc          *http.Client
	hcErr       error
}

func (f *factory) addFlags(root *cobra.Command) {
	f.root = root
	fl := root.PersistentFlags()
	// Environment values are resolved when a command runs, not used as flag defaults, so that
	// --help never echoes a token taken from the environment.
	fl.StringVar(&f.server, "server", defaultServer, "URL of the Fleetstream API (env "+envServer+")")
	fl.StringVar(&f.token, "token", "", "bearer token for the API (env "+envToken+")")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the bearer token as the first field of its first token,user line, the format of kube-apiserver's --token-auth-file (env "+envTokenFile+")")
	fl.StringVarP(&f.output, "output", "o", formatTable, "output format: json, yaml or table")
	fl.StringVar(&f.contextName, "context", "", "context of the configuration file to use instead of the current one (env "+envConfig+" names the file)")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "time limit of each request; for watch, of the whole watch and only when given (0 means none)")
}

// validate checks the global flags before any command runs, so a typo in -o fails before a
// mutating request is sent rather than after.
func (f *factory) validate() error {
	switch f.output {
	case formatJSON, formatYAML, formatTable:
	default:
		return fmt.Errorf("--output %q: want json, yaml or table", f.output)
	}
	if f.timeout < 0 {
		return fmt.Errorf("--timeout %s: must not be negative", f.timeout)
	}
	// A --context that names no context is a mistake even when flags or the environment
	// say everything it would have.
	if f.changed("context") {
		if _, err := f.activeContext(); err != nil {
			return err
		}
	}
	return nil
}

// changed reports whether global flag name was given on the command line.
func (f *factory) changed(name string) bool {
	return f.root.PersistentFlags().Changed(name)
}

// serverFromContext reports whether the server comes from the context: neither --server nor
// the environment names one.
func (f *factory) serverFromContext() bool {
	return !f.changed("server") && os.Getenv(envServer) == ""
}

// serverURL is the API base URL from --server, else the environment, else the context, else
// the default.
func (f *factory) serverURL() (string, error) {
	raw := f.server
	if v, ok := os.LookupEnv(envServer); ok && v != "" && !f.changed("server") {
		raw = v
	}
	if f.serverFromContext() {
		ctx, err := f.activeContext()
		if err != nil {
			return "", err
		}
		if ctx != nil && ctx.Server != "" {
			raw = ctx.Server
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("--server %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--server %q: want an http:// or https:// URL", raw)
	}
	return strings.TrimSuffix(raw, "/"), nil
}

// bearerToken resolves the API token. Flags beat the environment, and within each a literal
// token beats a token file. An empty result means calls go out unauthenticated, which a server
// run with --insecure-dev accepts.
func (f *factory) bearerToken() (string, error) {
	if f.changed("token") && f.changed("token-file") {
		return "", errors.New("--token and --token-file are mutually exclusive")
	}
	switch {
	case f.changed("token"):
		return f.token, nil
	case f.changed("token-file"):
		return readTokenFile(f.tokenFile)
	}
	if v := os.Getenv(envToken); v != "" {
		return v, nil
	}
	if p := os.Getenv(envTokenFile); p != "" {
		return readTokenFile(p)
	}
	// A context's credentials go only to the context's server: with the server named by a
	// flag or the environment they would reach a fleet the context does not describe.
	if f.serverFromContext() {
		ctx, err := f.activeContext()
		if err != nil {
			return "", err
		}
		if ctx != nil && ctx.Server == "" && (ctx.Token != "" || ctx.TokenFile != "") {
			// Its server would be the default one, which the context does not name.
			return "", fmt.Errorf("context %q has credentials but no server, and they go to no other: set one (fleetctl config set-context %s --context-server URL)", ctx.Name, ctx.Name)
		}
		if ctx != nil && ctx.Token != "" {
			return ctx.Token, nil
		}
		if ctx != nil && ctx.TokenFile != "" {
			return readTokenFile(ctx.TokenFile)
		}
	}
	return "", nil
}

// readTokenFile returns the token of the first entry in a kube-apiserver style token file.
func readTokenFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	token, err := parseTokenFile(data)
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	return token, nil
}

// parseTokenFile returns the first comma-separated field of the first line that is neither
// blank nor a # comment. Error messages never quote the line: it holds a secret.
func parseTokenFile(data []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		token, _, _ := strings.Cut(line, ",")
		token = strings.TrimSpace(token)
		if token == "" {
			return "", fmt.Errorf("line %d: empty token, want token[,user,...]", n)
		}
		return token, nil
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no token in file")
}

// newClient builds a Connect client of any Fleetstream service from its generated constructor,
// e.g. newClient(f, clusterv1connect.NewClusterServiceClient), so a new command group needs no
// change here.
func newClient[C any](f *factory, ctor func(connect.HTTPClient, string, ...connect.ClientOption) C) (C, error) {
	var zero C
	base, err := f.serverURL()
	if err != nil {
		return zero, err
	}
	token, err := f.bearerToken()
	if err != nil {
		return zero, err
	}
	var opts []connect.ClientOption
	if token != "" {
		opts = append(opts, connect.WithInterceptors(bearerAuth{token: token}))
	}
	// No http.Client timeout: it would cut watches short. Requests are bounded through their
	// context instead (see requestContext).
	hc, err := f.httpClient()
	if err != nil {
		return zero, err
	}
	return ctor(hc, base, opts...), nil
}

// requestContext bounds a unary call by --timeout.
func (f *factory) requestContext(parent context.Context) (context.Context, context.CancelFunc) {
	if f.timeout == 0 {
		return context.WithCancel(parent)
	}
	return context.WithTimeout(parent, f.timeout)
}

// watchContext bounds a watch by --timeout only when the flag was given: the default exists to
// catch hung unary calls, while a watch is meant to run until interrupted.
func (f *factory) watchContext(parent context.Context) (context.Context, context.CancelFunc) {
	if !f.changed("timeout") || f.timeout == 0 {
		return context.WithCancel(parent)
	}
	return context.WithTimeout(parent, f.timeout)
}

// printer returns a printer for the --output format.
func (f *factory) printer() *Printer {
	return &Printer{Format: f.output, Out: f.streams.Out, ErrOut: f.streams.ErrOut}
}

// bearerAuth adds "Authorization: Bearer <token>" to every outgoing request.
type bearerAuth struct{ token string }

func (b bearerAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			req.Header().Set("Authorization", "Bearer "+b.token)
		}
		return next(ctx, req)
	}
}

func (b bearerAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+b.token)
		return conn
	}
}

func (b bearerAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
