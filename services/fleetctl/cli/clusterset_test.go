package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

func TestClusterSetCommands(t *testing.T) {
	h := startHub(t)
	h.run(t, "cluster", "register", "c1", "--label", "env=prod").ok(t)
	h.run(t, "cluster", "register", "c2").ok(t)
	h.run(t, "project", "create", "team-a").ok(t)

	r := h.run(t, "clusterset", "list").ok(t)
	for _, want := range []string{"NAME", "TYPE", "SELECTOR", "MEMBERS", "default", "ExclusiveLabel", "global", "LabelSelector", "<every cluster>"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("list lacks %q:\n%s", want, r.stdout)
		}
	}
	h.run(t, "clusterset", "create", "eu").ok(t)
	r = h.run(t, "clusterset", "create", "prod", "--selector", "env=prod,tier notin (edge)").ok(t)
	if !strings.Contains(r.stdout, "env=prod,tier notin (edge)") {
		t.Errorf("create output:\n%s", r.stdout)
	}
	h.run(t, "clusterset", "create", "bad", "--selector", "env in prod").fails(t, `error: --selector "env in prod": `)
	h.run(t, "clusterset", "create", "eu").fails(t, "error: already_exists: ")
	h.run(t, "cluster", "update", "c2", "--label", "fleetstream.io/clusterset=eu").ok(t)
	testkit.Eventually(t, 5*time.Second, func() error {
		r := h.run(t, "clusterset", "get", "eu").ok(t)
		if !strings.Contains(r.stdout, "members: c2") {
			return errorString("eu's members not shown: " + r.stdout)
		}
		return nil
	})
	r = h.run(t, "clusterset", "get", "prod").ok(t)
	if !strings.Contains(r.stdout, "members: c1") {
		t.Errorf("prod's members:\n%s", r.stdout)
	}
	h.run(t, "clusterset", "delete", "default").fails(t, "error: failed_precondition: ")

	h.run(t, "clusterset", "bind", "eu", "--project", "team-a").ok(t)
	r = h.run(t, "clusterset", "bind", "later", "-p", "team-a").ok(t)
	if !strings.Contains(r.stdout, `cluster set "later" does not exist`) {
		t.Errorf("bind of a missing set says nothing:\n%s", r.stdout)
	}
	h.run(t, "clusterset", "bind", "eu").fails(t, `error: required flag(s) "project" not set`)
	r = h.run(t, "clusterset", "bindings", "-p", "team-a").ok(t)
	for _, want := range []string{"PROJECT", "CLUSTER SET", "SET EXISTS", "team-a", "eu", "true", "later", "false"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("bindings lacks %q:\n%s", want, r.stdout)
		}
	}
	h.run(t, "clusterset", "unbind", "later", "-p", "team-a").ok(t)
	r = h.run(t, "clusterset", "bindings").ok(t)
	if strings.Contains(r.stdout, "later") {
		t.Errorf("unbound binding still listed:\n%s", r.stdout)
	}
	// bob is no admin: he reads sets, changes none, and sees no binding of a project of others.
	h.runAs(t, bobToken, "clusterset", "list").ok(t)
	h.runAs(t, bobToken, "clusterset", "create", "mine").fails(t, "error: permission_denied: ")
	r = h.runAs(t, bobToken, "clusterset", "bindings").ok(t)
	if strings.Contains(r.stdout, "team-a") {
		t.Errorf("bob sees team-a's bindings:\n%s", r.stdout)
	}
	h.run(t, "clusterset", "delete", "prod").ok(t)
	h.run(t, "clusterset", "get", "prod").fails(t, "error: not_found: ")
}

type errorString string

func (e errorString) Error() string { return string(e) }

func TestClusterSetRoleCommands(t *testing.T) {
	h := startHub(t)
	h.run(t, "clusterset", "create", "eu").ok(t)
	h.run(t, "cluster", "register", "c1", "--label", "fleetstream.io/clusterset=eu").ok(t)
	h.run(t, "cluster", "register", "c2").ok(t)

	// bob is no admin: without a role he updates no cluster and grants nothing.
	h.runAs(t, bobToken, "cluster", "update", "c1", "--label", "fleetstream.io/clusterset=eu", "--label", "tier=gold").
		fails(t, "error: permission_denied: ")
	h.runAs(t, bobToken, "clusterset", "role", "bind", "eu", "--user", "bob", "--role", "clusterset-admin").
		fails(t, "error: permission_denied: ")

	r := h.run(t, "clusterset", "role", "bind", "eu", "--user", "bob", "--role", "clusterset-admin").ok(t)
	for _, want := range []string{"CLUSTER SET", "SUBJECT", "ROLE", "eu", "User:bob", "clusterset-admin", "alice"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("bind output lacks %q:\n%s", want, r.stdout)
		}
	}
	h.run(t, "clusterset", "role", "bind", "eu", "--group", "sre", "--role", "clusterset-view").ok(t)
	h.run(t, "clusterset", "role", "bind", "eu", "--user", "bob").fails(t, `error: required flag(s) "role" not set`)
	h.run(t, "clusterset", "role", "bind", "eu", "--user", "bob", "--group", "sre", "--role", "clusterset-view").
		fails(t, "error: give only one of")
	h.run(t, "clusterset", "role", "bind", "eu", "--user", "amy", "--role", "owner").fails(t, "error: invalid_argument: ")

	// Now bob manages eu's clusters, and only those.
	h.runAs(t, bobToken, "cluster", "update", "c1", "--label", "fleetstream.io/clusterset=eu", "--label", "tier=gold").ok(t)
	h.runAs(t, bobToken, "cluster", "update", "c2", "--taint", "gpu=true:NoSelect").fails(t, "error: permission_denied: ")
	// Dropping the set's label would move c1 into default, which is not bob's.
	r = h.runAs(t, bobToken, "cluster", "update", "c1", "--label", "tier=gold")
	r.fails(t, "error: permission_denied: ")
	if !strings.Contains(r.stderr, `cluster set "default"`) {
		t.Errorf("the refusal does not name the set: %s", r.stderr)
	}
	r = h.runAs(t, bobToken, "clusterset", "role", "list").ok(t)
	for _, want := range []string{"User:bob", "Group:sre", "clusterset-view"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("bob's list lacks %q:\n%s", want, r.stdout)
		}
	}
	h.run(t, "clusterset", "role", "unbind", "eu", "--group", "sre", "--role", "clusterset-view").ok(t)
	r = h.run(t, "clusterset", "role", "list", "eu").ok(t)
	if strings.Contains(r.stdout, "sre") {
		t.Errorf("unbound role still listed:\n%s", r.stdout)
	}
	h.run(t, "clusterset", "role", "unbind", "eu", "--user", "bob", "--role", "clusterset-admin").ok(t)
	testkit.Eventually(t, 5*time.Second, func() error {
		if r := h.runAs(t, bobToken, "cluster", "update", "c1", "--label", "fleetstream.io/clusterset=eu"); !strings.Contains(r.stderr, "permission_denied") {
			return errorString("revoked bob still updates c1: " + r.stdout + r.stderr)
		}
		return nil
	})
}
