// Package cli implements the fleetctl commands. Every command group lives in one file and builds
// on three shared pieces: the client factory (client.go), which turns the global flags into
// authenticated Connect clients; call and watch (call.go), the skeleton of a command that sends
// a request or watches a stream; and the printer (printer.go), which renders API messages as
// JSON, YAML or tables. A new command is tested in commands_test.go: a golden case of its
// flags and output, and a commandSpec for its error paths.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
)

// IOStreams are where a command reads and writes, so tests can run commands in-process and
// capture what they print.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// StdStreams returns the process's standard streams.
func StdStreams() IOStreams {
	return IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
}

// NewRootCommand builds the fleetctl command tree writing to streams.
func NewRootCommand(streams IOStreams) *cobra.Command {
	f := &factory{streams: streams}
	root := &cobra.Command{
		Use:   "fleetctl",
		Short: "Manage a Fleetstream multi-cluster control plane",
		// Run prints errors itself in one consistent format; cobra's own printing would
		// duplicate them and bury them under the usage text.
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return f.validate()
		},
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	f.addFlags(root)

	root.AddCommand(newClusterCommand(f))
	root.AddCommand(newImportCommand(f))
	root.AddCommand(newProjectCommand(f))
	root.AddCommand(newClusterSetCommand(f))
	root.AddCommand(newPlacementCommand(f))
	root.AddCommand(newAddOnScoreCommand(f))
	root.AddCommand(newNamespaceCommand(f))
	root.AddCommand(newRoleCommand(f))
	root.AddCommand(newMemberCommand(f))
	root.AddCommand(newAccessCommand(f))
	root.AddCommand(newAuditCommand(f))
	root.AddCommand(newEndpointsCommand(f))
	root.AddCommand(newEventsCommand(f))
	root.AddCommand(newApplyCommand(f))
	root.AddCommand(newDiffCommand(f))
	root.AddCommand(newExportCommand(f))
	root.AddCommand(newConfigCommand(f))
	root.AddCommand(newSchemaCommand(f))
	root.AddCommand(newAdminCommand(f))
	return root
}

// newGroupCommand builds a command that only holds subcommands (cluster, project, ...).
// Without a RunE cobra would print the help and exit 0 for a mistyped subcommand, hiding the
// typo from scripts.
func newGroupCommand(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unknown command %q for %q; see '%s --help'", args[0], cmd.CommandPath(), cmd.CommandPath())
			}
			return cmd.Help()
		},
	}
}

// Run executes fleetctl with args and returns the process exit code. Errors are printed to
// streams.ErrOut as a single line.
func Run(ctx context.Context, streams IOStreams, args []string) int {
	root := NewRootCommand(streams)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		var exit *exitError
		if errors.As(err, &exit) {
			if exit.err != nil {
				PrintError(streams.ErrOut, exit.err)
			}
			return exit.code
		}
		PrintError(streams.ErrOut, err)
		return 1
	}
	return 0
}

// PrintError writes err as "error: <code>: <message>" for API errors and "error: <message>"
// otherwise. The API message is printed as the server sent it, without the local context the
// error was wrapped in: InvalidArgument and Unauthenticated messages name the offending field
// or credential, and rewording them would hide that.
func PrintError(w io.Writer, err error) {
	var ce *connect.Error
	if errors.As(err, &ce) {
		fmt.Fprintf(w, "error: %s: %s\n", ce.Code(), ce.Message())
		return
	}
	fmt.Fprintf(w, "error: %s\n", err)
}
