package testkit

import (
	"testing"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// ViewGrants fails t for every right service lacks, under the auth callout's table
// (pkg/natsauth), to run the views ps: read its stream, create, write and read each bucket, and
// dead-letter poison events. A view declared in a service's view.Set without its grant in
// permissions.go would stall in a deployment with the callout; this finds it in a unit test.
func ViewGrants(t testing.TB, service string, ps []view.Projection) {
	t.Helper()
	perms, ok := natsauth.ServicePermissions(service)
	if !ok {
		t.Fatalf("no permissions for service %s", service)
	}
	for _, p := range ps {
		kv := "KV_" + p.Bucket.Bucket
		for _, subject := range []string{
			"$JS.API.CONSUMER.CREATE." + p.Stream,
			"$JS.API.STREAM.INFO." + p.Stream,
			"$JS.API.STREAM.CREATE." + kv,
			"$JS.API.STREAM.UPDATE." + kv,
			"$JS.API.STREAM.INFO." + kv,
			"$JS.API.CONSUMER.CREATE." + kv,
			"$JS.API.DIRECT.GET." + kv,
			"$KV." + p.Bucket.Bucket + ".some-key",
			topology.DeadLetterSubjectPrefix + "." + p.Stream + ".view-" + p.Name,
		} {
			if !perms.Allows(subject, false) {
				t.Errorf("%s may not publish %s, needed by its view %s (bucket %s)", service, subject, p.Name, p.Bucket.Bucket)
			}
		}
	}
}
