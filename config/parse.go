package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/receiver"
	"go.yaml.in/yaml/v3"
)

// parser collects every problem of one file instead of stopping at the first.
type parser struct {
	file   string
	lookup Lookup
	errs   []*Error
}

// where locates one pipeline's fields for error messages.
type where struct {
	file  string
	label string         // sources[0] "stripe"
	line  int            // the pipeline's first line
	lines map[string]int // field path -> line
	// commented are plain scalars followed by a comment: " #" inside unquoted SQL (the
	// jsonb operators #> and #>>) starts a YAML comment and silently cuts the statement.
	commented map[string]bool
}

func (w *where) errorf(field, format string, args ...any) error {
	if w == nil {
		return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	return &Error{File: w.file, Line: w.lineOf(field), Pipeline: w.label, Field: field, Msg: fmt.Sprintf(format, args...)}
}

func (w *where) lineOf(field string) int {
	for f := field; f != ""; {
		if l, ok := w.lines[f]; ok {
			return l
		}
		i := strings.LastIndexAny(f, ".[")
		if i < 0 {
			break
		}
		f = f[:i]
	}
	return w.line
}

// fieldAt is the deepest field declared on line, for messages of the YAML decoder that
// only know the line.
func (w *where) fieldAt(line int) string {
	best := ""
	for f, l := range w.lines {
		// Ties are broken by name: map order must not change the message between runs.
		if l == line && (len(f) > len(best) || (len(f) == len(best) && f < best)) {
			best = f
		}
	}
	return best
}

func (p *parser) add(line int, pipeline, field, format string, args ...any) {
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Pipeline: pipeline, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) errf(w *where, field, format string, args ...any) {
	p.add(w.lineOf(field), w.label, field, format, args...)
}

func (p *parser) parse(data []byte) *File {
	f := &File{Path: p.file, locs: map[any]*where{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line, msg := syntaxError(data, err)
		p.add(line, "", "", "not valid YAML: %s", msg)
		return nil
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		p.add(0, "", "", "the file is empty: want sources and/or subscriptions")
		return nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		p.add(root.Line, "", "", "want a mapping with sources and/or subscriptions")
		return nil
	}
	names := map[string]string{}
	paths := map[string]string{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "sources", "subscriptions":
		default:
			p.add(k.Line, "", k.Value, "unknown key (known keys: sources, subscriptions)")
			continue
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			continue
		}
		if v.Kind != yaml.SequenceNode {
			p.add(v.Line, "", k.Value, "want a list of pipelines")
			continue
		}
		for j, el := range v.Content {
			w := &where{file: p.file, label: fmt.Sprintf("%s[%d]", k.Value, j), line: el.Line, lines: map[string]int{}}
			if name := scalarAt(el, "name"); name != "" {
				w.label += fmt.Sprintf(" %q", name)
			}
			if el.Kind != yaml.MappingNode {
				p.add(el.Line, w.label, "", "want a mapping")
				continue
			}
			w.commented = map[string]bool{}
			recordLines(el, "", w)
			if k.Value == "sources" {
				src := &receiver.Source{}
				p.decode(el, src, w)
				p.source(w, src, names, paths)
				f.Sources = append(f.Sources, src)
				f.locs[src] = w
			} else {
				sub := &consumer.Config{}
				p.decode(el, sub, w)
				p.subscription(w, sub, names)
				f.Subscriptions = append(f.Subscriptions, sub)
				f.locs[sub] = w
			}
		}
	}
	if len(f.Sources) == 0 && len(f.Subscriptions) == 0 && len(p.errs) == 0 {
		p.add(root.Line, "", "", "no pipelines: want sources and/or subscriptions")
	}
	return f
}

// decode fills v from n, reporting unknown keys and type errors with their field.
func (p *parser) decode(n *yaml.Node, v any, w *where) {
	p.unknownKeys(n, reflect.TypeOf(v), "", w)
	p.normalize(n, reflect.TypeOf(v), "", w)
	err := n.Decode(v)
	if err == nil {
		return
	}
	te, ok := err.(*yaml.TypeError)
	if !ok {
		p.errf(w, "", "%v", err)
		return
	}
	for _, msg := range te.Errors {
		line := 0
		if _, scanErr := fmt.Sscanf(msg, "line %d:", &line); scanErr == nil {
			msg = strings.TrimSpace(msg[strings.IndexByte(msg, ':')+1:])
		}
		field := w.fieldAt(line)
		p.add(line, w.label, field, "%s", msg)
	}
}

var (
	unmarshaler  = reflect.TypeFor[yaml.Unmarshaler]()
	durationType = reflect.TypeFor[time.Duration]()
	fieldType    = reflect.TypeFor[pipeline.Field]()
)

// normalize rewrites n, in place, into what the decoder takes for t: a duration with days
// ("30d", pipeline.ParseDuration) into Go's syntax, reporting a bad one with its field; a
// single string where a list of strings is wanted ("secrets_env: S") into a list of one; a
// single mapping where a list of them is wanted ("publish: {topic: t}") into a list of one;
// a list where a field is wanted (a composite message_id: [{json: /a}, {json: /b}]) into
// the field's parts.
func (p *parser) normalize(n *yaml.Node, t reflect.Type, path string, w *where) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == fieldType && n.Kind == yaml.SequenceNode:
		parts := *n
		*n = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: n.Line, Column: n.Column, Content: []*yaml.Node{
			{Kind: yaml.ScalarNode, Tag: "!!str", Value: "parts", Line: n.Line, Column: n.Column}, &parts,
		}}
		// A part written as a list in its turn becomes a composite too, which validation
		// then refuses by name, rather than a decoder's type error.
		for i, c := range parts.Content {
			p.normalize(c, t, fmt.Sprintf("%s[%d]", path, i), w)
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		one := *n
		*n = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: n.Line, Column: n.Column, Content: []*yaml.Node{&one}}
		p.normalize(&one, t.Elem(), path, w)
	case t == durationType:
		if n.Kind != yaml.ScalarNode {
			p.errf(w, path, "want a duration such as 30d or 24h")
			n.Kind, n.Tag, n.Value, n.Content = yaml.ScalarNode, "!!str", "0s", nil
			return
		}
		d, err := pipeline.ParseDuration(n.Value)
		switch {
		case err != nil:
			p.errf(w, path, "%v", err)
			d = 0
		case d == 0:
			p.errf(w, path, "must be positive")
		}
		n.Tag, n.Value, n.Style = "!!str", d.String(), 0
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String && n.Kind == yaml.ScalarNode && n.Tag != "!!null":
		one := *n
		*n = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: n.Line, Column: n.Column, Content: []*yaml.Node{&one}}
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			sf := t.Field(i)
			if name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ","); name != "" && name != "-" && sf.IsExported() {
				fields[name] = sf.Type
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if ft, ok := fields[n.Content[i].Value]; ok {
				p.normalize(n.Content[i+1], ft, join(path, n.Content[i].Value), w)
			}
		}
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, c := range n.Content {
			p.normalize(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), w)
		}
	}
}

// unknownKeys reports every mapping key that no yaml tag of t names, recursively.
func (p *parser) unknownKeys(n *yaml.Node, t reflect.Type, path string, w *where) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshaler) {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if t == fieldType && n.Kind == yaml.SequenceNode {
			for i, c := range n.Content { // a composite's parts (normalize)
				p.unknownKeys(c, t, fmt.Sprintf("%s[%d]", path, i), w)
			}
			return
		}
		if n.Kind != yaml.MappingNode {
			return // the decoder reports the type error
		}
		known := map[string]reflect.Type{}
		var names []string
		for i := range t.NumField() {
			sf := t.Field(i)
			name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
			if name == "" || name == "-" || !sf.IsExported() {
				continue
			}
			known[name] = sf.Type
			names = append(names, name)
		}
		sort.Strings(names)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			field := join(path, k.Value)
			ft, ok := known[k.Value]
			if !ok {
				p.add(k.Line, w.label, field, "unknown key (known keys: %s)", strings.Join(names, ", "))
				continue
			}
			p.unknownKeys(v, ft, field, w)
		}
	case reflect.Slice:
		if n.Kind == yaml.MappingNode {
			p.unknownKeys(n, t.Elem(), path, w) // one where a list is wanted (normalize)
			return
		}
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, c := range n.Content {
			p.unknownKeys(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), w)
		}
	}
}

func recordLines(n *yaml.Node, path string, w *where) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			field := join(path, k.Value)
			w.lines[field] = k.Line
			if v.Kind == yaml.ScalarNode && v.Style == 0 && v.LineComment != "" {
				w.commented[field] = true
			}
			recordLines(v, field, w)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			field := fmt.Sprintf("%s[%d]", path, i)
			w.lines[field] = c.Line
			recordLines(c, field, w)
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func scalarAt(n *yaml.Node, key string) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}
