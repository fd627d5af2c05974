package fleetd_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

const procListActivity = "/fleetstream.audit.v1.AuditService/ListActivity"

type activityRow struct {
	Actor, Type, Kind, Name, Project, Cluster, Procedure, Reason, Stream string
	Count                                                                int
}

// activity lists every row the filter body selects for caller, page by page; code is the
// first call's error code.
func activity(t *testing.T, api *rawClient, caller string, filter map[string]any) ([]activityRow, string) {
	t.Helper()
	var out []activityRow
	token := ""
	for {
		q := map[string]any{"pageSize": 1000}
		for k, v := range filter {
			q[k] = v
		}
		if token != "" {
			q["pageToken"] = token
		}
		body, _ := json.Marshal(q)
		code, data := api.callFull(t, caller, procListActivity, string(body))
		if code != "" {
			return nil, code
		}
		var res struct {
			Activities    []activityRow
			NextPageToken string
		}
		if err := json.Unmarshal(data, &res); err != nil {
			t.Fatal(err)
		}
		out = append(out, res.Activities...)
		if res.NextPageToken == "" {
			return out, ""
		}
		token = res.NextPageToken
	}
}

// waitActivity waits until caller's filter lists rows that ok accepts.
func waitActivity(t *testing.T, api *rawClient, caller string, filter map[string]any, ok func([]activityRow) error) []activityRow {
	t.Helper()
	var rows []activityRow
	testkit.Eventually(t, 20*time.Second, func() error {
		var code string
		if rows, code = activity(t, api, caller, filter); code != "" {
			return fmt.Errorf("%s: %s", caller, code)
		}
		return ok(rows)
	})
	return rows
}

// A platform admin asks what one user changed: the rows are that user's changes, with the
// objects and projects they touched, and nobody else's.
func TestAuditListsAUsersChanges(t *testing.T) {
	api := startTenants(t)
	for _, c := range []struct{ caller, proc, body string }{
		{roleOwner, procBindNS, `{"project":"team-a","cluster":"c1","namespace":"audit-ns"}`},
		{roleOwner, procBindRole, grantBody("team-a", "SUBJECT_KIND_USER", "zed", "project-viewer")},
		{roleOther, procBindNS, `{"project":"team-b","cluster":"c1","namespace":"audit-b"}`},
	} {
		if code, body := api.callFull(t, c.caller, c.proc, c.body); code != "" {
			t.Fatalf("%s %s: %s %s", c.caller, c.proc, code, body)
		}
	}
	rows := waitActivity(t, api, roleAdmin, map[string]any{"actor": roleOwner}, func(rows []activityRow) error {
		var kinds []string
		for _, r := range rows {
			kinds = append(kinds, r.Kind)
		}
		if !strings.Contains(strings.Join(kinds, ","), "project") || !strings.Contains(strings.Join(kinds, ","), "rolebinding") {
			return fmt.Errorf("owner's rows are of kinds %v, want project and rolebinding", kinds)
		}
		return nil
	})
	for _, r := range rows {
		if r.Actor != roleOwner || r.Project != "team-a" {
			t.Errorf("admin asked for owner's changes, got %+v", r)
		}
	}
	// The rows of a kind and name: the binding of zed.
	waitActivity(t, api, roleAdmin, map[string]any{"kind": "rolebinding", "project": "team-a"}, func(rows []activityRow) error {
		for _, r := range rows {
			if strings.Contains(r.Name, "zed") && r.Type == "fleetstream.rbac.v1.ProjectRoleBound" {
				return nil
			}
		}
		return fmt.Errorf("no ProjectRoleBound of zed in %+v", rows)
	})
}

// The attack: team-a's owner asks for team-b's activity (refused), and asks with no filter
// (only team-a's rows, none of team-b's or of the platform's).
func TestAuditOwnerSeesOnlyOwnProject(t *testing.T) {
	api := startTenants(t)
	if code, body := api.callFull(t, roleOther, procBindNS, `{"project":"team-b","cluster":"c1","namespace":"secret-b"}`); code != "" {
		t.Fatalf("other binds in team-b: %s %s", code, body)
	}
	// Wait until the admin sees team-b's change, so the index holds it.
	waitActivity(t, api, roleAdmin, map[string]any{"actor": roleOther}, func(rows []activityRow) error {
		if len(rows) == 0 {
			return fmt.Errorf("no rows of %s yet", roleOther)
		}
		return nil
	})
	if _, code := activity(t, api, roleOwner, map[string]any{"project": "team-b"}); code != "permission_denied" {
		t.Fatalf("owner of team-a asking for team-b: %q, want permission_denied", code)
	}
	// The attempt is itself activity, of team-b: its owner sees who looked.
	waitActivity(t, api, roleOther, map[string]any{"deniedOnly": true}, func(rows []activityRow) error {
		for _, r := range rows {
			if r.Actor == roleOwner && r.Procedure == procListActivity && r.Project == "team-b" && strings.Contains(r.Reason, "may not list activity") {
				return nil
			}
		}
		return fmt.Errorf("team-b's owner does not see the attempt on its trail: %+v", rows)
	})
	for _, filter := range []map[string]any{{}, {"actor": roleOther}, {"kind": "cluster"}, {"cluster": "c1"}} {
		rows, code := activity(t, api, roleOwner, filter)
		if code != "" {
			t.Fatalf("owner %v: %s", filter, code)
		}
		for _, r := range rows {
			if r.Project != "team-a" {
				t.Fatalf("owner of team-a listed %v and got %+v", filter, r)
			}
		}
		if len(filter) == 0 && len(rows) == 0 {
			t.Fatal("owner of team-a sees no activity of team-a")
		}
	}
	// A member holds no right to the trail: nothing, even of its own project.
	if _, code := activity(t, api, roleMember, map[string]any{"project": "team-a"}); code != "permission_denied" {
		t.Fatalf("member asking for team-a: %q, want permission_denied", code)
	}
	if rows, code := activity(t, api, roleMember, nil); code != "" || len(rows) != 0 {
		t.Fatalf("member unfiltered: %s, %d rows, want none", code, len(rows))
	}
}

// A denied call is activity: who, what and why, visible to admins and to the owners of the
// project it was aimed at.
func TestAuditRecordsDeniedCalls(t *testing.T) {
	api := startTenants(t)
	if code := api.call(t, roleOther, procBindNS, `{"project":"team-a","cluster":"c1","namespace":"steal"}`); code != "permission_denied" {
		t.Fatalf("other binding into team-a: %q", code)
	}
	check := func(rows []activityRow) error {
		for _, r := range rows {
			if r.Actor == roleOther && r.Procedure == procBindNS && r.Type == "Denied" && r.Project == "team-a" &&
				strings.Contains(r.Reason, `user "other" may not create namespacebindings`) {
				return nil
			}
		}
		return fmt.Errorf("no denial of other's BindNamespace in %+v", rows)
	}
	waitActivity(t, api, roleAdmin, map[string]any{"deniedOnly": true, "actor": roleOther}, check)
	waitActivity(t, api, roleOwner, map[string]any{"deniedOnly": true}, check)
}

// A client hammering one refused call is one row (its repeats are one more when the minute
// ends); one varying the call is kept to its burst and rate of denials, the rest counted as
// dropped: the store does not grow with the flood.
func TestAuditDenialFloodIsBounded(t *testing.T) {
	api := startTenants(t)
	const flood = 150
	for range flood {
		if code := api.call(t, roleNobody, procCreateProject, `{"name":"flood"}`); code != "permission_denied" {
			t.Fatalf("nobody creating a project: %q", code)
		}
	}
	waitActivity(t, api, roleAdmin, map[string]any{"actor": roleNobody, "deniedOnly": true}, func(rows []activityRow) error {
		if len(rows) != 1 || rows[0].Count != 1 {
			return fmt.Errorf("rows %+v, want the flood's first call (its repeats are counted until the minute ends)", rows)
		}
		return nil
	})

	start := time.Now()
	for i := range flood {
		if code := api.call(t, roleOther, procBindNS, fmt.Sprintf(`{"project":"team-%d","cluster":"c1","namespace":"steal"}`, i)); code != "permission_denied" {
			t.Fatalf("other binding into team-%d: %q", i, code)
		}
	}
	elapsed := time.Since(start)
	var rows []activityRow
	testkit.Eventually(t, 20*time.Second, func() error {
		var code string
		if rows, code = activity(t, api, roleAdmin, map[string]any{"actor": roleOther, "deniedOnly": true}); code != "" {
			return fmt.Errorf("list: %s", code)
		}
		dropped := metricValue(t, api, `fleetstream_audit_denials_dropped_total{reason="user_rate"}`)
		if len(rows)+int(dropped) != flood {
			return fmt.Errorf("%d rows and %v dropped, want %d in all", len(rows), dropped, flood)
		}
		return nil
	})
	// DefaultDenialLimits: a burst of 20, then one a second.
	if limit := 20 + int(elapsed/time.Second) + 1; len(rows) > limit {
		t.Fatalf("%d denials of a flood of %d recorded in %s, want at most %d", len(rows), flood, elapsed, limit)
	}
}

// metricValue reads one sample from the process's /metrics.
func metricValue(t *testing.T, api *rawClient, series string) float64 {
	t.Helper()
	res, err := http.Get(api.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// An owner of two projects sees both, in one query, and still nothing of a third.
func TestAuditOwnerOfTwoProjects(t *testing.T) {
	api := startTenants(t)
	for _, c := range []struct{ caller, proc, body string }{
		{roleAdmin, procCreateProject, `{"name":"team-c"}`},
		{roleAdmin, procBindRole, grantBody("team-c", "SUBJECT_KIND_USER", roleOwner, "project-owner")},
	} {
		if code, body := api.callFull(t, c.caller, c.proc, c.body); code != "" {
			t.Fatalf("%s %s: %s %s", c.caller, c.proc, code, body)
		}
	}
	// The grant reaches the authorizer's mirrors: the owner may bind in team-c.
	testkit.Eventually(t, 10*time.Second, func() error {
		if code := api.call(t, roleOwner, procBindNS, `{"project":"team-c","cluster":"c1","namespace":"web-c"}`); code != "" {
			return fmt.Errorf("owner binding in team-c: %s", code)
		}
		return nil
	})
	if code := api.call(t, roleOther, procBindNS, `{"project":"team-b","cluster":"c1","namespace":"web-b2"}`); code != "" {
		t.Fatalf("other binding in team-b: %s", code)
	}
	rows := waitActivity(t, api, roleOwner, nil, func(rows []activityRow) error {
		seen := map[string]bool{}
		for _, r := range rows {
			seen[r.Project] = true
		}
		if !seen["team-a"] || !seen["team-c"] {
			return fmt.Errorf("owner of team-a and team-c sees projects %v", seen)
		}
		return nil
	})
	for _, r := range rows {
		if r.Project != "team-a" && r.Project != "team-c" {
			t.Fatalf("owner of team-a and team-c got %+v", r)
		}
	}
}
