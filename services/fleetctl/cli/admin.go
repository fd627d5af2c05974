package cli

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/fleetstream/fleetstream/pkg/backup"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/version"
)

// natsFlags are how an admin command reaches NATS: directly, not through the API, because a
// backup and a restore work on JetStream's streams themselves (a restore runs before any
// service does). Same names and environment as the services' flags.
type natsFlags struct {
	url, tokenFile, user string
	timeout              time.Duration
	cmd                  *cobra.Command
}

func (n *natsFlags) add(cmd *cobra.Command) {
	n.cmd = cmd
	cmd.Flags().StringVar(&n.url, "nats-url", nats.DefaultURL, "NATS server URLs, comma-separated (env FLEETSTREAM_NATS_URL)")
	cmd.Flags().StringVar(&n.tokenFile, "nats-token-file", "",
		"file holding the NATS admin token (fleetd --nats-admin-token-file), or with --nats-user the user's password (env FLEETSTREAM_NATS_TOKEN_FILE)")
	cmd.Flags().StringVar(&n.user, "nats-user", "", "NATS user to connect as; empty connects with the token (env FLEETSTREAM_NATS_USER)")
	cmd.Flags().DurationVar(&n.timeout, "nats-timeout", 30*time.Second, "bound of each JetStream request")
}

// fromEnv fills the flags not given from the environment, as the services read it. Not in the
// flags' defaults: the help shows the same defaults whatever the environment.
func (n *natsFlags) fromEnv() {
	for flag, p := range map[string]*string{"nats-url": &n.url, "nats-token-file": &n.tokenFile, "nats-user": &n.user} {
		env := "FLEETSTREAM_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
		if v := os.Getenv(env); v != "" && !n.cmd.Flags().Changed(flag) {
			*p = v
		}
	}
}

func (n *natsFlags) connect() (*nats.Conn, error) {
	n.fromEnv()
	// Replies come on the admin user's own inbox prefix, the one its NATS permissions allow
	// (deploy/nats/auth.conf); fleetd's admin token has every permission anyway.
	opts := []nats.Option{nats.Name("fleetctl-admin"), nats.Timeout(10 * time.Second),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.AdminUser))}
	if n.tokenFile != "" {
		data, err := os.ReadFile(n.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--nats-token-file: %w", err)
		}
		secret, _, _ := strings.Cut(string(data), "\n")
		if secret = strings.TrimSpace(secret); secret == "" {
			return nil, fmt.Errorf("--nats-token-file: %s is empty", n.tokenFile)
		}
		if n.user != "" {
			opts = append(opts, nats.UserInfo(n.user, secret))
		} else {
			opts = append(opts, nats.Token(secret))
		}
	} else if n.user != "" {
		return nil, fmt.Errorf("--nats-user %s: give its password with --nats-token-file", n.user)
	}
	nc, err := nats.Connect(n.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", n.url, err)
	}
	return nc, nil
}

func newAdminCommand(f *factory) *cobra.Command {
	cmd := newGroupCommand("admin", "Operate the hub's store: back it up and restore it (talks to NATS, not the API)")
	cmd.AddCommand(newAdminBackupCommand(f), newAdminRestoreCommand(f))
	return cmd
}

func newAdminBackupCommand(f *factory) *cobra.Command {
	var n natsFlags
	cmd := &cobra.Command{
		Use:   "backup DIR",
		Short: "Write a backup of every stream of the hub into a new directory",
		Long: "Snapshot every JetStream stream of the hub (event streams, KV buckets, object stores) into\n" +
			"DIR, which must not exist or be empty, with JetStream's snapshot API while the fleet keeps\n" +
			"serving, and write DIR/manifest.json last: the Fleetstream version, each stream's\n" +
			"configuration and position, and checksums of every file. The credentials key is not in\n" +
			"the backup: keep it apart. See docs/operations.md, Backup and restore.",
		Example: "  fleetctl admin backup /backups/$(date +%F) --nats-url nats://127.0.0.1:4222 --nats-token-file admin.token",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			nc, err := n.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			out := f.streams.Out
			start := time.Now()
			m, err := backup.Backup(cmd.Context(), nc, args[0], backup.Options{Version: version.Version, Timeout: n.timeout,
				Progress: func(s backup.Stream, took time.Duration) {
					fmt.Fprintf(out, "%-32s %10d messages up to %-10d %12d bytes  %s\n", s.Name, s.Msgs, s.LastSeq, size(s), took.Round(time.Millisecond))
				}})
			if err != nil {
				return err
			}
			var total int64
			for _, s := range m.Streams {
				total += size(s)
			}
			fmt.Fprintf(out, "backed up %d streams, %d bytes, in %s to %s\n", len(m.Streams), total, time.Since(start).Round(time.Millisecond), args[0])
			return nil
		},
	}
	n.add(cmd)
	return cmd
}

func size(s backup.Stream) int64 {
	var n int64
	for _, f := range s.Files {
		n += f.Size
	}
	return n
}

func newAdminRestoreCommand(f *factory) *cobra.Command {
	var (
		n    natsFlags
		opts backup.RestoreOptions
	)
	cmd := &cobra.Command{
		Use:   "restore DIR",
		Short: "Restore every stream of a backup onto an empty NATS",
		Long: "Verify the backup in DIR whole (manifest, the size and checksums of every file, every archive\n" +
			"to its end, not newer than this fleetctl), then restore its streams onto the NATS given,\n" +
			"which must hold none of them (--force replaces them). A damaged or newer backup, or an\n" +
			"occupied NATS, restores nothing. Start the services afterwards, with the credentials key\n" +
			"of the backed-up hub: views rebuild from the restored streams. For fleetd use\n" +
			"`fleetd restore --data-dir`. See docs/operations.md, Backup and restore.",
		Example: "  fleetctl admin restore /backups/2026-11-27 --nats-url nats://nats-0:4222 --nats-user fleetstream-admin --nats-token-file admin.password --replicas 3",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Replicas < 0 || opts.Replicas > 5 {
				return fmt.Errorf("--replicas %d: want 1 to 5, or 0 for the backed-up number", opts.Replicas)
			}
			nc, err := n.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			out := f.streams.Out
			start := time.Now()
			opts.Version, opts.Timeout = version.Version, n.timeout
			opts.Progress = func(s backup.Stream, took time.Duration) {
				fmt.Fprintf(out, "%-32s %10d messages up to %-10d %s\n", s.Name, s.Msgs, s.LastSeq, took.Round(time.Millisecond))
			}
			m, err := backup.Restore(cmd.Context(), nc, args[0], opts)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "restored %d streams of the backup written by Fleetstream %s at %s, in %s\n",
				len(m.Streams), m.FleetstreamVersion, m.Started.Format(time.RFC3339), time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	n.add(cmd)
	cmd.Flags().BoolVar(&opts.Force, "force", false, "replace streams the NATS already holds")
	cmd.Flags().IntVar(&opts.Replicas, "replicas", 0, "replicas of every restored stream (3 on a production cluster); 0 keeps the backed-up number")
	return cmd
}
