package placement

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
)

// semverLib is the Kubernetes CEL semver library OCM's environment includes
// (k8s.io/apiserver/pkg/cel/library.SemverLib), with its names and
// semantics: semver(s), semver(s, normalize), isSemver(s), isSemver(s,
// normalize), and on a Semver isLessThan, isGreaterThan, compareTo, major,
// minor, patch. Normalizing drops a leading "v", adds missing minor and
// patch numbers and drops leading zeros, so
// semver(managedCluster.status.version.kubernetes, true) reads "v1.31.2".
// It is written here, not imported, because k8s.io/apiserver would pin an
// older cel-go and bring the apiserver's dependency tree for one type.
func semverLib() cel.EnvOption {
	str, b := cel.StringType, cel.BoolType
	return cel.Lib(semverLibrary{
		opts: []cel.EnvOption{
			cel.Function("semver",
				cel.Overload("string_to_semver", []*cel.Type{str}, semverType, cel.UnaryBinding(func(s ref.Val) ref.Val { return toSemver(s, types.False) })),
				cel.Overload("string_bool_to_semver_normalize", []*cel.Type{str, b}, semverType, cel.BinaryBinding(toSemver))),
			cel.Function("isSemver",
				cel.Overload("is_semver_string", []*cel.Type{str}, b, cel.UnaryBinding(func(s ref.Val) ref.Val { return isSemver(s, types.False) })),
				cel.Overload("is_semver_string_bool_normalize", []*cel.Type{str, b}, b, cel.BinaryBinding(isSemver))),
			cel.Function("isGreaterThan", cel.MemberOverload("semver_is_greater_than", []*cel.Type{semverType, semverType}, b,
				cel.BinaryBinding(semverCmp(func(c int) ref.Val { return types.Bool(c > 0) })))),
			cel.Function("isLessThan", cel.MemberOverload("semver_is_less_than", []*cel.Type{semverType, semverType}, b,
				cel.BinaryBinding(semverCmp(func(c int) ref.Val { return types.Bool(c < 0) })))),
			cel.Function("compareTo", cel.MemberOverload("semver_compare_to", []*cel.Type{semverType, semverType}, cel.IntType,
				cel.BinaryBinding(semverCmp(func(c int) ref.Val { return types.Int(c) })))),
			cel.Function("major", cel.MemberOverload("semver_major", []*cel.Type{semverType}, cel.IntType,
				cel.UnaryBinding(semverPart(0)))),
			cel.Function("minor", cel.MemberOverload("semver_minor", []*cel.Type{semverType}, cel.IntType,
				cel.UnaryBinding(semverPart(1)))),
			cel.Function("patch", cel.MemberOverload("semver_patch", []*cel.Type{semverType}, cel.IntType,
				cel.UnaryBinding(semverPart(2)))),
		},
	})
}

type semverLibrary struct{ opts []cel.EnvOption }

func (l semverLibrary) CompileOptions() []cel.EnvOption   { return l.opts }
func (semverLibrary) ProgramOptions() []cel.ProgramOption { return nil }

// semverType is Kubernetes' name for the type, so messages read the same.
var semverType = cel.OpaqueType("kubernetes.Semver")

// semver is a parsed semantic version (semver.org 2.0; build metadata is
// kept out of comparisons, as the spec says).
type semver struct {
	nums [3]uint64
	pre  []string
}

func (v semver) ConvertToNative(t reflect.Type) (any, error) {
	return nil, fmt.Errorf("type conversion error from Semver to %v", t)
}

func (v semver) ConvertToType(t ref.Type) ref.Val {
	if t == semverType {
		return v
	}
	if t == types.TypeType {
		return semverType
	}
	return types.NewErr("type conversion error from %s to %s", semverType, t)
}

func (v semver) Equal(o ref.Val) ref.Val {
	w, ok := o.(semver)
	if !ok {
		return types.MaybeNoSuchOverloadErr(o)
	}
	return types.Bool(compareSemver(v, w) == 0)
}

func (v semver) Type() ref.Type { return semverType }
func (v semver) Value() any     { return v }

func toSemver(s, normalize ref.Val) ref.Val {
	str, ok1 := s.(types.String)
	n, ok2 := normalize.(types.Bool)
	if !ok1 || !ok2 {
		return types.MaybeNoSuchOverloadErr(s)
	}
	v, err := parseSemver(string(str), bool(n))
	if err != nil {
		return types.WrapErr(err)
	}
	return v
}

func isSemver(s, normalize ref.Val) ref.Val {
	str, ok1 := s.(types.String)
	n, ok2 := normalize.(types.Bool)
	if !ok1 || !ok2 {
		return types.MaybeNoSuchOverloadErr(s)
	}
	_, err := parseSemver(string(str), bool(n))
	return types.Bool(err == nil)
}

func semverCmp(result func(int) ref.Val) func(a, b ref.Val) ref.Val {
	return func(a, b ref.Val) ref.Val {
		v, ok1 := a.(semver)
		w, ok2 := b.(semver)
		if !ok1 || !ok2 {
			return types.MaybeNoSuchOverloadErr(b)
		}
		return result(compareSemver(v, w))
	}
}

func semverPart(i int) func(ref.Val) ref.Val {
	return func(a ref.Val) ref.Val {
		v, ok := a.(semver)
		if !ok {
			return types.MaybeNoSuchOverloadErr(a)
		}
		return types.Int(v.nums[i]) //nolint:gosec // parsed from at most 19 digits
	}
}

// parseSemver reads MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]. normalize
// allows a "v" prefix, a missing minor or patch, and leading zeros in them,
// as Kubernetes' semver(s, true) does.
func parseSemver(s string, normalize bool) (semver, error) {
	bad := func(why string) (semver, error) { return semver{}, fmt.Errorf("invalid semver %q: %s", s, why) }
	rest := s
	if normalize {
		rest = strings.TrimPrefix(rest, "v")
	}
	if i := strings.IndexByte(rest, '+'); i >= 0 {
		if !validIdents(rest[i+1:], false) {
			return bad("bad build metadata")
		}
		rest = rest[:i]
	}
	var v semver
	if i := strings.IndexByte(rest, '-'); i >= 0 {
		if !validIdents(rest[i+1:], true) {
			return bad("bad pre-release")
		}
		v.pre = strings.Split(rest[i+1:], ".")
		rest = rest[:i]
	}
	parts := strings.Split(rest, ".")
	if len(parts) > 3 || (!normalize && len(parts) != 3) {
		return bad("want MAJOR.MINOR.PATCH")
	}
	for i, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return bad("version numbers must be digits")
		}
		if !normalize && len(p) > 1 && p[0] == '0' {
			return bad("leading zero")
		}
		n, err := strconv.ParseUint(p, 10, 63)
		if err != nil {
			return bad("version number too large")
		}
		v.nums[i] = n
	}
	return v, nil
}

// validIdents checks dot-separated identifiers of [0-9A-Za-z-]; numeric
// pre-release identifiers must not have leading zeros.
func validIdents(s string, pre bool) bool {
	for _, id := range strings.Split(s, ".") {
		if id == "" || strings.Trim(id, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-") != "" {
			return false
		}
		if pre && len(id) > 1 && id[0] == '0' && strings.Trim(id, "0123456789") == "" {
			return false
		}
	}
	return true
}

// compareSemver orders by the numbers, then a version with a pre-release
// before one without, then the pre-release identifiers in turn (numeric ones
// numerically and before alphanumeric ones), then the shorter list first.
func compareSemver(a, b semver) int {
	for i := range a.nums {
		if a.nums[i] != b.nums[i] {
			if a.nums[i] < b.nums[i] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(a.pre) == 0 && len(b.pre) == 0:
		return 0
	case len(a.pre) == 0:
		return 1
	case len(b.pre) == 0:
		return -1
	}
	for i := 0; i < len(a.pre) && i < len(b.pre); i++ {
		x, y := a.pre[i], b.pre[i]
		xn, xerr := strconv.ParseUint(x, 10, 64)
		yn, yerr := strconv.ParseUint(y, 10, 64)
		switch {
		case xerr == nil && yerr == nil:
			if xn != yn {
				if xn < yn {
					return -1
				}
				return 1
			}
		case xerr == nil:
			return -1
		case yerr == nil:
			return 1
		case x != y:
			return strings.Compare(x, y)
		}
	}
	switch {
	case len(a.pre) < len(b.pre):
		return -1
	case len(a.pre) > len(b.pre):
		return 1
	}
	return 0
}
