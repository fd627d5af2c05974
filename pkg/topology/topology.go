// Package topology declares JetStream streams and KV buckets in code and creates or updates them
// idempotently when a service starts.
package topology

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
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
		if _, _, err := OpenBucket(ctx, js, kc); err != nil {
			return fmt.Errorf("ensure bucket %s: %w", kc.Bucket, err)
		}
	}
	return nil
}

// OpenBucket returns bucket cfg.Bucket, creating it, or updating its configuration where it
// differs from cfg; created reports that it did not exist. A bucket that already has cfg is only
// looked up: CreateOrUpdateKeyValue costs two requests to the JetStream meta leader (account
// info, stream update) even when nothing changes, and every view engine opens its bucket each
// time it takes its lease. After a NATS node is lost, every lease may move at once, just when a
// newly elected meta leader is busy; those requests are what delayed the views' return.
func OpenBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (kv jetstream.KeyValue, created bool, err error) {
	kv, err = js.KeyValue(ctx, cfg.Bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		created = true
	case err != nil:
		return nil, false, err
	default:
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, false, err
		}
		if bucketHas(st.Config(), cfg) {
			return kv, false, nil
		}
	}
	if kv, err = js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
		return nil, false, err
	}
	return kv, created, nil
}

// bucketHas reports whether a bucket configured as have already is what want asks for, with
// JetStream's spellings of the defaults (history 1, one replica, -1 for no size limit). Fields
// the server fills in on its own (metadata keys it adds) do not count; anything not understood
// counts as a difference, and the bucket is updated. Placement counts only when want sets it.
func bucketHas(have, want jetstream.KeyValueConfig) bool {
	orMinus1 := func(n int64) int64 {
		if n == 0 {
			return -1
		}
		return n
	}
	history := max(want.History, 1)
	replicas := max(want.Replicas, 1)
	for k, v := range want.Metadata {
		if got, ok := have.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return have.Description == want.Description &&
		orMinus1(int64(have.MaxValueSize)) == orMinus1(int64(want.MaxValueSize)) &&
		have.History == history &&
		have.TTL == want.TTL &&
		orMinus1(have.MaxBytes) == orMinus1(want.MaxBytes) &&
		have.Storage == want.Storage &&
		have.Replicas == replicas &&
		have.Compression == want.Compression &&
		have.LimitMarkerTTL == want.LimitMarkerTTL &&
		(want.Placement == nil || reflect.DeepEqual(have.Placement, want.Placement)) &&
		reflect.DeepEqual(have.RePublish, want.RePublish) &&
		reflect.DeepEqual(have.Mirror, want.Mirror) &&
		reflect.DeepEqual(have.Sources, want.Sources)
}

// EventStream is the configuration every domain event stream shares: file storage, kept
// forever by default (Forever: the stream is the source of truth), a duplicate window for
// idempotent appends. Retentions overrides the limits per stream.
func EventStream(name, description string, subjects ...string) jetstream.StreamConfig {
	sc := jetstream.StreamConfig{
		Name:        name,
		Description: description,
		Subjects:    subjects,
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Duplicates:  DuplicateWindow,
		AllowRollup: false,
		DenyDelete:  true,
		DenyPurge:   false,
	}
	Forever.apply(&sc)
	return sc
}

// DuplicateWindow is how long the event streams remember a message id to drop a repeated
// append. JetStream refuses a stream whose max age is below it, so a retention limit may not be.
const DuplicateWindow = 2 * time.Minute

// maxDays bounds an age in days so that it still fits a time.Duration (about 292 years).
const maxDays = 100_000

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

// Retention is how much of a stream JetStream keeps: events older than MaxAge or beyond MaxBytes
// (the oldest first) are removed. Zero values mean no limit.
type Retention struct {
	MaxAge   time.Duration
	MaxBytes int64
}

// Forever is the default retention of the domain event streams. They are the source of truth:
// views are rebuilt from them (a projection's new version replays from sequence 1) and AccessAt
// answers from them, so by default nothing is dropped. A limit is an operator's choice that
// trades rebuilding views from the stream for disk (see docs/events.md, Retention).
var Forever = Retention{}

// String is the retention as the flag takes it.
func (r Retention) String() string {
	age, size := r.Limits()
	return "max-age=" + age + ",max-bytes=" + size
}

// Limits returns the age and size limits as the flag spells them ("forever", "unlimited").
func (r Retention) Limits() (age, size string) {
	age, size = "forever", "unlimited"
	if r.MaxAge > 0 {
		age = r.MaxAge.String()
	}
	if r.MaxBytes > 0 {
		size = formatBytes(r.MaxBytes)
	}
	return age, size
}

// Of returns the retention sc states (its defaults when nothing overrides them).
func Of(sc jetstream.StreamConfig) Retention {
	r := Retention{MaxAge: sc.MaxAge, MaxBytes: sc.MaxBytes}
	if r.MaxBytes < 0 {
		r.MaxBytes = 0
	}
	return r
}

// apply sets r's limits on sc; JetStream spells "no byte limit" -1.
func (r Retention) apply(sc *jetstream.StreamConfig) {
	sc.MaxAge = r.MaxAge
	sc.MaxBytes = r.MaxBytes
	if sc.MaxBytes <= 0 {
		sc.MaxBytes = -1
	}
}

// Retentions overrides the retention of streams by name. As a flag.Value it takes
// STREAM=max-age=DURATION,max-bytes=SIZE and may be repeated (one stream each time); a missing
// limit is unlimited, durations also take days ("90d"), sizes KiB, MiB, GiB or TiB.
type Retentions map[string]Retention

// Apply returns t with the overridden streams' limits set. Every service ensuring a stream
// must be given the same override, or they undo each other's at start.
func (rs Retentions) Apply(t Topology) Topology {
	if len(rs) == 0 {
		return t
	}
	out := Topology{Buckets: t.Buckets, Streams: make([]jetstream.StreamConfig, len(t.Streams))}
	for i, sc := range t.Streams {
		if r, ok := rs[sc.Name]; ok {
			r.apply(&sc)
		}
		out.Streams[i] = sc
	}
	return out
}

// String lists the overrides sorted by stream.
func (rs Retentions) String() string {
	names := make([]string, 0, len(rs))
	for n := range rs {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + rs[n].String()
	}
	return strings.Join(parts, " ")
}

// Set parses one STREAM=max-age=...,max-bytes=... override.
func (rs Retentions) Set(v string) error {
	name, spec, ok := strings.Cut(v, "=")
	if !ok || name == "" || spec == "" {
		return fmt.Errorf("retention %q: want STREAM=max-age=DURATION,max-bytes=SIZE", v)
	}
	r, err := ParseRetention(spec)
	if err != nil {
		return fmt.Errorf("retention of %s: %w", name, err)
	}
	rs[name] = r
	return nil
}

// ParseRetention parses "max-age=DURATION,max-bytes=SIZE" (either part may be left out;
// "forever", "unlimited" and 0 mean no limit).
func ParseRetention(spec string) (Retention, error) {
	var r Retention
	for part := range strings.SplitSeq(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return r, fmt.Errorf("%q: want max-age=DURATION or max-bytes=SIZE", part)
		}
		var err error
		switch k {
		case "max-age":
			r.MaxAge, err = parseAge(v)
		case "max-bytes":
			r.MaxBytes, err = parseBytes(v)
		default:
			err = fmt.Errorf("unknown limit %q (max-age, max-bytes)", k)
		}
		if err != nil {
			return r, err
		}
	}
	return r, nil
}

func parseAge(v string) (time.Duration, error) {
	if v == "forever" || v == "0" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.ParseUint(days, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("max-age %q: %w", v, err)
		}
		if n > maxDays {
			return 0, fmt.Errorf("max-age %q: at most %dd", v, maxDays)
		}
		return atLeastDuplicateWindow(v, time.Duration(n)*24*time.Hour)
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("max-age %q: want a positive duration (720h, 90d) or forever", v)
	}
	return atLeastDuplicateWindow(v, d)
}

func atLeastDuplicateWindow(v string, d time.Duration) (time.Duration, error) {
	if d > 0 && d < DuplicateWindow {
		return 0, fmt.Errorf("max-age %q: at least the streams' duplicate window, %s", v, DuplicateWindow)
	}
	return d, nil
}

var byteUnits = []struct {
	suffix string
	n      int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

func parseBytes(v string) (int64, error) {
	if v == "unlimited" || v == "0" {
		return 0, nil
	}
	mult := int64(1)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = n, u.n
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("max-bytes %q: want a size (10GiB, 512MiB) or unlimited", v)
	}
	return n * mult, nil
}

func formatBytes(n int64) string {
	for _, u := range byteUnits {
		if n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
