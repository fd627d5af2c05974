package rbacsync

import "github.com/fleetstream/fleetstream/pkg/subjects"

// appliedPrefix is where agents report on rbac-sync's desired keys in bucket `applied`: the
// status of desired key k is at appliedPrefix+k.
var appliedPrefix = subjects.AppliedKey(subjects.DesiredRBACBucket, "")
