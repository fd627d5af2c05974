package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/flagcheck/flagchecktest"
	"github.com/fleetstream/fleetstream/services/cluster-agent/hosted"
)

// TestBinaryFlagsReachFleetd: every flag of the binary is hosted.Config's (which fleetd
// registers for the agents it hosts: services/fleetd/cmd/fleetd's TestFlagsOfEveryService) or
// listed below with why fleetd has no use for it. A flag registered here and nowhere else
// fails: fleetd's hosted agents would not get it.
func TestBinaryFlagsReachFleetd(t *testing.T) {
	binaryOnly := map[string]string{
		"cluster":         "an in-cluster agent's own cluster; fleetd hosts many",
		"cluster-id":      "as --cluster",
		"kubeconfig":      "as --cluster; hosted agents use stored credentials",
		"hosted":          "fleetd has --hosted-agents",
		"nats-url":        "fleetd's hosted agents connect in process",
		"nats-token-file": "as --nats-url",
		"log-level":       "fleetd has its own",
		"log-dev":         "fleetd logs for humans always",
	}
	var o options
	flagchecktest.SharedFlags(t, o.RegisterFlags, []func(*flag.FlagSet){new(hosted.Config).RegisterFlags}, binaryOnly)
}

// TestValidate: a bad flag value is refused before the agent starts, with the flag named.
func TestValidate(t *testing.T) {
	flagchecktest.Run(t, func() *options { return new(options) }, []flagchecktest.Case{
		{Args: []string{"--cluster=c1"}, Want: ""},
		{Args: []string{"--hosted", "--nats-token-file=/t"}, Want: ""},
		{Args: []string{"--cluster=c1", "--endpointslices=off"}, Want: ""},
		{Args: nil, Want: "--cluster is required"},
		{Args: []string{"--hosted", "--cluster=c1", "--nats-token-file=/t"}, Want: "--cluster, --cluster-id and --kubeconfig do not apply"},
		{Args: []string{"--hosted"}, Want: "--hosted needs --nats-token-file"},
		{Args: []string{"--cluster=c1", "--heartbeat-interval=-1s"}, Want: "--heartbeat-interval -1s: must not be negative"},
		{Args: []string{"--cluster=c1", "--desired-workers=-2"}, Want: "--desired-workers -2: must not be negative"},
		{Args: []string{"--cluster=c1", "--in-cluster-grace=-1m"}, Want: "--in-cluster-grace -1m0s"},
		{Args: []string{"--cluster=c1", "--nats-url=http://hub:4222"}, Want: `--nats-url "http://hub:4222": scheme "http"`},
		{Args: []string{"--cluster=c1", "--nats-url="}, Want: "--nats-url is required"},
		{Args: []string{"--cluster=c1", "--credentials-allowed-proxies=http://proxy:3128"}, Want: "--credentials-allowed-proxies"},
	})
}

// TestEndpointSlicesFlag: --endpointslices parses into the member config (off is none) and a
// malformed filter is refused as the flag is parsed.
func TestEndpointSlicesFlag(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"", "all"}, {"off", "off"}, {"label=mesh", "label=mesh"}, {"annotation=a=b", "annotation=a=b"},
	} {
		var o options
		fs := flag.NewFlagSet("cluster-agent", flag.ContinueOnError)
		o.RegisterFlags(fs)
		args := []string{"--cluster=c1"}
		if tc.arg != "" {
			args = append(args, "--endpointslices="+tc.arg)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		got := "off"
		if f := o.agents.Member.EndpointSlices; f != nil {
			got = f.String()
		}
		if got != tc.want {
			t.Errorf("--endpointslices=%s: filter %s, want %s", tc.arg, got, tc.want)
		}
	}
	var o options
	fs := flag.NewFlagSet("cluster-agent", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	o.RegisterFlags(fs)
	if err := fs.Parse([]string{"--endpointslices=label="}); err == nil || !strings.Contains(err.Error(), "-endpointslices") {
		t.Errorf("--endpointslices=label= parsed: %v", err)
	}
}
