package clusterimport

import (
	"errors"
	"fmt"
	"net/url"

	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/kubecreds"
)

const maxClaimValue = 1024

func validateMeta(v *apierr.Violations, lbls, claims map[string]string, taints []*clusterv1.Taint) {
	v.Labels("labels", lbls)
	v.Limit("claims", claims, apierr.MaxClaims, apierr.MaxClaimBytes)
	for k, val := range claims {
		for _, msg := range validation.IsQualifiedName(k) {
			v.Add(fmt.Sprintf("claims[%s]", apierr.Short(k)), "key: %s", msg)
		}
		if isReportedClaim(k) {
			v.Add(fmt.Sprintf("claims[%s]", apierr.Short(k)), "names ending in %s are reserved for what the cluster's agent reports", ReservedClaimSuffix)
		}
		if len(val) > maxClaimValue {
			v.Add(fmt.Sprintf("claims[%s]", apierr.Short(k)), "value longer than %d bytes", maxClaimValue)
		}
	}
	if len(taints) > apierr.MaxTaints {
		v.Add("taints", "%d taints, at most %d allowed", len(taints), apierr.MaxTaints)
		return
	}
	seen := map[string]bool{}
	for i, t := range taints {
		f := fmt.Sprintf("taints[%d]", i)
		for _, msg := range validation.IsQualifiedName(t.Key) {
			v.Add(f+".key", "%s: %s", apierr.Short(t.Key), msg)
		}
		if isSystemTaint(t.Key) {
			v.Add(f+".key", "%s: the %s prefix is reserved for taints the system manages", apierr.Short(t.Key), systemTaintPrefix)
		}
		for _, msg := range validation.IsValidLabelValue(t.Value) {
			v.Add(f+".value", "%s: %s", apierr.Short(t.Value), msg)
		}
		if _, ok := clusterv1.TaintEffect_name[int32(t.Effect)]; !ok || t.Effect == clusterv1.TaintEffect_TAINT_EFFECT_UNSPECIFIED {
			v.Add(f+".effect", "required: NO_SELECT, NO_SELECT_IF_NEW or PREFER_NO_SELECT")
		}
		id := t.Key + "\x00" + t.Effect.String()
		if seen[id] {
			v.Add(f, "duplicate taint %s with effect %s", t.Key, t.Effect)
		}
		seen[id] = true
	}
}

// validateCredentials refuses credentials that could do more than reach their cluster with the
// data they carry (pkg/kubecreds): an exec plugin would run on the hub, a file path would read
// the hub's files. The hosted agents check again when they load them.
func validateCredentials(v *apierr.Violations, field string, c *clusterv1.ConnectionCredentials, policy kubecreds.Policy) {
	if c == nil {
		return
	}
	if len(c.Kubeconfig) > 0 {
		if c.Server != "" || c.Token != "" || len(c.ClientCertificateData) > 0 {
			v.Add(field, "give either kubeconfig or server with token/client certificate, not both")
		}
		var ke *kubecreds.Error
		if _, err := kubecreds.Kubeconfig(c.Kubeconfig, policy); errors.As(err, &ke) {
			for _, fe := range ke.Fields {
				if fe.Field == "" {
					// Never a parse error's text: it may quote the secret.
					v.Add(field+".kubeconfig", "not a valid kubeconfig")
					continue
				}
				v.Add(field+".kubeconfig."+fe.Field, "%s", fe.Reason)
			}
		}
		return
	}
	if c.Server == "" {
		v.Add(field+".server", "required unless kubeconfig is given")
	} else if u, err := url.Parse(c.Server); err != nil || u.Scheme != "https" || u.Host == "" {
		v.Add(field+".server", "%q: want an https:// URL", c.Server)
	}
	if c.Token == "" && (len(c.ClientCertificateData) == 0 || len(c.ClientKeyData) == 0) {
		v.Add(field, "give a token or a client certificate and key")
	}
}

// stampTaints sets the time added of each taint: kept from the same taint in prev if there is
// one, now otherwise. tolerationSeconds count from it, so re-sending a taint must not reset it.
func stampTaints(ts, prev []*clusterv1.Taint) []*clusterv1.Taint {
	now := timestamppb.Now()
	for _, t := range ts {
		t.TimeAdded = now
		for _, p := range prev {
			if p.Key == t.Key && p.Effect == t.Effect && p.Value == t.Value {
				t.TimeAdded = p.TimeAdded
			}
		}
	}
	return ts
}
