package fleetd_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// TestExplainPlacementStaysInItsProject is the attack: the owner of team-b asks why team-a's
// placement did not select clusters. A team-a viewer is answered; team-b's owner is refused with
// no explanation in the body, and naming team-a's placement under team-b finds nothing.
func TestExplainPlacementStaysInItsProject(t *testing.T) {
	api := startTenants(t)
	if code, body := api.callFull(t, roleAdmin, "/fleetstream.placement.v1.PlacementService/CreatePlacement",
		`{"placement":{"project":"team-a","name":"secret-eu","numberOfClusters":1}}`); code != "" {
		t.Fatalf("create team-a's placement: %s %s", code, body)
	}
	const explain = "/fleetstream.placement.v1.PlacementService/ExplainPlacement"
	testkit.Eventually(t, 10*time.Second, func() error {
		code, body := api.callFull(t, roleViewer, explain, `{"project":"team-a","name":"secret-eu"}`)
		if code != "" {
			return fmt.Errorf("team-a's viewer explaining team-a's placement: %s %s", code, body)
		}
		var res struct {
			Project string `json:"project"`
			Name    string `json:"name"`
		}
		if err := json.Unmarshal(body, &res); err != nil || res.Name != "secret-eu" {
			return fmt.Errorf("explanation %s (%v)", body, err)
		}
		return nil
	})
	code, body := api.callFull(t, roleOther, explain, `{"project":"team-a","name":"secret-eu"}`)
	if code != "permission_denied" || strings.Contains(string(body), "clusters") {
		t.Fatalf("team-b's owner explaining team-a's placement: %q %s, want permission_denied and no explanation", code, body)
	}
	if code, body := api.callFull(t, roleOther, explain, `{"project":"team-b","name":"secret-eu"}`); code != "not_found" {
		t.Fatalf("team-b's owner naming team-a's placement under team-b: %q %s, want not_found", code, body)
	}
}
