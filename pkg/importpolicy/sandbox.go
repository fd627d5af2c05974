package importpolicy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
	"unsafe"

	"github.com/Masterminds/sprig/v3"
)

// Limits bound one render. Templates come from whoever may write a policy and data from
// whatever the source cluster holds, so every render must end quickly with a bounded footprint
// whatever the template does.
type Limits struct {
	// Timeout bounds the wall time of one template's execution.
	Timeout time.Duration
	// MaxOutputBytes bounds what one template writes.
	MaxOutputBytes int
	// MaxSteps bounds range iterations plus function calls: it stops loops that produce no
	// output before the clock would (and makes the bound independent of machine load).
	MaxSteps int
	// MaxValueBytes bounds the (estimated) size of any function argument or result, so no
	// single call can build a huge value out of small inputs.
	MaxValueBytes int
	// MaxAllocBytes bounds the bytes of all strings that function calls of one execution return.
	MaxAllocBytes int
	// MaxObjectBytes bounds the JSON of the source object and of each reference.
	MaxObjectBytes int
}

// DefaultLimits are the bounds (100 ms, 64 KiB); the object bound is above the
// 1.5 MiB etcd keeps per object, so any Kubernetes object fits.
func DefaultLimits() Limits {
	return Limits{
		Timeout:        100 * time.Millisecond,
		MaxOutputBytes: 64 << 10,
		MaxSteps:       100_000,
		MaxValueBytes:  4 << 20,
		MaxAllocBytes:  32 << 20,
		MaxObjectBytes: 2 << 20,
	}
}

// Render failures the caller tells apart (they become the RenderTimeout and RenderTooLarge
// reasons of a lifecycle). Test with errors.Is.
var (
	ErrRenderTimeout  = errors.New("render took too long")
	ErrRenderTooLarge = errors.New("render too large")
)

// RemovedFunctions returns the sprig functions a policy template cannot call, each with the
// reason it is gone. They are absent at parse time, so a policy that names one is rejected when
// it is written, not when it first runs.
func RemovedFunctions() map[string]string {
	return map[string]string{
		// Read the controller's environment, files or network: a policy author must not learn
		// the hub's secrets (Clusterpedia exposes env) nor make the hub resolve names.
		"env":           "reads the process environment",
		"expandenv":     "reads the process environment",
		"getHostByName": "queries DNS",
		// Not hermetic: their result changes from one render to the next, so every re-render
		// would look like a changed cluster and push an update (or flap a creation condition).
		"now": "depends on the clock", "ago": "depends on the clock", "date": "depends on the local time zone",
		"dateInZone": "depends on the clock", "date_in_zone": "depends on the clock",
		"dateModify": "depends on the clock", "date_modify": "depends on the clock",
		"htmlDate": "depends on the local time zone", "htmlDateInZone": "depends on the clock",
		"toDate": "depends on the local time zone", "mustToDate": "depends on the local time zone",
		"randAlphaNum": "random", "randAlpha": "random", "randAscii": "random", "randNumeric": "random",
		"randBytes": "random", "randInt": "random", "uuidv4": "random", "shuffle": "random",
		"encryptAES": "random",
		// Random and CPU-heavy (RSA keys, bcrypt, scrypt): one call can outlast the time bound,
		// and a call cannot be interrupted.
		"genPrivateKey": "CPU-heavy and random", "genCA": "CPU-heavy and random", "genCAWithKey": "CPU-heavy and random",
		"genSelfSignedCert": "CPU-heavy and random", "genSelfSignedCertWithKey": "CPU-heavy and random",
		"genSignedCert": "CPU-heavy and random", "genSignedCertWithKey": "CPU-heavy and random",
		"bcrypt": "CPU-heavy and random", "htpasswd": "CPU-heavy and random", "derivePassword": "CPU-heavy",
	}
}

// stepFunc is the name of the hidden function inserted at the top of every range body so
// that each iteration, even one that calls nothing and prints nothing, counts a step.
const stepFunc = "importpolicyStep__"

// maxCount bounds functions whose cost is proportional to a numeric argument (until, seq,
// repeat counts, indent widths, printf widths).
const maxCount = 10_000

// maxUniq bounds the list uniq deduplicates (its cost is quadratic).
const maxUniq = 1000

// budget is the per-execution state every wrapped function checks.
type budget struct {
	ctx      context.Context
	deadline time.Time
	limits   Limits
	steps    int
	alloc    int
	err      error // first limit hit; sticky so a template cannot swallow it
}

func (b *budget) step() error {
	if b.err != nil {
		return b.err
	}
	b.steps++
	switch {
	case b.steps > b.limits.MaxSteps:
		b.err = fmt.Errorf("%w: more than %d steps", ErrRenderTimeout, b.limits.MaxSteps)
	case b.ctx.Err() != nil:
		b.err = fmt.Errorf("%w: %w", ErrRenderTimeout, b.ctx.Err())
	case b.steps%8 == 0 && time.Now().After(b.deadline):
		b.err = fmt.Errorf("%w: over %v", ErrRenderTimeout, b.limits.Timeout)
	}
	return b.err
}

func (b *budget) tooLarge(format string, args ...any) error {
	if b.err == nil {
		b.err = fmt.Errorf("%w: %s", ErrRenderTooLarge, fmt.Sprintf(format, args...))
	}
	return b.err
}

// limitedWriter fails the execution once the output passes the bound; text/template stops at
// the first write error.
type limitedWriter struct {
	buf bytes.Buffer
	b   *budget
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if w.buf.Len()+len(p) > w.b.limits.MaxOutputBytes {
		return 0, w.b.tooLarge("output over %d bytes", w.b.limits.MaxOutputBytes)
	}
	if err := w.b.step(); err != nil {
		return 0, err
	}
	return w.buf.Write(p)
}

// baseFuncs is sprig's text (not HTML) function map minus removedFuncs, with the functions whose
// cost a numeric argument controls replaced by bounded versions. The overridden builtins
// (print, printf, println, html, js, urlquery) are wrapped like every other function so that
// their results count against the budget.
func baseFuncs() template.FuncMap {
	fm := sprig.TxtFuncMap()
	for name := range RemovedFunctions() {
		delete(fm, name)
	}
	// uniq compares every element with every kept one: quadratic, so bound the list.
	for _, name := range []string{"uniq", "mustUniq"} {
		f := reflect.ValueOf(fm[name])
		fm[name] = func(list any) (any, error) {
			if v := reflect.ValueOf(list); (v.Kind() == reflect.Slice || v.Kind() == reflect.Array) && v.Len() > maxUniq {
				return nil, fmt.Errorf("%s: at most %d elements", name, maxUniq)
			}
			out := f.Call([]reflect.Value{reflect.ValueOf(&list).Elem()})
			if len(out) == 2 && !out[1].IsNil() {
				return nil, out[1].Interface().(error)
			}
			return out[0].Interface(), nil
		}
	}
	// set and merge store into a map in place. A map stored inside itself is a cycle, and
	// printing or deep-copying a cyclic value recurses until the Go stack overflows, which
	// kills the process (no recover): refuse any store that would close a cycle.
	baseSet := fm["set"].(func(map[string]any, string, any) map[string]any)
	fm["set"] = func(d map[string]any, key string, v any) (map[string]any, error) {
		if reaches(v, d) {
			return nil, errors.New("set: would store a map inside itself")
		}
		return baseSet(d, key, v), nil
	}
	for _, name := range []string{"merge", "mergeOverwrite", "mustMerge", "mustMergeOverwrite"} {
		f := reflect.ValueOf(fm[name])
		fm[name] = func(dst map[string]any, srcs ...map[string]any) (any, error) {
			args := []reflect.Value{reflect.ValueOf(dst)}
			for _, src := range srcs {
				if reaches(src, dst) {
					return nil, fmt.Errorf("%s: would store a map inside itself", name)
				}
				args = append(args, reflect.ValueOf(src))
			}
			out := f.Call(args)
			if len(out) == 2 && !out[1].IsNil() {
				return nil, out[1].Interface().(error)
			}
			return out[0].Interface(), nil
		}
	}
	base := fm["until"].(func(int) []int)
	fm["until"] = func(n int) ([]int, error) {
		if n > maxCount || n < -maxCount {
			return nil, fmt.Errorf("until %d: at most %d elements", n, maxCount)
		}
		return base(n), nil
	}
	baseStep := fm["untilStep"].(func(int, int, int) []int)
	fm["untilStep"] = func(start, stop, step int) ([]int, error) {
		if n := span(start, stop, step); n > maxCount {
			return nil, fmt.Errorf("untilStep: at most %d elements", maxCount)
		}
		return baseStep(start, stop, step), nil
	}
	baseSeq := fm["seq"].(func(...int) string)
	fm["seq"] = func(p ...int) (string, error) {
		var n int
		switch len(p) {
		case 1:
			n = span(1, p[0], 1)
		case 2:
			n = span(p[0], p[1], 1)
		case 3:
			n = span(p[0], p[2], p[1])
		}
		if n > maxCount {
			return "", fmt.Errorf("seq: at most %d elements", maxCount)
		}
		return baseSeq(p...), nil
	}
	fm["repeat"] = func(count int, s string) (string, error) {
		if count < 0 || count > maxCount || count*len(s) > 1<<20 {
			return "", fmt.Errorf("repeat %d: too many copies", count)
		}
		return strings.Repeat(s, count), nil
	}
	for _, name := range []string{"indent", "nindent"} {
		f := fm[name].(func(int, string) string)
		fm[name] = func(n int, s string) (string, error) {
			if n < 0 || n > 256 {
				return "", fmt.Errorf("%s %d: at most 256", name, n)
			}
			return f(n, s), nil
		}
	}
	baseWrapWith := fm["wrapWith"].(func(int, string, string) string)
	fm["wrapWith"] = func(n int, sep, s string) (string, error) {
		if n < 1 || (len(s)/n+1)*len(sep) > 1<<20 {
			return "", errors.New("wrapWith: result too large")
		}
		return baseWrapWith(n, sep, s), nil
	}
	// Replacing the empty string or an empty-matching pattern inserts the replacement at
	// every position: bound the product before computing it.
	baseReplace := fm["replace"].(func(string, string, string) string)
	fm["replace"] = func(old, new, src string) (string, error) {
		if len(src)+(len(src)+1)*len(new) > 1<<22 {
			return "", errors.New("replace: result could exceed 4 MiB")
		}
		return baseReplace(old, new, src), nil
	}
	for _, name := range []string{"regexReplaceAll", "regexReplaceAllLiteral"} {
		f := fm[name].(func(string, string, string) string)
		fm[name] = func(re, src, repl string) (string, error) {
			if len(src)+(len(src)+1)*len(repl) > 1<<22 {
				return "", fmt.Errorf("%s: result could exceed 4 MiB", name)
			}
			return f(re, src, repl), nil
		}
	}
	for _, name := range []string{"mustRegexReplaceAll", "mustRegexReplaceAllLiteral"} {
		f := fm[name].(func(string, string, string) (string, error))
		fm[name] = func(re, src, repl string) (string, error) {
			if len(src)+(len(src)+1)*len(repl) > 1<<22 {
				return "", fmt.Errorf("%s: result could exceed 4 MiB", name)
			}
			return f(re, src, repl)
		}
	}
	fm["print"] = fmt.Sprint
	fm["println"] = fmt.Sprintln
	fm["printf"] = func(format string, args ...any) (string, error) {
		if err := checkFormat(format); err != nil {
			return "", err
		}
		return fmt.Sprintf(format, args...), nil
	}
	fm["html"] = template.HTMLEscaper
	fm["js"] = template.JSEscaper
	fm["urlquery"] = template.URLQueryEscaper
	fm[stepFunc] = func() string { return "" }
	return fm
}

// reaches reports whether target is v or inside it. Each map and list is visited once (values
// may share parts); a walk too long to finish counts as reaching, to fail safe.
func reaches(v any, target map[string]any) bool {
	if target == nil {
		return false
	}
	want := reflect.ValueOf(target).UnsafePointer()
	seen := map[unsafe.Pointer]bool{}
	budget := 100_000
	var walk func(v any) bool
	walk = func(v any) bool {
		if budget--; budget < 0 {
			return true
		}
		rv := reflect.ValueOf(v)
		switch rv.Kind() {
		case reflect.Map:
			p := rv.UnsafePointer()
			if p == want {
				return true
			}
			if seen[p] {
				return false
			}
			seen[p] = true
			it := rv.MapRange()
			for it.Next() {
				if walk(it.Value().Interface()) {
					return true
				}
			}
		case reflect.Slice, reflect.Array:
			for i := 0; i < rv.Len(); i++ {
				if walk(rv.Index(i).Interface()) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// span is how many elements a loop from start to stop by step has (an upper bound).
func span(start, stop, step int) int {
	if step == 0 {
		return 0
	}
	d := stop - start
	if (d > 0) != (step > 0) {
		return 0
	}
	if d < 0 {
		d, step = -d, -step
	}
	return d/step + 1
}

// checkFormat refuses printf widths and precisions that make fmt allocate without bound
// ("%999999999d" allocates a gigabyte before any check could run): no "*" and no number of
// five digits or more inside a verb.
func checkFormat(format string) error {
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		digits := 0
		for i++; i < len(format) && strings.IndexByte("+-# 0123456789.[]*", format[i]) >= 0; i++ {
			switch c := format[i]; {
			case c == '*':
				return errors.New("printf: * widths are not allowed")
			case c >= '0' && c <= '9':
				digits++
				if digits > 4 {
					return errors.New("printf: widths and precisions above 9999 are not allowed")
				}
			default:
				digits = 0
			}
		}
	}
	return nil
}

// wrapFuncs returns fm with every function wrapped: before the call a step is counted and the
// arguments' size checked, after it the result's size is checked and counted. Functions that
// cannot return an error report a limit by panicking; text/template turns a panic in a called
// function into an execution error, and b.err keeps the cause.
func wrapFuncs(fm template.FuncMap, b *budget) template.FuncMap {
	out := make(template.FuncMap, len(fm))
	for name, f := range fm {
		if name == stepFunc {
			out[name] = func() (string, error) { return "", b.step() }
			continue
		}
		fv := reflect.ValueOf(f)
		ft := fv.Type()
		out[name] = reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
			if err := b.step(); err != nil {
				panic(err)
			}
			size := 0
			for _, a := range args {
				size += sizeOf(a, b.limits.MaxValueBytes+1-size)
				if size > b.limits.MaxValueBytes {
					panic(b.tooLarge("arguments of %s over %d bytes", name, b.limits.MaxValueBytes))
				}
			}
			var res []reflect.Value
			if ft.IsVariadic() {
				res = fv.CallSlice(args)
			} else {
				res = fv.Call(args)
			}
			if len(res) > 0 {
				n := sizeOf(res[0], b.limits.MaxValueBytes+1)
				if n > b.limits.MaxValueBytes {
					panic(b.tooLarge("result of %s over %d bytes", name, b.limits.MaxValueBytes))
				}
				if k := res[0].Kind(); k == reflect.String || k == reflect.Slice {
					b.alloc += n
					if b.alloc > b.limits.MaxAllocBytes {
						panic(b.tooLarge("functions returned over %d bytes in all", b.limits.MaxAllocBytes))
					}
				}
			}
			return res
		}).Interface()
	}
	return out
}

// sizeOf estimates the bytes v holds, counting shared values each time they are reached (so
// a list holding one big string many times counts as big: printing it would be). It stops
// once the count passes limit.
func sizeOf(v reflect.Value, limit int) int {
	if !v.IsValid() {
		return 0
	}
	switch v.Kind() {
	case reflect.String:
		return len(v.String())
	case reflect.Interface, reflect.Pointer:
		if v.IsNil() {
			return 8
		}
		return 8 + sizeOf(v.Elem(), limit-8)
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
			return v.Len()
		}
		n := 24
		for i := 0; i < v.Len() && n <= limit; i++ {
			n += sizeOf(v.Index(i), limit-n)
		}
		return n
	case reflect.Map:
		n := 48
		it := v.MapRange()
		for it.Next() && n <= limit {
			n += sizeOf(it.Key(), limit-n)
			n += sizeOf(it.Value(), limit-n)
		}
		return n
	case reflect.Struct:
		n := 0
		for i := 0; i < v.NumField() && n <= limit; i++ {
			n += sizeOf(v.Field(i), limit-n)
		}
		return n
	}
	return 8
}

// compiled is a parsed, checked template ready to execute many times, concurrently.
type compiled struct {
	field string
	tree  *parse.Tree
	refs  refUse
	// funcs are the functions the template calls: only these are wrapped per execution
	// (wrapping all of sprig's for each render cost more than the render).
	funcs []string
}

// compile parses text as the template of field. The template is named after the field, so
// parse and execution errors carry the field path and the line and column.
func compile(field, text string, funcs template.FuncMap) (*compiled, error) {
	t, err := template.New(field).Funcs(funcs).Option("missingkey=default").Parse(text)
	if err != nil {
		return nil, fieldErr(field, ReasonInvalidTemplate, "%s", cleanTemplateErr(field, err))
	}
	// Named templates would allow recursion ({{define}} calling itself), whose depth and
	// fan-out no step count bounds before the Go stack grows huge; policies do not need them.
	if len(t.Templates()) > 1 {
		return nil, fieldErr(field, ReasonInvalidTemplate, "{{define}} and {{block}} are not supported")
	}
	if t.Tree == nil || t.Tree.Root == nil {
		return nil, fieldErr(field, ReasonInvalidTemplate, "empty template")
	}
	step, err := parse.Parse("step", "{{"+stepFunc+"}}", "{{", "}}", map[string]any{stepFunc: true})
	if err != nil {
		return nil, fmt.Errorf("parse the step action: %w", err)
	}
	var walkErr string
	use := refUse{keys: map[string]bool{}, funcs: map[string]bool{stepFunc: true}}
	walk(t.Tree.Root, step["step"].Root.Nodes[0], &use, &walkErr)
	if walkErr != "" {
		return nil, fieldErr(field, ReasonInvalidTemplate, "%s", walkErr)
	}
	c := &compiled{field: field, tree: t.Tree, refs: use}
	for name := range use.funcs {
		if _, ok := funcs[name]; ok {
			c.funcs = append(c.funcs, name)
		}
	}
	return c, nil
}

// walk inserts the step action at the top of every range body, rejects {{template}}, and
// records which references the template reads.
func walk(n parse.Node, step parse.Node, use *refUse, errMsg *string) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			walk(c, step, use, errMsg)
		}
	case *parse.ActionNode:
		walk(n.Pipe, step, use, errMsg)
	case *parse.PipeNode:
		if n == nil {
			return
		}
		for _, c := range n.Cmds {
			walk(c, step, use, errMsg)
		}
	case *parse.IdentifierNode:
		use.funcs[n.Ident] = true
	case *parse.CommandNode:
		if id, ok := n.Args[0].(*parse.IdentifierNode); ok {
			use.funcs[id.Ident] = true
		}
		for i, a := range n.Args {
			// index .references "key" (or $.references) reads one reference by name.
			if id, ok := a.(*parse.IdentifierNode); ok && id.Ident == "index" && i == 0 && len(n.Args) >= 3 {
				if isRefsRoot(n.Args[1]) {
					if s, ok := n.Args[2].(*parse.StringNode); ok {
						use.keys[s.Text] = true
						for _, rest := range n.Args[3:] {
							walk(rest, step, use, errMsg)
						}
						return
					}
				}
			}
		}
		for _, a := range n.Args {
			walk(a, step, use, errMsg)
		}
	case *parse.FieldNode:
		use.add(n.Ident)
	case *parse.VariableNode:
		if len(n.Ident) > 0 && n.Ident[0] == "$" {
			use.add(n.Ident[1:])
		}
	case *parse.ChainNode:
		walk(n.Node, step, use, errMsg)
	case *parse.IfNode:
		walk(n.Pipe, step, use, errMsg)
		walk(n.List, step, use, errMsg)
		walk(n.ElseList, step, use, errMsg)
	case *parse.WithNode:
		walk(n.Pipe, step, use, errMsg)
		walk(n.List, step, use, errMsg)
		walk(n.ElseList, step, use, errMsg)
	case *parse.RangeNode:
		walk(n.Pipe, step, use, errMsg)
		walk(n.List, step, use, errMsg)
		walk(n.ElseList, step, use, errMsg)
		n.List.Nodes = append([]parse.Node{step.Copy()}, n.List.Nodes...)
	case *parse.TemplateNode:
		*errMsg = "{{template}} is not supported"
	}
}

func isRefsRoot(n parse.Node) bool {
	switch n := n.(type) {
	case *parse.FieldNode:
		return len(n.Ident) == 1 && n.Ident[0] == "references"
	case *parse.VariableNode:
		return len(n.Ident) == 2 && n.Ident[0] == "$" && n.Ident[1] == "references"
	}
	return false
}

// refUse is what a template reads of .references (named keys, or the whole map: dynamic)
// and the functions it names.
type refUse struct {
	keys    map[string]bool
	dynamic bool
	funcs   map[string]bool
}

func (u *refUse) add(ident []string) {
	if len(ident) == 0 || ident[0] != "references" {
		return
	}
	if len(ident) == 1 {
		u.dynamic = true
		return
	}
	u.keys[ident[1]] = true
}

// execute runs c over data within the limits. The data is deep-copied first: sprig's set,
// unset and merge mutate maps, and one template must not change what the next one sees.
func execute(ctx context.Context, c *compiled, data map[string]any, funcs template.FuncMap, limits Limits) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, limits.Timeout)
	defer cancel()
	b := &budget{ctx: ctx, limits: limits}
	b.deadline, _ = ctx.Deadline()
	used := make(template.FuncMap, len(c.funcs))
	for _, name := range c.funcs {
		used[name] = funcs[name]
	}
	t, err := template.New(c.field).Funcs(wrapFuncs(used, b)).Option("missingkey=default").AddParseTree(c.field, c.tree)
	if err != nil {
		return "", fmt.Errorf("%s: %w", c.field, err)
	}
	w := &limitedWriter{b: b}
	err = t.Execute(w, deepCopy(data))
	if b.err == nil && err == nil && time.Now().After(b.deadline) {
		b.err = fmt.Errorf("%w: over %v", ErrRenderTimeout, limits.Timeout)
	}
	if b.err != nil {
		return "", b.err
	}
	if err != nil {
		return "", errors.New(cleanTemplateErr(c.field, err))
	}
	// As Clusterpedia: a missing map key prints "<no value>", which means empty.
	return strings.ReplaceAll(w.buf.String(), "<no value>", ""), nil
}

// cleanTemplateErr drops text/template's "template: <name>:" prefix (the field path is
// reported apart) and keeps "line:col: message".
func cleanTemplateErr(field string, err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "template: ")
	msg = strings.TrimPrefix(msg, field+":")
	msg = strings.ReplaceAll(msg, fmt.Sprintf("executing %q ", field), "")
	return msg
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, e := range v {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}
