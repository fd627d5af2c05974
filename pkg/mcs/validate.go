package mcs

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
)

// ValidateExport checks one export of a report as the hub does; the error names the field
// (relative to the export). The agent runs it before reporting (an export that fails gets
// Valid=False and is left out), so the hub's refusal of a whole report only ever means an
// agent that does not run it: misbehaving.
//
// The rules are Kubernetes' own for the Service the export stands for: a port's name is a
// DNS-1123 label (Service ports, unlike container ports, are not bound to IANA's 15
// characters: grpc-health-check is valid).
func ValidateExport(e *endpointv1.ExportedService) error {
	if errs := validation.IsDNS1035Label(e.GetName()); len(errs) > 0 {
		return fmt.Errorf("name: %s", strings.Join(errs, "; "))
	}
	if e.GetType() != TypeClusterSetIP && e.GetType() != TypeHeadless {
		return fmt.Errorf("type: want %s or %s", TypeClusterSetIP, TypeHeadless)
	}
	if e.GetCreated() == nil || e.GetCreated().CheckValid() != nil {
		return fmt.Errorf("created: missing or invalid")
	}
	if n := len(e.GetPorts()); n > MaxPortsPerExport {
		return fmt.Errorf("ports: %d, at most %d", n, MaxPortsPerExport)
	}
	names := map[string]bool{}
	for j, p := range e.GetPorts() {
		pp := fmt.Sprintf("ports[%d]", j)
		if p.GetName() != "" {
			if errs := validation.IsDNS1123Label(p.GetName()); len(errs) > 0 {
				return fmt.Errorf("%s.name: %s", pp, strings.Join(errs, "; "))
			}
		} else if len(e.GetPorts()) > 1 {
			return fmt.Errorf("%s.name: required when a Service has several ports", pp)
		}
		if names[p.GetName()] {
			return fmt.Errorf("%s.name: %q twice", pp, p.GetName())
		}
		names[p.GetName()] = true
		if p.GetPort() < 1 || p.GetPort() > 65535 {
			return fmt.Errorf("%s.port: %d, want 1..65535", pp, p.GetPort())
		}
		switch p.GetProtocol() {
		case "TCP", "UDP", "SCTP":
		default:
			return fmt.Errorf("%s.protocol: want TCP, UDP or SCTP", pp)
		}
		if a := p.GetAppProtocol(); a != "" {
			if errs := validation.IsQualifiedName(a); len(errs) > 0 {
				return fmt.Errorf("%s.app_protocol: %s", pp, strings.Join(errs, "; "))
			}
		}
	}
	return nil
}
