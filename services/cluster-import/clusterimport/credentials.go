package clusterimport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/sealed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// PlaintextKeyID names, in reseal reports, values stored before credentials were sealed.
const PlaintextKeyID = "(plaintext)"

// sealContext binds a sealed value to the bucket key it is stored under: credentials copied to
// another cluster's key do not open.
func sealContext(clusterID string) []byte {
	return []byte(subjects.ClusterCredentialsBucket + "/" + clusterID)
}

// encodeSecrets marshals sec for the bucket with its credentials sealed. Without a keyring
// (only with --insecure-dev) they are stored as they are.
func encodeSecrets(ring *sealed.Keyring, sec *clusterv1.ClusterSecrets) ([]byte, error) {
	out := proto.CloneOf(sec)
	if ring != nil && out.Credentials != nil {
		plain, err := proto.Marshal(out.Credentials)
		if err != nil {
			return nil, fmt.Errorf("marshal credentials of cluster %s: %w", sec.ClusterName, err)
		}
		if out.SealedCredentials, err = ring.Seal(plain, sealContext(sec.ClusterId)); err != nil {
			return nil, fmt.Errorf("seal credentials of cluster %s: %w", sec.ClusterName, err)
		}
		out.Credentials = nil
	}
	data, err := proto.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("marshal secrets of cluster %s: %w", sec.ClusterName, err)
	}
	return data, nil
}

// decodeSecrets is encodeSecrets' inverse; it also reads values stored in plaintext before
// sealing existed. Errors name the cluster and key id, never the content.
func decodeSecrets(ring *sealed.Keyring, id string, data []byte) (*clusterv1.ClusterSecrets, error) {
	sec := &clusterv1.ClusterSecrets{}
	if err := proto.Unmarshal(data, sec); err != nil {
		return nil, fmt.Errorf("decode credentials of cluster %s: %w", id, err)
	}
	if len(sec.SealedCredentials) == 0 {
		return sec, nil
	}
	if ring == nil {
		keyID, _ := sealed.KeyID(sec.SealedCredentials)
		return nil, fmt.Errorf("credentials of cluster %s are sealed with key %q but no --credentials-key-file is given", id, keyID)
	}
	plain, err := ring.Open(sec.SealedCredentials, sealContext(sec.ClusterId))
	if err != nil {
		return nil, fmt.Errorf("open credentials of cluster %s: %w", id, err)
	}
	creds := &clusterv1.ConnectionCredentials{}
	if err := proto.Unmarshal(plain, creds); err != nil {
		return nil, fmt.Errorf("decode opened credentials of cluster %s: %w", id, err)
	}
	sec.Credentials, sec.SealedCredentials = creds, nil
	return sec, nil
}

// getSecretsSealed loads a cluster's secrets without opening the credentials: enough to drop
// them, even when the key that sealed them is gone.
func (s *Registry) getSecretsSealed(ctx context.Context, id string) (*clusterv1.ClusterSecrets, error) {
	e, err := s.secrets.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("load credentials of cluster %s: %w", id, err)
	}
	sec := &clusterv1.ClusterSecrets{}
	if err := proto.Unmarshal(e.Value(), sec); err != nil {
		return nil, fmt.Errorf("decode credentials of cluster %s: %w", id, err)
	}
	return sec, nil
}

// Credentials returns the connection credentials of a registered cluster, opened; nil if it
// was registered without any. For hub-side code that reaches member clusters; never for API
// responses or logs.
func (s *Registry) Credentials(ctx context.Context, cluster string) (*clusterv1.ConnectionCredentials, error) {
	if err := s.gate.Ready(ctx); err != nil {
		return nil, err
	}
	c, ok := s.clusters.Get(clusterKey(cluster))
	if !ok {
		return nil, fmt.Errorf("credentials of cluster %s: not registered", cluster)
	}
	sec, err := s.getSecrets(ctx, c.Id)
	if err != nil {
		return nil, err
	}
	return sec.Credentials, nil
}

// ResealReport says what Reseal did, by key id; it never holds a value.
type ResealReport struct {
	// ActiveKeyID is the key everything is now sealed with.
	ActiveKeyID string
	// Resealed counts values resealed, by the key id they had (PlaintextKeyID for values
	// stored before sealing).
	Resealed map[string]int
	// Current counts values already under the active key; Empty those without credentials.
	Current, Empty int
	// Failed lists the cluster ids whose value could not be opened, with why.
	Failed map[string]string
}

// Total is how many values were resealed.
func (r ResealReport) Total() int {
	n := 0
	for _, c := range r.Resealed {
		n += c
	}
	return n
}

// String is a one-line summary, without any value.
func (r ResealReport) String() string {
	var from []string
	for _, id := range slices.Sorted(maps.Keys(r.Resealed)) {
		from = append(from, fmt.Sprintf("%d from %s", r.Resealed[id], id))
	}
	s := fmt.Sprintf("resealed %d credential values under key %s", r.Total(), r.ActiveKeyID)
	if len(from) > 0 {
		s += " (" + strings.Join(from, ", ") + ")"
	}
	s += fmt.Sprintf("; %d already under it, %d without credentials", r.Current, r.Empty)
	if len(r.Failed) > 0 {
		s += fmt.Sprintf("; %d FAILED", len(r.Failed))
	}
	return s
}

// Reseal seals every stored credential value with ring's active key: values of older keys
// the ring still lists and values stored in plaintext. Each value is replaced with
// compare-and-set on its revision, so a concurrent write (a credentials update, a
// registration) is never overwritten: the value is read again and, if still needed, resealed.
// A value that cannot be opened is reported in Failed and left as it is; the returned error
// is then non-nil so that a rotation is never reported done while a value still needs an old
// key.
func Reseal(ctx context.Context, js jetstream.JetStream, ring *sealed.Keyring, log *zap.Logger) (ResealReport, error) {
	rep := ResealReport{ActiveKeyID: ring.ActiveID(), Resealed: map[string]int{}, Failed: map[string]string{}}
	kv, err := js.KeyValue(ctx, subjects.ClusterCredentialsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return rep, nil // nothing was ever registered
	}
	if err != nil {
		return rep, fmt.Errorf("bucket %s: %w", subjects.ClusterCredentialsBucket, err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return rep, fmt.Errorf("list %s: %w", subjects.ClusterCredentialsBucket, err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	_ = lister.Stop() // already stopped once every key was listed; frees it if ctx ended first
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	// A listing may repeat a key written while it ran.
	slices.Sort(keys)
	keys = slices.Compact(keys)
	for _, key := range keys {
		if err := resealOne(ctx, kv, ring, key, &rep); err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			rep.Failed[key] = err.Error()
			log.Error("reseal credentials", zap.String("cluster_id", key), zap.Error(err))
		}
	}
	if len(rep.Failed) > 0 {
		return rep, fmt.Errorf("%d credential values could not be resealed (the key file must list the keys that sealed them)", len(rep.Failed))
	}
	return rep, nil
}

func resealOne(ctx context.Context, kv jetstream.KeyValue, ring *sealed.Keyring, key string, rep *ResealReport) error {
	for attempt := 0; ; attempt++ {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return nil // deregistered meanwhile
		}
		if err != nil {
			return fmt.Errorf("load credentials of cluster %s: %w", key, err)
		}
		var raw clusterv1.ClusterSecrets
		if err := proto.Unmarshal(e.Value(), &raw); err != nil {
			return fmt.Errorf("decode credentials of cluster %s: %w", key, err)
		}
		from := PlaintextKeyID
		switch {
		case len(raw.SealedCredentials) > 0:
			if from, err = sealed.KeyID(raw.SealedCredentials); err != nil {
				return fmt.Errorf("credentials of cluster %s: %w", key, err)
			}
			if from == ring.ActiveID() {
				rep.Current++
				return nil
			}
		case raw.Credentials == nil:
			rep.Empty++
			return nil
		}
		sec, err := decodeSecrets(ring, key, e.Value())
		if err != nil {
			return err
		}
		data, err := encodeSecrets(ring, sec)
		if err != nil {
			return err
		}
		_, err = kv.Update(ctx, key, data, e.Revision())
		if err == nil {
			rep.Resealed[from]++
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) || attempt >= 10 {
			return fmt.Errorf("store resealed credentials of cluster %s: %w", key, err)
		}
		// Someone wrote the value since it was read: read it again.
	}
}
