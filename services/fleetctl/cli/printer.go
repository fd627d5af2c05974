package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// Output formats accepted by -o.
const (
	formatJSON  = "json"
	formatYAML  = "yaml"
	formatTable = "table"
)

// Column is one table column: a header and how to render a message's cell.
type Column struct {
	Header string
	Value  func(proto.Message) string
}

// Col builds a Column for messages of type T. The printer is handed the messages the columns
// were built for; any other type is a programming error and panics.
func Col[T proto.Message](header string, value func(T) string) Column {
	return Column{Header: header, Value: func(m proto.Message) string { return value(m.(T)) }}
}

// ColumnsOf lifts columns of U to columns of T through get, e.g. cluster columns onto watch
// events or register responses.
func ColumnsOf[T, U proto.Message](get func(T) U, cols ...Column) []Column {
	out := make([]Column, len(cols))
	for i, c := range cols {
		out[i] = Column{Header: c.Header, Value: func(m proto.Message) string { return c.Value(get(m.(T))) }}
	}
	return out
}

// Messages converts a typed slice, as found in list responses, for PrintList.
func Messages[T proto.Message](items []T) []proto.Message {
	out := make([]proto.Message, len(items))
	for i, m := range items {
		out[i] = m
	}
	return out
}

// Printer renders API messages in the --output format: JSON and YAML show the whole message as
// protojson encodes it (so field names match the API docs), tables show the given columns.
type Printer struct {
	Format string
	Out    io.Writer
	// ErrOut receives notes for humans that must not pollute machine-readable output.
	ErrOut io.Writer
}

// Print writes one message.
func (p *Printer) Print(obj proto.Message, cols ...Column) error {
	switch p.Format {
	case formatJSON, formatYAML:
		data, err := marshalJSON(obj)
		if err != nil {
			return err
		}
		return p.writeDoc(data)
	default:
		return writeTable(p.Out, []proto.Message{obj}, cols)
	}
}

// PrintList writes a list: a JSON array or YAML sequence of the items, or a table with one row
// per item. Lists are printed as bare arrays rather than as the response message so that
// `-o json | jq '.[]'` works the same for every resource.
func (p *Printer) PrintList(items []proto.Message, cols ...Column) error {
	switch p.Format {
	case formatJSON, formatYAML:
		raw := make([]json.RawMessage, len(items))
		for i, m := range items {
			data, err := marshalJSON(m)
			if err != nil {
				return err
			}
			raw[i] = data
		}
		data, err := json.Marshal(raw)
		if err != nil {
			return fmt.Errorf("encode list: %w", err)
		}
		return p.writeDoc(data)
	default:
		if len(items) == 0 {
			// On stderr, like kubectl, so that a script reading the table sees no rows.
			fmt.Fprintln(p.ErrOut, "No resources found.")
			return nil
		}
		return writeTable(p.Out, items, cols)
	}
}

// Note writes a line for humans: to stdout with tables, to stderr with JSON or YAML so the
// output stays parseable.
func (p *Printer) Note(format string, args ...any) {
	w := p.Out
	if p.Format != formatTable {
		w = p.ErrOut
	}
	fmt.Fprintf(w, format+"\n", args...)
}

// PrintOrNote reports what a command did (deleted, unbound, revoked): with JSON or YAML the
// whole response, so a script sees what the server answered; with a table only the note.
func (p *Printer) PrintOrNote(resp proto.Message, format string, args ...any) error {
	if p.Format != formatTable {
		return p.Print(resp)
	}
	p.Note(format, args...)
	return nil
}

// writeDoc writes a JSON document indented, or converted to YAML.
func (p *Printer) writeDoc(data []byte) error {
	var out []byte
	if p.Format == formatYAML {
		y, err := yaml.JSONToYAML(data)
		if err != nil {
			return fmt.Errorf("convert to yaml: %w", err)
		}
		out = y
	} else {
		var buf bytes.Buffer
		if err := json.Indent(&buf, data, "", "  "); err != nil {
			return fmt.Errorf("indent json: %w", err)
		}
		buf.WriteByte('\n')
		out = buf.Bytes()
	}
	_, err := p.Out.Write(out)
	return err
}

// Stream returns a printer for a sequence of messages that arrive over time (watch): tables
// print the header once, JSON is one compact object per line, YAML one document per event.
func (p *Printer) Stream(cols ...Column) *StreamPrinter {
	return &StreamPrinter{p: p, cols: cols}
}

// StreamPrinter prints messages one at a time; see Printer.Stream.
type StreamPrinter struct {
	p          *Printer
	cols       []Column
	headerDone bool
	docs       int
}

// Print writes one message immediately.
func (s *StreamPrinter) Print(obj proto.Message) error {
	switch s.p.Format {
	case formatJSON:
		data, err := marshalJSON(obj)
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, data); err != nil {
			return fmt.Errorf("compact json: %w", err)
		}
		buf.WriteByte('\n')
		_, err = s.p.Out.Write(buf.Bytes())
		return err
	case formatYAML:
		if s.docs > 0 {
			if _, err := io.WriteString(s.p.Out, "---\n"); err != nil {
				return err
			}
		}
		s.docs++
		data, err := marshalJSON(obj)
		if err != nil {
			return err
		}
		return s.p.writeDoc(data)
	default:
		// Column widths cannot be known ahead of future rows; a generous minimum width keeps
		// typical rows aligned with the header.
		tw := tabwriter.NewWriter(s.p.Out, 12, 0, 3, ' ', 0)
		if !s.headerDone {
			writeRow(tw, headers(s.cols))
			s.headerDone = true
		}
		writeRow(tw, cells(obj, s.cols))
		return tw.Flush()
	}
}

func marshalJSON(m proto.Message) ([]byte, error) {
	data, err := protojson.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return data, nil
}

func writeTable(w io.Writer, items []proto.Message, cols []Column) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	writeRow(tw, headers(cols))
	for _, m := range items {
		writeRow(tw, cells(m, cols))
	}
	return tw.Flush()
}

func headers(cols []Column) []string {
	h := make([]string, len(cols))
	for i, c := range cols {
		h[i] = c.Header
	}
	return h
}

func cells(m proto.Message, cols []Column) []string {
	row := make([]string, len(cols))
	for i, c := range cols {
		v := c.Value(m)
		// An empty cell would shift the columns of `awk '{print $3}'`; tabs and newlines
		// would break the table.
		if v == "" {
			v = "-"
		}
		row[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(v)
	}
	return row
}

func writeRow(w io.Writer, cells []string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// age renders the time since t the way kubectl does: 5s, 3m, 2h, 4d.
func age(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
}

// tableListMax is how many items a table cell lists before it counts the rest, as kubectl does
// for an Endpoints' addresses: a service served by 10,000 clusters is one readable row, and
// -o json or yaml still carries every name.
const tableListMax = 3

// listCell renders items as a table cell: "a,b,c" or, past tableListMax, "a,b,c + 9997 more...".
func listCell(items []string) string {
	if len(items) <= tableListMax {
		return strings.Join(items, ",")
	}
	return fmt.Sprintf("%s + %d more...", strings.Join(items[:tableListMax], ","), len(items)-tableListMax)
}
