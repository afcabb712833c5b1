package admin

import (
	"bytes"
	"embed"
	"fmt"
	"net/http"

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

// ReceiverDocument renders the receiver's OpenAPI document for routes: one path per route,
// each a reference to the path item of its kind (webhook, API request, API request with
// the key in the URL), with the source's name and scheme in its summary.
func ReceiverDocument(routes []receiver.Route) ([]byte, error) {
	b, _ := openapiFS.ReadFile("openapi/receiver.yaml")
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("the embedded receiver document does not parse: %w", err)
	}
	paths := &yaml.Node{Kind: yaml.MappingNode}
	for _, r := range routes {
		item := "webhook"
		switch {
		case r.API && r.Method == "PUT":
			item = "apiKeyInPath"
		case r.API:
			item = "api"
		}
		summary := fmt.Sprintf("Source %s (verify.scheme %s)", r.Source, r.Scheme)
		if r.API && r.KeyRequired {
			summary += "; Idempotency-Key required"
		}
		paths.Content = append(paths.Content, scalar(r.Path), &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
			scalar("$ref"), scalar("#/components/pathItems/" + item),
			scalar("summary"), scalar(summary),
		}})
	}
	root := doc.Content[0]
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
