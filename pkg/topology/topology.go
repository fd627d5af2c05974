// Package topology declares JetStream streams and KV buckets in code and creates or updates them
// idempotently when a service starts.
package topology

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Topology is what one service needs to exist before it runs.
type Topology struct {
	Streams []jetstream.StreamConfig
	Buckets []jetstream.KeyValueConfig
}

// Merge concatenates topologies (fleetd ensures every service's at once).
func Merge(ts ...Topology) Topology {
	var out Topology
	for _, t := range ts {
		out.Streams = append(out.Streams, t.Streams...)
		out.Buckets = append(out.Buckets, t.Buckets...)
	}
	return out
}

// Ensure creates or updates every stream and bucket of t with the given number of replicas
// (1 for a single node, 3 for a production cluster).
func Ensure(ctx context.Context, js jetstream.JetStream, replicas int, t Topology) error {
	for _, sc := range t.Streams {
		sc.Replicas = replicas
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("ensure stream %s: %w", sc.Name, err)
		}
	}
	for _, kc := range t.Buckets {
		kc.Replicas = replicas
		if _, err := js.CreateOrUpdateKeyValue(ctx, kc); err != nil {
			return fmt.Errorf("ensure bucket %s: %w", kc.Bucket, err)
		}
	}
	return nil
}

// EventStream is the configuration every domain event stream shares: file storage, kept
// forever (the stream is the source of truth), a duplicate window for idempotent appends.
func EventStream(name, description string, subjects ...string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        name,
		Description: description,
		Subjects:    subjects,
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Duplicates:  2 * time.Minute,
		AllowRollup: false,
		DenyDelete:  true,
		DenyPurge:   false,
	}
}

// DeadLetterStream parks messages that could not be processed, with headers saying where they
// came from and why, for an operator to inspect and replay.
const DeadLetterStreamName = "FLEET_DLQ"

// DeadLetterSubjectPrefix prefixes fleet.dlq.<stream>.<consumer>.
const DeadLetterSubjectPrefix = "fleet.dlq"

// DeadLetter is the topology of the shared dead-letter stream.
func DeadLetter() Topology {
	return Topology{Streams: []jetstream.StreamConfig{{
		Name:        DeadLetterStreamName,
		Description: "Messages a consumer could not process (malformed or failing past max deliveries).",
		Subjects:    []string{DeadLetterSubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		MaxAge:      30 * 24 * time.Hour,
		Duplicates:  2 * time.Minute,
	}}}
}
