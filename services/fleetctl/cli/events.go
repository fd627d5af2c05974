package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/events"
	"github.com/fleetstream/fleetstream/pkg/subscribe"
)

func newEventsCommand(f *factory) *cobra.Command {
	cmd := &cobra.Command{Use: "events", Short: "Read Fleetstream's events as a downstream subscriber"}
	cmd.AddCommand(newEventsTailCommand(f))
	return cmd
}

func newEventsTailCommand(f *factory) *cobra.Command {
	var (
		natsURL, name, tokenFile string
		streams, types           []string
		since                    time.Duration
		fromSeq                  uint64
	)
	cmd := &cobra.Command{
		Use:   "tail --subscriber NAME --subscriber-token-file FILE --stream STREAM...",
		Short: "Print events as they are appended, through the subscriber's durable consumer",
		Long: "Print events as a subscriber made with SubscriberService.CreateSubscriber reads them: one\n" +
			"line per event (or the whole envelope with -o json), until interrupted. The subscriber's\n" +
			"consumer remembers what was printed: a second tail resumes after it. --since and --from-seq\n" +
			"apply when the consumer is first created. See docs/events.md for the types.",
		Example: "  fleetctl events tail --nats-url nats://127.0.0.1:4222 --subscriber audit \\\n" +
			"    --subscriber-token-file audit.token --stream FLEET_RBAC --type fleetstream.rbac.v1.ProjectRoleBound --since 1h",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" || tokenFile == "" || len(streams) == 0 {
				return errors.New("give --subscriber, --subscriber-token-file and at least one --stream")
			}
			data, err := readFileOrStdin(tokenFile, f.streams.In)
			if err != nil {
				return fmt.Errorf("read %s: %w", tokenFile, err)
			}
			cfg := subscribe.Config{URL: natsURL, Name: name, Token: strings.TrimSpace(string(data)), Streams: streams, Types: types, FromSequence: fromSeq}
			if since > 0 {
				cfg.Since = time.Now().Add(-since)
			}
			p := f.printer()
			var mu sync.Mutex // the streams' consumers hand over concurrently
			return subscribe.Run(cmd.Context(), cfg, func(_ context.Context, ev *events.Event) error {
				mu.Lock()
				defer mu.Unlock()
				if p.Format == formatTable {
					_, err := fmt.Fprintf(p.Out, "%s  %-7d %-45s %-30s %s\n", ev.GetTime().AsTime().UTC().Format(time.RFC3339), ev.Sequence, ev.Type, ev.AggregateId, ev.Actor)
					return err
				}
				return p.Print(ev.Envelope)
			}, zap.NewNop())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URLs, comma-separated")
	fl.StringVar(&name, "subscriber", "", "the subscriber's name")
	fl.StringVar(&tokenFile, "subscriber-token-file", "", "file holding the subscriber's NATS token (- for stdin)")
	fl.StringSliceVar(&streams, "stream", nil, "event streams to read, e.g. FLEET_RBAC (repeatable)")
	fl.StringSliceVar(&types, "type", nil, "only these event types (full protobuf names; repeatable)")
	fl.DurationVar(&since, "since", 0, "a new consumer starts this long ago")
	fl.Uint64Var(&fromSeq, "from-seq", 0, "a new consumer starts at this stream sequence")
	return cmd
}
