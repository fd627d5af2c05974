package clusterimport

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// importSources holds what inventory clusters' agents report for import policies: the latest
// state of each source and referenced object (from FLEET_AGENT, replayed on start) and the
// referenced Secrets (from core NATS, in memory only: they are never written anywhere on the
// hub). It is derived state: a restart rebuilds it from the stream and the agents' resends.
type importSources struct {
	mu sync.Mutex
	// objects by inventory cluster, then object.
	objects map[string]map[objectRef]*reportedObject
	secrets map[string]map[objectRef]*reportedObject
	// watchStatus is each inventory cluster's latest ImportWatchStatus, checked (checkWatchStatus).
	watchStatus map[string]*agentWatchStatus
	// caughtUp is closed once the stream's reports present at start have been read: before,
	// a missing object may only be not read yet, and nothing may be removed for it.
	caughtUp     chan struct{}
	caughtUpOnce sync.Once
	kick         func()
	// handledSeq is the stream sequence of the last report handled and secretReports the
	// Secret reports received (Registry.WaitImportPass).
	handledSeq, secretReports uint64
}

type objectRef struct{ group, resource, namespace, name string }

type reportedObject struct {
	version  string
	json     []byte
	deleted  bool
	tooLarge bool
	gen      string
	seq      uint64
}

func newImportSources(kick func()) *importSources {
	return &importSources{
		objects:     map[string]map[objectRef]*reportedObject{},
		secrets:     map[string]map[objectRef]*reportedObject{},
		caughtUp:    make(chan struct{}),
		watchStatus: map[string]*agentWatchStatus{},
		kick:        kick,
	}
}

func (r *importSources) markCaughtUp() {
	r.caughtUpOnce.Do(func() { close(r.caughtUp) })
	r.kick()
}

// handled returns the stream sequence of the last report handled and the number of Secret
// reports received.
func (r *importSources) handled() (seq, secrets uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.handledSeq, r.secretReports
}

// sourceObjects returns the live objects of one source type on cluster, in namespace (all
// when empty).
func (r *importSources) sourceObjects(cluster, group, resource, namespace string) map[objectRef]*reportedObject {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[objectRef]*reportedObject{}
	for ref, o := range r.objects[cluster] {
		if ref.group == group && ref.resource == resource && (namespace == "" || ref.namespace == namespace) && !o.deleted {
			out[ref] = o
		}
	}
	return out
}

// object returns a reported object (a Secret from memory), nil when none was reported.
func (r *importSources) object(cluster string, ref objectRef) *reportedObject {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ref.group == "" && ref.resource == "secrets" {
		return r.secrets[cluster][ref]
	}
	return r.objects[cluster][ref]
}

// run reads the reports of FLEET_AGENT (the latest per subject first) until ctx ends.
func (r *importSources) run(ctx context.Context, js jetstream.JetStream, log *zap.Logger) error {
	sub, err := js.Conn().Subscribe(subjects.AgentSecretPrefix+".>", func(m *nats.Msg) { r.handleSecret(m, log) })
	if err != nil {
		return fmt.Errorf("subscribe to agents' secrets: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	// consumer.Ordered, not nats.go's ordered consumer: that one gives each attempt to replace
	// a consumer lost with a NATS node 10 s (issue 14).
	o, err := consumer.NewOrdered(ctx, js, subjects.AgentStreamName,
		[]string{subjects.AgentPrefix + ".*.importobject.>", subjects.AgentPrefix + ".*.importsync.>", subjects.AgentPrefix + ".*.importstatus"},
		0, 256, log, consumer.WithLastPerSubject())
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("import sources consumer: %w", err)
	}
	defer o.Stop()
	if o.InitialPending() == 0 {
		r.markCaughtUp()
	}
	err = o.Each(ctx, func(m jetstream.Msg, md *jetstream.MsgMetadata) {
		if err := r.handle(m.Subject(), m.Data(), md.Sequence.Stream); err != nil {
			// A report that does not decode is the agent's bug; it must not stop the others.
			log.Warn("import source report ignored", zap.String("subject", m.Subject()), zap.Error(err))
		}
		r.mu.Lock()
		r.handledSeq = max(r.handledSeq, md.Sequence.Stream)
		r.mu.Unlock()
		if md.NumPending == 0 {
			r.markCaughtUp()
		}
	})
	if err != nil {
		return fmt.Errorf("import sources: %w", err)
	}
	return nil
}

func (r *importSources) handle(subject string, data []byte, seq uint64) error {
	tok, err := subjectToken(subject, 2)
	if err != nil {
		return err
	}
	cluster, err := keys.Decode(tok)
	if err != nil {
		return err
	}
	ev, err := events.Decode(data)
	if err != nil {
		return err
	}
	changed := false
	r.mu.Lock()
	switch p := ev.Payload.(type) {
	case *agentv1.ImportObject:
		if p.ClusterName != cluster || subject != subjects.AgentImportObject(cluster, p.Group, p.Resource, p.Namespace, p.Name) {
			r.mu.Unlock()
			return fmt.Errorf("report of %s/%s names another cluster or object than its subject", p.ClusterName, p.Name)
		}
		m := r.objects[cluster]
		if m == nil {
			m = map[objectRef]*reportedObject{}
			r.objects[cluster] = m
		}
		ref := objectRef{p.Group, p.Resource, p.Namespace, p.Name}
		next := &reportedObject{version: p.Version, json: p.Object, deleted: p.Deleted, tooLarge: p.TooLarge, gen: p.SessionId, seq: seq}
		prev := m[ref]
		changed = prev == nil || prev.deleted != next.deleted || prev.tooLarge != next.tooLarge || !bytes.Equal(prev.json, next.json)
		if changed {
			m[ref] = next
		} else {
			// The same content keeps its identity, so renders of it stay valid (lifecycles
			// memoize by object).
			prev.gen, prev.seq, prev.version = next.gen, next.seq, next.version
		}
	case *agentv1.ImportSync:
		// Objects of this type an earlier run reported, older than the marker, were not seen
		// by the run that sent it: they were deleted while no agent watched.
		m := r.objects[cluster]
		for ref, o := range m {
			if ref.group == p.Group && ref.resource == p.Resource && (p.Namespace == "" || ref.namespace == p.Namespace) &&
				o.gen != p.SessionId && o.seq < seq && !o.deleted {
				// Replaced, never changed in place: a render may be reading the old one.
				m[ref] = &reportedObject{version: o.version, deleted: true, gen: o.gen, seq: o.seq}
				changed = true
			}
		}
	case *agentv1.ImportWatchStatus:
		if p.ClusterName != cluster || subject != subjects.AgentImportWatchStatus(cluster) {
			r.mu.Unlock()
			return fmt.Errorf("import watch status of %q names another cluster than its subject", p.ClusterName)
		}
		st, problems := checkWatchStatus(p, time.Now())
		r.watchStatus[cluster] = st
		if len(problems) > 0 {
			r.mu.Unlock()
			// Kept without what is out of bounds: the rest still says what the agent sees.
			return fmt.Errorf("import watch status of %q partly refused: %s", cluster, strings.Join(problems, "; "))
		}
	default:
		r.mu.Unlock()
		return fmt.Errorf("unexpected %s", ev.Type)
	}
	r.mu.Unlock()
	if changed {
		r.kick()
	}
	return nil
}

// watchStatusOf returns the latest checked ImportWatchStatus of cluster's agent, nil if none.
func (r *importSources) watchStatusOf(cluster string) *agentWatchStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watchStatus[cluster]
}

// handleSecret keeps a Secret an agent sent, in memory only. Its content is never logged.
func (r *importSources) handleSecret(m *nats.Msg, log *zap.Logger) {
	defer func() {
		r.mu.Lock()
		r.secretReports++
		r.mu.Unlock()
	}()
	parts := strings.Split(m.Subject, ".")
	if len(parts) != 5 {
		return
	}
	cluster, err := keys.Decode(parts[2])
	if err != nil {
		return
	}
	o := &agentv1.ImportObject{}
	if err := proto.Unmarshal(m.Data, o); err != nil {
		log.Warn("undecodable secret report ignored", zap.String("cluster", cluster))
		return
	}
	// NATS lets only cluster's agent publish under its name; the body must agree.
	if o.ClusterName != cluster || m.Subject != subjects.AgentSecret(cluster, o.Namespace, o.Name) || o.Group != "" || o.Resource != "secrets" {
		log.Warn("secret report names another cluster or object than its subject; ignored", zap.String("cluster", cluster), zap.String("subject", m.Subject))
		return
	}
	ref := objectRef{"", "secrets", o.Namespace, o.Name}
	next := &reportedObject{version: o.Version, json: o.Object, deleted: o.Deleted, tooLarge: o.TooLarge, gen: o.SessionId}
	r.mu.Lock()
	sm := r.secrets[cluster]
	if sm == nil {
		sm = map[objectRef]*reportedObject{}
		r.secrets[cluster] = sm
	}
	prev := sm[ref]
	changed := prev == nil || prev.deleted != next.deleted || prev.tooLarge != next.tooLarge || !bytes.Equal(prev.json, next.json)
	if changed {
		sm[ref] = next
	}
	r.mu.Unlock()
	// The agent resends every Secret periodically; only a change is worth a reconcile.
	if changed {
		r.kick()
	}
}
