package audit

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/authz"
	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Paging bounds.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
	// maxScan bounds the index rows one call reads: rows the subject filter selects but the
	// time filter drops count too, so a call over a large store ends in bounded time and
	// returns a token to go on.
	maxScan = 10_000
	// fetchBatch bounds the rows held in memory at once besides the page.
	fetchBatch = 256
	// maxFilterProjects bounds the projects an unfiltered query of a non-admin covers (one
	// subject filter each).
	maxFilterProjects = 256
	// maxFilterBytes bounds a filter's value (no name, and no actor worth a subject, is longer).
	maxFilterBytes = 512
)

// ClockSkew is how far the clocks of the processes that write rows (an event's time is its
// publisher's, a denial's the recording service's) may be from the NATS server's, which stamps
// where each row is stored.
//
// There is no matching cut-off at until: a row is stored after its event, but how long after
// has no bound (an indexer down for a day indexes that day's events when it starts again), so
// no stored time proves that every later row is of an event after until. A query with until is
// bounded per call by maxScan instead, with a token to go on.
const ClockSkew = 5 * time.Minute

// ListActivity answers from FLEET_AUDIT with a consumer filtered on the rows' subjects, so
// the server reads only the rows the filters select (its per-subject index), oldest first.
func (s *Service) ListActivity(ctx context.Context, req *connect.Request[auditv1.ListActivityRequest]) (*connect.Response[auditv1.ListActivityResponse], error) {
	m := req.Msg
	var v apierr.Violations
	if m.PageSize < 0 || m.PageSize > MaxPageSize {
		v.Add("page_size", "must be between 0 and %d, not %d", MaxPageSize, m.PageSize)
	}
	for _, f := range []struct{ field, value string }{{"actor", m.Actor}, {"kind", m.Kind}, {"name", m.Name}, {"project", m.Project}, {"cluster", m.Cluster}} {
		if len(f.value) > maxFilterBytes {
			v.Add(f.field, "is %d bytes, more than any row's %d", len(f.value), maxFilterBytes)
		}
	}
	if m.Since != nil && !m.Since.IsValid() {
		v.Add("since", "is not a valid timestamp")
	}
	if m.Until != nil && !m.Until.IsValid() {
		v.Add("until", "is not a valid timestamp")
	}
	if m.Since != nil && m.Until != nil && !m.Until.AsTime().After(m.Since.AsTime()) {
		v.Add("until", "must be after since")
	}
	fp := fingerprint(m)
	var start uint64
	if m.PageToken != "" {
		seq, err := decodeToken(m.PageToken, fp)
		if err != nil {
			v.Add("page_token", "%v", err)
		}
		start = seq
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	pageSize := int(m.PageSize)
	if pageSize == 0 {
		pageSize = DefaultPageSize
	}

	// Whose rows: a platform admin's query as asked; anyone else's only within the projects
	// where they may list activity. Rows of no project (the platform's) are never theirs.
	c := authz.CallerFrom(ctx)
	projects := []string{m.Project}
	if !c.Admin() {
		allowed := c.ProjectsAllowing("list", roles.Group, roles.ResActivity)
		if m.Project != "" {
			if !slices.Contains(allowed, m.Project) {
				err := apierr.PermissionDenied("user %q may not list activity.%s in project %q", c.User(), roles.Group, m.Project)
				c.RecordDenial(req.Spec().Procedure, roles.ResActivity, m.Project, denialMessage(err))
				return nil, err
			}
		} else {
			if len(allowed) == 0 {
				return connect.NewResponse(&auditv1.ListActivityResponse{}), nil
			}
			if len(allowed) > maxFilterProjects {
				return nil, apierr.PermissionDenied("user %q may list activity in %d projects, more than one query covers (%d): name one in project",
					c.User(), len(allowed), maxFilterProjects)
			}
			projects = allowed
		}
	}
	class := ""
	if m.DeniedOnly {
		class = ClassDenied
	}
	filters := make([]string, 0, len(projects))
	for _, p := range projects {
		filters = append(filters, filterSubject(class, p, m.Cluster, m.Kind, m.Name, m.Actor))
	}

	cfg := jetstream.ConsumerConfig{
		FilterSubjects:    filters,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		InactiveThreshold: 30 * time.Second,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
	}
	switch {
	case start > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	case m.Since != nil:
		// A row is stored after its event, but its time is the publisher's clock and where it
		// is stored the NATS server's: starting at since less the skew they may differ by skips
		// no row of an event at or after since; the time filter drops what is earlier.
		t := m.Since.AsTime().Add(-ClockSkew)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	cons, err := s.stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("audit: read the index: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()

	res := &auditv1.ListActivityResponse{}
	// left is how many rows the filters select after the last one read (the consumer's count,
	// then each message's): never asking for more than that, a fetch never waits for rows
	// that are not there.
	left := cons.CachedInfo().NumPending
	var scanned, next uint64
	more := left > 0
	limit := s.maxScan.Load()
	for more && len(res.Activities) < pageSize && scanned < limit {
		want := min(uint64(fetchBatch), left, limit-scanned)
		batch, err := cons.Fetch(int(want), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("audit: read the index: %w", err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			if len(res.Activities) >= pageSize {
				continue // left for the next call, which starts at it
			}
			md, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("audit: read the index: %w", err)
			}
			scanned++
			next = md.Sequence.Stream + 1
			left = md.NumPending
			more = left > 0
			a := &auditv1.Activity{}
			if err := proto.Unmarshal(msg.Data(), a); err != nil {
				continue // not a row this build understands
			}
			a.Id = md.Sequence.Stream
			if !fromSubject(a, msg.Subject()) {
				continue // not a row's subject
			}
			if inTime(a, m) {
				res.Activities = append(res.Activities, a)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("audit: read the index: %w", err)
		}
		if got == 0 {
			more = false // nothing came within the wait: the rows counted were removed meanwhile
		}
	}
	if more && next > 0 {
		res.NextPageToken = encodeToken(next, fp)
	}
	return connect.NewResponse(res), nil
}

// fromSubject makes a row say what its subject says, for what the subject holds: the filters
// and who may see a row go by its subject, and the permissions make the subject, not the body,
// say who wrote it. Every service may publish denied rows (fleet.audit.denied.>) with any body;
// only the indexer event rows. So a denied row is always a denial, of the project and cluster
// its subject names, never an event: its body cannot claim an event's type, stream or sequence.
// It returns false for a subject that is not a row's.
func fromSubject(a *auditv1.Activity, subject string) bool {
	rest, ok := strings.CutPrefix(subject, subjects.AuditPrefix+".")
	if !ok {
		return false
	}
	toks, err := keys.Split(rest)
	if err != nil || len(toks) != 6 {
		return false
	}
	class, project, cluster, kind, name, actor := toks[0], toks[1], toks[2], toks[3], toks[4], toks[5]
	a.Project = project
	switch class {
	case ClassEvent:
		// activitySubject drops a too-long cluster from the subject; the indexer's body has it.
		if cluster != "" {
			a.Cluster = cluster
		}
	case ClassDenied:
		a.Type, a.Stream, a.Sequence, a.EventId = "Denied", "", 0, ""
		a.Cluster = cluster
	default:
		return false
	}
	// Fields activitySubject may have dropped for length are kept from the body.
	for _, f := range []struct {
		tok   string
		field *string
	}{{kind, &a.Kind}, {name, &a.Name}, {actor, &a.Actor}} {
		if f.tok != "" {
			*f.field = f.tok
		}
	}
	return true
}

func inTime(a *auditv1.Activity, m *auditv1.ListActivityRequest) bool {
	t := a.GetTime().AsTime()
	if m.Since != nil && t.Before(m.Since.AsTime()) {
		return false
	}
	if m.Until != nil && !t.Before(m.Until.AsTime()) {
		return false
	}
	return true
}

// filterSubject selects the rows matching the filters; an empty filter matches any token.
func filterSubject(class, project, cluster, kind, name, actor string) string {
	tok := func(s string) string {
		if s == "" {
			return "*"
		}
		return keys.Encode(s)
	}
	return subjects.AuditPrefix + "." + strings.Join([]string{tok(class), tok(project), tok(cluster), tok(kind), tok(name), tok(actor)}, ".")
}

// A page token is the index position to go on from and a fingerprint of the filters, so a
// token is not taken for another query.
func fingerprint(m *auditv1.ListActivityRequest) uint32 {
	h := fnv.New32a()
	for _, s := range []string{m.Actor, m.Kind, m.Name, m.Project, m.Cluster, m.GetSince().String(), m.GetUntil().String(), strconv.FormatBool(m.DeniedOnly)} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return h.Sum32()
}

func encodeToken(seq uint64, fp uint32) string {
	return base64.RawURLEncoding.EncodeToString([]byte("a1." + strconv.FormatUint(seq, 10) + "." + strconv.FormatUint(uint64(fp), 16)))
}

func decodeToken(tok string, fp uint32) (uint64, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, errors.New("is not a token ListActivity returned")
	}
	parts := strings.Split(string(raw), ".")
	if len(parts) != 3 || parts[0] != "a1" {
		return 0, errors.New("is not a token ListActivity returned")
	}
	seq, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || seq == 0 {
		return 0, errors.New("is not a token ListActivity returned")
	}
	if parts[2] != strconv.FormatUint(uint64(fp), 16) {
		return 0, errors.New("was returned for other filters: repeat the filters of the call that returned it")
	}
	return seq, nil
}

// denialMessage is the message of a Connect error (what the caller was told).
func denialMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}
