package admin

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/idemd/idemd/receiver"
)

// The OpenAPI 3.1 documents: the admin API's, served as is, and the receiver's public
// contract, whose paths are those of the configured sources.
//
//go:embed openapi/admin.yaml openapi/receiver.yaml
var openapiFS embed.FS

// AdminDocument is the admin API's OpenAPI document.
func AdminDocument() []byte {
	b, _ := openapiFS.ReadFile("openapi/admin.yaml")
	return b
}

// ReceiverDocument renders the receiver's OpenAPI document for routes: one path per source
// path, with the operations of its kind (webhook, API request; on {path}/{key} the PUT of an
// API request with the key in the URL, and the key lookup and the delete when the source
// serves them), and the source's name and scheme in its summary. Each operation is the
// template's path item's, copied, with an operationId of its own (the template's, then
// "_" and the source's name) and the security of its source's scheme: bearer, none, or a
// signature scheme of its own that names the header its scheme reads, the other headers
// the signature covers (a timestamp, an id) as required header parameters.
func ReceiverDocument(routes []receiver.Route) ([]byte, error) {
	b, _ := openapiFS.ReadFile("openapi/receiver.yaml")
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("the embedded receiver document does not parse: %w", err)
	}
	root := doc.Content[0]
	components := child(root, "components")
	items := child(components, "pathItems")
	schemes := child(components, "securitySchemes")
	// The template's generic signature scheme lists every scheme's header; each source
	// gets its own below.
	deleteKey(schemes, "signature")
	paths := &yaml.Node{Kind: yaml.MappingNode}
	var order []string
	byPath := map[string][]receiver.Route{}
	for _, r := range routes {
		if byPath[r.Path] == nil {
			order = append(order, r.Path)
		}
		byPath[r.Path] = append(byPath[r.Path], r)
	}
	for _, path := range order {
		rs := byPath[path]
		summary := fmt.Sprintf("Source %s (verify.scheme %s)", rs[0].Source, rs[0].Scheme)
		if rs[0].API && rs[0].KeyRequired {
			summary += "; Idempotency-Key required"
		}
		item := &yaml.Node{Kind: yaml.MappingNode}
		item.Content = append(item.Content, scalar("summary"), scalar(summary))
		for _, r := range rs {
			method := strings.ToLower(r.Method)
			tmpl := child(child(items, pathItem(r)), method)
			if tmpl == nil {
				return nil, fmt.Errorf("the receiver document has no %s operation in path item %s", method, pathItem(r))
			}
			op := clone(tmpl)
			setKey(op, "operationId", scalar(child(op, "operationId").Value+"_"+identifier(r.Source)))
			setKey(op, "security", security(schemes, r))
			for _, h := range r.Headers[min(1, len(r.Headers)):] {
				params := child(op, "parameters")
				if params == nil {
					params = &yaml.Node{Kind: yaml.SequenceNode}
					setKey(op, "parameters", params)
				}
				params.Content = append(params.Content, mapping(
					"name", scalar(h), "in", scalar("header"), "required", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"},
					"description", scalar("Covered by the "+r.Headers[0]+" signature."),
					"schema", mapping("type", scalar("string"))))
			}
			item.Content = append(item.Content, scalar(method), op)
		}
		paths.Content = append(paths.Content, scalar(path), item)
	}
	setKey(root, "paths", paths)
	// Every operation is in paths now; the templates would repeat their operationIds.
	deleteKey(components, "pathItems")
	info := child(child(root, "info"), "description")
	if info == nil || !strings.Contains(info.Value, repositoryCopyNote) {
		return nil, errors.New("the receiver document's description lost the note on its repository copy")
	}
	info.Value = strings.Replace(info.Value, repositoryCopyNote, servedNote, 1)
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// The receiver document's note on which sources it lists, in the repository's copy and as
// served.
const (
	repositoryCopyNote = `The document idemd serves at /openapi/receiver.yaml on the admin address lists the
sources of its own pipelines file; this copy lists those of deploy/idemd.dev.yaml.`
	servedNote = `This document lists the sources of the pipelines file of the idemd that serves it.`
)

// security is the security requirement of r's operation; a signature scheme's source gets
// its own entry in schemes, named signature_<source>.
func security(schemes *yaml.Node, r receiver.Route) *yaml.Node {
	req := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	switch {
	case r.Scheme == receiver.SchemeBearer:
		req.Content = append(req.Content, mapping("bearer", &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}))
	case len(r.Headers) == 0: // none: unverified
	default:
		name := "signature_" + identifier(r.Source)
		if child(schemes, name) == nil {
			desc := fmt.Sprintf("Source %s: the verify.scheme %s signature over the raw body", r.Source, r.Scheme)
			if len(r.Headers) > 1 {
				desc += ", which also covers " + strings.Join(r.Headers[1:], " and ")
			}
			schemes.Content = append(schemes.Content, scalar(name), mapping(
				"type", scalar("apiKey"), "in", scalar("header"), "name", scalar(r.Headers[0]),
				"description", scalar(desc+" (see docs/receiver.md).")))
		}
		req.Content = append(req.Content, mapping(name, &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}))
	}
	return req
}

// identifier is name with what a component name or operationId should not hold replaced
// by '_' (pipeline names have none of it).
func identifier(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, name)
}

// pathItem names the receiver document's path item of a route's kind.
func pathItem(r receiver.Route) string {
	switch {
	case r.API && r.Method == "PUT":
		return "apiKeyInPath"
	case r.API && r.Method == "GET":
		return "apiLookup"
	case r.API && r.Method == "DELETE":
		return "apiDelete"
	case r.API:
		return "api"
	}
	return "webhook"
}

// child is the value of key in mapping n, nil when absent.
func child(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }

// mapping builds a mapping of key, value pairs.
func mapping(kv ...any) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for i := 0; i+1 < len(kv); i += 2 {
		n.Content = append(n.Content, scalar(kv[i].(string)), kv[i+1].(*yaml.Node))
	}
	return n
}

// setKey sets key in mapping n to v, in place when present, else at the end.
func setKey(n *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			n.Content[i+1] = v
			return
		}
	}
	n.Content = append(n.Content, scalar(key), v)
}

// deleteKey removes key from mapping n.
func deleteKey(n *yaml.Node, key string) {
	if n == nil {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			n.Content = append(n.Content[:i], n.Content[i+2:]...)
			return
		}
	}
}

// clone copies n deeply, so that a copy's edits leave the template alone.
func clone(n *yaml.Node) *yaml.Node {
	c := *n
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, x := range n.Content {
		c.Content[i] = clone(x)
	}
	return &c
}

func writeYAML(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(b)
}

func (s *Server) openAPIAdmin(w http.ResponseWriter, _ *http.Request) { writeYAML(w, AdminDocument()) }

func (s *Server) openAPIReceiver(w http.ResponseWriter, r *http.Request) {
	b, err := ReceiverDocument(receiver.Routes(s.cfg.Sources))
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeYAML(w, b)
}
