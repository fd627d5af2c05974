package clusterimport

import (
	"context"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/importpolicy"
)

// ImportPolicyAPI serves fleetstream.cluster.v1.ImportPolicyService. Rendering is
// pkg/importpolicy's: the preview here is exactly what an import would render.
type ImportPolicyAPI struct {
	s      *Registry
	engine *importpolicy.Engine
}

// ImportPolicies returns the ImportPolicyService handler.
func (s *Registry) ImportPolicies() *ImportPolicyAPI {
	return &ImportPolicyAPI{s: s, engine: importpolicy.NewEngine(importpolicy.Limits{}).WithCredentialsPolicy(s.cfg.Credentials)}
}

func (a *ImportPolicyAPI) PreviewImportPolicy(ctx context.Context, req *connect.Request[clusterv1.PreviewImportPolicyRequest]) (*connect.Response[clusterv1.PreviewImportPolicyResponse], error) {
	m := req.Msg
	var v apierr.Violations
	if m.Policy == nil {
		v.Add("policy", "required")
	}
	if m.SourceObject == "" {
		v.Add("source_object", "required: the source object as JSON")
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	refs := make(map[string][]byte, len(m.References))
	for k, obj := range m.References {
		refs[k] = []byte(obj)
	}
	p := a.engine.Preview(ctx, policyFromProto(m.Policy), []byte(m.SourceObject), refs)
	return connect.NewResponse(previewToProto(p)), nil
}

func policyFromProto(p *clusterv1.ImportPolicy) *importpolicy.ImportPolicy {
	out := &importpolicy.ImportPolicy{
		Name: p.Name,
		Source: importpolicy.Source{
			Cluster: p.GetSource().GetCluster(), Group: p.GetSource().GetGroup(), Version: p.GetSource().GetVersion(),
			Resource: p.GetSource().GetResource(), Namespace: p.GetSource().GetNamespace(), SelectorTemplate: p.GetSource().GetSelectorTemplate(),
		},
		NameTemplate: p.NameTemplate, Template: p.Template, CreationCondition: p.CreationCondition,
	}
	for _, r := range p.References {
		out.References = append(out.References, importpolicy.Reference{Key: r.Key, Group: r.Group, Version: r.Version,
			Resource: r.Resource, NamespaceTemplate: r.NamespaceTemplate, NameTemplate: r.NameTemplate})
	}
	return out
}

func previewToProto(p *importpolicy.Preview) *clusterv1.PreviewImportPolicyResponse {
	out := &clusterv1.PreviewImportPolicyResponse{Name: p.Name, Create: p.Create}
	if c := p.Cluster; c != nil {
		pc := &clusterv1.PreviewCluster{Labels: c.Labels, Claims: c.Claims, Server: c.Server, CredentialsRendered: c.CredentialsRendered}
		for _, t := range c.Taints {
			pc.Taints = append(pc.Taints, &clusterv1.Taint{Key: t.Key, Value: t.Value, Effect: clusterv1.TaintEffect(clusterv1.TaintEffect_value[t.Effect])})
		}
		out.Cluster = pc
	}
	for _, t := range p.References {
		out.References = append(out.References, &clusterv1.ImportTarget{Key: t.Key, Group: t.Group, Version: t.Version,
			Resource: t.Resource, Namespace: t.Namespace, Name: t.Name})
	}
	for _, e := range p.Errors {
		out.Errors = append(out.Errors, &clusterv1.ImportFieldError{Field: e.Field, Message: e.Message, Reason: e.Reason})
	}
	for _, c := range p.Conditions {
		out.Conditions = append(out.Conditions, &clusterv1.Condition{Type: c.Type, Status: conditionStatus(c.Status), Reason: c.Reason, Message: c.Message})
	}
	return out
}

func conditionStatus(s string) clusterv1.ConditionStatus {
	switch s {
	case "True":
		return clusterv1.ConditionStatus_CONDITION_STATUS_TRUE
	case "False":
		return clusterv1.ConditionStatus_CONDITION_STATUS_FALSE
	case "Unknown":
		return clusterv1.ConditionStatus_CONDITION_STATUS_UNKNOWN
	}
	return clusterv1.ConditionStatus_CONDITION_STATUS_UNSPECIFIED
}
