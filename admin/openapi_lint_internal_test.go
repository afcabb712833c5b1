package admin

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// lintOpenAPI checks the structure of an OpenAPI 3.1 document where a YAML slip turns into
// a document that parses but says something else: a flow mapping's unquoted comma splits a
// description into bogus keys with null values; a number or a boolean where text belongs;
// a key that the object does not have (a typo, or a fragment of a split value); an
// operationId used twice. It returns the problems, each with its line.
func lintOpenAPI(raw []byte) []string {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return []string{err.Error()}
	}
	l := &openAPILint{ops: map[string]int{}}
	root := doc.Content[0]
	l.walk(root, "")
	for path, item := range pairs(child(root, "paths")) {
		l.pathItem(item, "paths."+path)
	}
	for name, item := range pairs(child(child(root, "components"), "pathItems")) {
		l.pathItem(item, "components.pathItems."+name)
	}
	for name, r := range pairs(child(child(root, "components"), "responses")) {
		l.response(r, "components.responses."+name)
	}
	for name, p := range pairs(child(child(root, "components"), "parameters")) {
		l.object(p, "components.parameters."+name, parameterKeys)
	}
	return l.problems
}

type openAPILint struct {
	problems []string
	ops      map[string]int // operationId → line of its first use
}

func (l *openAPILint) fail(n *yaml.Node, at, format string, args ...any) {
	l.problems = append(l.problems, fmt.Sprintf("line %d, %s: %s", n.Line, at, fmt.Sprintf(format, args...)))
}

// nullable are the keys whose value may be null in OpenAPI 3.1 (JSON Schema's).
var nullable = []string{"default", "example", "const"}

// texts are the keys whose value is text wherever they appear.
var texts = []string{"description", "summary", "title", "operationId"}

// walk checks every mapping of the document: no null value but where a schema allows one,
// and text under the keys that hold text.
func (l *openAPILint) walk(n *yaml.Node, at string) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			where := strings.TrimPrefix(at+"."+k.Value, ".")
			if v.Kind == yaml.ScalarNode && v.Tag == "!!null" && !slices.Contains(nullable, k.Value) && !strings.HasPrefix(k.Value, "x-") &&
				!strings.Contains(at, ".properties") { // a property named like a key is a name, not a key
				l.fail(k, where, "null value (an unquoted comma in a flow mapping splits it into keys)")
			}
			if slices.Contains(texts, k.Value) && !strings.HasSuffix(at, ".properties") && (v.Kind != yaml.ScalarNode || v.Tag != "!!str") {
				l.fail(v, where, "not text (%s)", v.Tag)
			}
			l.walk(v, where)
		}
	case yaml.SequenceNode:
		for i, v := range n.Content {
			l.walk(v, fmt.Sprintf("%s[%d]", at, i))
		}
	}
}

var (
	pathItemKeys  = []string{"$ref", "summary", "description", "get", "put", "post", "delete", "options", "head", "patch", "trace", "servers", "parameters"}
	operationKeys = []string{"tags", "summary", "description", "externalDocs", "operationId", "parameters", "requestBody", "responses", "callbacks", "deprecated", "security", "servers"}
	responseKeys  = []string{"$ref", "summary", "description", "headers", "content", "links"}
	parameterKeys = []string{"$ref", "summary", "name", "in", "description", "required", "deprecated", "allowEmptyValue", "style", "explode", "allowReserved", "schema", "example", "examples", "content"}
	methods       = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}
)

// object checks that mapping n has only the keys an OpenAPI object of its kind has (and
// extensions).
func (l *openAPILint) object(n *yaml.Node, at string, keys []string) {
	if n == nil || n.Kind != yaml.MappingNode {
		l.fail(orNode(n), at, "not a mapping")
		return
	}
	for k := range pairs(n) {
		if !slices.Contains(keys, k) && !strings.HasPrefix(k, "x-") {
			l.fail(n, at, "unknown key %q", k)
		}
	}
}

func (l *openAPILint) pathItem(item *yaml.Node, at string) {
	l.object(item, at, pathItemKeys)
	for method, op := range pairs(item) {
		if !slices.Contains(methods, method) {
			continue
		}
		where := at + "." + method
		l.object(op, where, operationKeys)
		if id := child(op, "operationId"); id != nil {
			if line, dup := l.ops[id.Value]; dup {
				l.fail(id, where, "operationId %q is already used on line %d", id.Value, line)
			} else {
				l.ops[id.Value] = id.Line
			}
		}
		for _, p := range seq(child(op, "parameters")) {
			l.object(p, where+".parameters", parameterKeys)
		}
		for status, r := range pairs(child(op, "responses")) {
			l.response(r, where+".responses."+status)
		}
	}
}

func (l *openAPILint) response(r *yaml.Node, at string) {
	l.object(r, at, responseKeys)
	if child(r, "$ref") == nil && child(r, "description") == nil {
		l.fail(orNode(r), at, "a response needs a description")
	}
}

// pairs iterates a mapping's keys and values (nothing for nil or another kind).
func pairs(n *yaml.Node) func(func(string, *yaml.Node) bool) {
	return func(yield func(string, *yaml.Node) bool) {
		if n == nil || n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if !yield(n.Content[i].Value, n.Content[i+1]) {
				return
			}
		}
	}
}

func seq(n *yaml.Node) []*yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	return n.Content
}

func orNode(n *yaml.Node) *yaml.Node {
	if n == nil {
		return &yaml.Node{}
	}
	return n
}

// The documents served are well-formed OpenAPI, not only YAML: the admin document, the
// receiver's copy in the repository, and the receiver's document rendered for sources of
// every scheme.
func TestOpenAPIDocumentsLint(t *testing.T) {
	t.Parallel()
	require.Empty(t, lintOpenAPI(AdminDocument()), "admin.yaml")
	repo, err := openapiFS.ReadFile("openapi/receiver.yaml")
	require.NoError(t, err)
	require.Empty(t, lintOpenAPI(repo), "receiver.yaml")
}

// The lint catches the slips it is for.
func TestLintOpenAPICatchesSlips(t *testing.T) {
	t.Parallel()
	head := "openapi: 3.1.0\ninfo: {title: t, version: \"1\"}\npaths:\n  /a:\n    get:\n      operationId: a\n      responses:\n"
	for name, tc := range map[string]struct{ doc, want string }{
		"unquoted comma": {head + `        "503": {description: Not ready (starting, draining)., content: {}}` + "\n", "null value"},
		"number as text": {head + `        "200": {description: 12}` + "\n", "not text"},
		"no description": {head + `        "200": {content: {}}` + "\n", "needs a description"},
		"unknown key":    {head + `        "200": {description: ok, contnet: {}}` + "\n", `unknown key "contnet"`},
		"operationId twice": {head + "        \"200\": {description: ok}\n  /b:\n    get:\n      operationId: a\n      responses:\n        \"200\": {description: ok}\n",
			`operationId "a" is already used`},
	} {
		problems := lintOpenAPI([]byte(tc.doc))
		require.NotEmpty(t, problems, name)
		require.Contains(t, strings.Join(problems, "\n"), tc.want, name)
	}
	require.Empty(t, lintOpenAPI([]byte(head+"        \"200\": {description: \"Ready, or not.\", content: {application/json: {schema: {type: object, properties: {description: {type: string}}}}}}\n")))
}
