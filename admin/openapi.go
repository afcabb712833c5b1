package admin

import (
	"bytes"
	"embed"
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
// serves them), and the source's name and scheme in its summary. A path with one operation
// refers to its path item; a path with several copies their operations.
func ReceiverDocument(routes []receiver.Route) ([]byte, error) {
	b, _ := openapiFS.ReadFile("openapi/receiver.yaml")
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("the embedded receiver document does not parse: %w", err)
	}
	root := doc.Content[0]
	items := child(child(root, "components"), "pathItems")
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
		r := rs[0]
		summary := fmt.Sprintf("Source %s (verify.scheme %s)", r.Source, r.Scheme)
		if r.API && r.KeyRequired {
			summary += "; Idempotency-Key required"
		}
		item := &yaml.Node{Kind: yaml.MappingNode}
		if len(rs) == 1 {
			item.Content = append(item.Content, scalar("$ref"), scalar("#/components/pathItems/"+pathItem(r)))
		}
		item.Content = append(item.Content, scalar("summary"), scalar(summary))
		if len(rs) > 1 {
			for _, r := range rs {
				method := strings.ToLower(r.Method)
				op := child(child(items, pathItem(r)), method)
				if op == nil {
					return nil, fmt.Errorf("the receiver document has no %s operation in path item %s", method, pathItem(r))
				}
				item.Content = append(item.Content, scalar(method), op)
			}
		}
		paths.Content = append(paths.Content, scalar(path), item)
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "paths" {
			root.Content[i+1] = paths
		}
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
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
