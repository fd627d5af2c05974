package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// The configuration file keeps named contexts (a fleet's server, credentials and CA), as a
// kubeconfig does, so a user of two fleets switches with `config use-context` or --context
// instead of exporting variables. Precedence, per setting: a flag, then the environment (as
// before contexts existed), then the context, then the default.

const envConfig = "FLEETSTREAM_CONFIG"

// fleetConfig is the configuration file.
type fleetConfig struct {
	CurrentContext string          `json:"currentContext,omitempty"`
	Contexts       []*fleetContext `json:"contexts,omitempty"`
}

// fleetContext is one fleet as fleetctl reaches it.
type fleetContext struct {
	Name   string `json:"name"`
	Server string `json:"server,omitempty"`
	// Token is a bearer token kept in the file itself; TokenFile names a kube-apiserver style
	// token file instead (better: the file can be a mounted secret).
	Token     string `json:"token,omitempty"`
	TokenFile string `json:"tokenFile,omitempty"`
	// CertificateAuthority is a PEM file of the CAs that sign the server's certificate, for a
	// server whose CA the system does not trust.
	CertificateAuthority string `json:"certificateAuthority,omitempty"`
}

// configPath is $FLEETSTREAM_CONFIG, else fleetstream/config.yaml under the user's
// configuration directory.
func configPath() (string, error) {
	if p := os.Getenv(envConfig); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("find the configuration file (set %s): %w", envConfig, err)
	}
	return filepath.Join(dir, "fleetstream", "config.yaml"), nil
}

// loadConfig reads the configuration file; a missing file is an empty configuration.
func loadConfig() (*fleetConfig, string, error) {
	path, err := configPath()
	if err != nil {
		return nil, "", err
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &fleetConfig{}, path, nil
	}
	if err != nil {
		return nil, path, fmt.Errorf("read configuration: %w", err)
	}
	var c fleetConfig
	// Strict: a misspelt key would otherwise send requests to the wrong fleet unnoticed.
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, path, fmt.Errorf("configuration %s: %w", path, err)
	}
	for i, ctx := range c.Contexts {
		if ctx == nil || ctx.Name == "" {
			return nil, path, fmt.Errorf("configuration %s: contexts[%d].name: required", path, i)
		}
		if ctx.Token != "" && ctx.TokenFile != "" {
			return nil, path, fmt.Errorf("configuration %s: contexts[%d]: token and tokenFile are mutually exclusive", path, i)
		}
	}
	return &c, path, nil
}

// save writes the configuration readable by its owner only: it may hold tokens.
func (c *fleetConfig) save(path string) error {
	data, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	// Write a sibling and rename, so a failed write never leaves half a file.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.yaml")
	if err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write configuration: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write configuration: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	return nil
}

func (c *fleetConfig) context(name string) *fleetContext {
	for _, ctx := range c.Contexts {
		if ctx.Name == name {
			return ctx
		}
	}
	return nil
}

// activeContext is the context commands use: --context, else the current one; nil when
// neither is set. A --context naming no context is an error, never a silent fallback to
// another fleet.
func (f *factory) activeContext() (*fleetContext, error) {
	f.ctxOnce.Do(func() {
		c, path, err := loadConfig()
		if err != nil {
			f.ctxErr = err
			return
		}
		name := c.CurrentContext
		if f.changed("context") {
			name = f.contextName
		}
		if name == "" {
			return
		}
		f.ctx = c.context(name)
		if f.ctx == nil {
			f.ctxErr = fmt.Errorf("context %q is not in %s; see 'fleetctl config get-contexts'", name, path)
		}
	})
	return f.ctx, f.ctxErr
}

// httpClient is the client every API call of the command uses (built once).
func (f *factory) httpClient() (*http.Client, error) {
	f.hcOnce.Do(func() { f.hc, f.hcErr = f.newHTTPClient() })
	return f.hc, f.hcErr
}

// newHTTPClient trusts the context's CA, when it names one, besides the system's; only for the
// context's own server.
func (f *factory) newHTTPClient() (*http.Client, error) {
	if !f.serverFromContext() {
		return &http.Client{}, nil
	}
	ctx, err := f.activeContext()
	if err != nil {
		return nil, err
	}
	if ctx == nil || ctx.CertificateAuthority == "" {
		return &http.Client{}, nil
	}
	pem, err := os.ReadFile(ctx.CertificateAuthority)
	if err != nil {
		return nil, fmt.Errorf("context %s: certificate authority: %w", ctx.Name, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("context %s: certificate authority %s holds no PEM certificate", ctx.Name, ctx.CertificateAuthority)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}, nil
}

func newConfigCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("config", "Manage named contexts: which fleet fleetctl talks to, and how")
	cmd.Long = "The configuration file ($" + envConfig + ", default fleetstream/config.yaml under the user's configuration directory, mode 0600) keeps named contexts: a server, a token or token file, and a CA. " +
		"Commands use the current context, or the one --context names; --server, --token and --token-file, and the " + envServer + ", " + envToken + " and " + envTokenFile + " variables, still override it."
	cmd.AddCommand(newConfigSetContextCommand(f), newConfigUseContextCommand(f), newConfigGetContextsCommand(f))
	return cmd
}

func newConfigSetContextCommand(f *factory) *cobra.Command {
	var (
		server, token, tokenFile, ca string
		use                          bool
	)
	cmd := &cobra.Command{
		Use:   "set-context NAME",
		Short: "Create or change a context",
		Long: "set-context creates context NAME or changes the settings given. A token is kept in the file itself (mode 0600); a token file is read when a command runs. " +
			"Setting one of --context-token and --context-token-file clears the other.",
		Example: "  fleetctl config set-context staging --context-server https://fleet.staging.example:8080 --context-token-file ~/.fleetstream/staging.token --use\n" +
			"  fleetctl config set-context prod --context-server https://fleet.example:8080 --certificate-authority prod-ca.pem --context-token-file /run/secrets/fleet",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, path, err := loadConfig()
			if err != nil {
				return err
			}
			ctx := c.context(args[0])
			if ctx == nil {
				ctx = &fleetContext{Name: args[0]}
				c.Contexts = append(c.Contexts, ctx)
			}
			fl := cmd.Flags()
			if fl.Changed("context-server") {
				ctx.Server = server
			}
			if fl.Changed("context-token") && fl.Changed("context-token-file") {
				return errors.New("--context-token and --context-token-file are mutually exclusive")
			}
			if fl.Changed("context-token") {
				ctx.Token, ctx.TokenFile = token, ""
			}
			if fl.Changed("context-token-file") {
				ctx.Token, ctx.TokenFile = "", tokenFile
			}
			if fl.Changed("certificate-authority") {
				ctx.CertificateAuthority = ca
			}
			if use {
				c.CurrentContext = ctx.Name
			}
			slices.SortFunc(c.Contexts, func(a, b *fleetContext) int { return strings.Compare(a.Name, b.Name) })
			if err := c.save(path); err != nil {
				return err
			}
			fmt.Fprintf(f.streams.Out, "context %s set\n", ctx.Name)
			return nil
		},
	}
	// Not --server and --token: those are the global flags, which say how this invocation
	// connects, not what to store.
	cmd.Flags().StringVar(&server, "context-server", "", "URL of the fleet's API")
	cmd.Flags().StringVar(&token, "context-token", "", "bearer token, kept in the configuration file")
	cmd.Flags().StringVar(&tokenFile, "context-token-file", "", "token file, read when a command runs (kube-apiserver --token-auth-file format)")
	cmd.Flags().StringVar(&ca, "certificate-authority", "", "PEM file of the CAs that sign the server's certificate")
	cmd.Flags().BoolVar(&use, "use", false, "also make it the current context")
	return cmd
}

func newConfigUseContextCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:   "use-context NAME",
		Short: "Make a context the current one",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, path, err := loadConfig()
			if err != nil {
				return err
			}
			if c.context(args[0]) == nil {
				return fmt.Errorf("context %q is not in %s; create it with 'fleetctl config set-context'", args[0], path)
			}
			c.CurrentContext = args[0]
			if err := c.save(path); err != nil {
				return err
			}
			fmt.Fprintf(f.streams.Out, "switched to context %s\n", args[0])
			return nil
		},
	}
}

func newConfigGetContextsCommand(f *factory) *cobra.Command {
	return &cobra.Command{
		Use:   "get-contexts",
		Short: "List the contexts (never their tokens)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := loadConfig()
			if err != nil {
				return err
			}
			current := c.CurrentContext
			if f.changed("context") {
				current = f.contextName
			}
			tw := tabwriter.NewWriter(f.streams.Out, 0, 4, 3, ' ', 0)
			fmt.Fprintln(tw, "CURRENT\tNAME\tSERVER\tAUTH\tCA")
			for _, ctx := range c.Contexts {
				mark, auth, ca := "", "none", ctx.CertificateAuthority
				if ctx.Name == current {
					mark = "*"
				}
				switch {
				case ctx.Token != "":
					auth = "token"
				case ctx.TokenFile != "":
					auth = "token-file " + ctx.TokenFile
				}
				if ca == "" {
					ca = "<system>"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", mark, ctx.Name, ctx.Server, auth, ca)
			}
			return tw.Flush()
		},
	}
}
