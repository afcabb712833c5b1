package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idemd/idemd/config"
)

// TestFilesParse: every YAML document under deploy/ parses, and the dashboard is JSON.
// (No Docker engine here: images are not built.)
func TestFilesParse(t *testing.T) {
	t.Parallel()
	var files []string
	require.NoError(t, filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return err
	}))
	require.GreaterOrEqual(t, len(files), 4)
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		dec := yaml.NewDecoder(bytes.NewReader(data))
		docs := 0
		for {
			var v any
			err := dec.Decode(&v)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, f)
			docs++
		}
		require.Positive(t, docs, f)
	}

	data, err := os.ReadFile("grafana/idemd-dashboard.json")
	require.NoError(t, err)
	var dash map[string]any
	require.NoError(t, json.Unmarshal(data, &dash))
	require.NotEmpty(t, dash["panels"])
}

// TestSeriesExist: the alert rules, their tests and the dashboard only name series that
// idemd exports. The names are collected from the string literals of every non-test Go file
// of the module (internal/metrics, delivery, and any package that registers its own), so a
// series renamed or removed anywhere breaks this test, not the on-call engineer's night.
func TestSeriesExist(t *testing.T) {
	t.Parallel()
	known := exportedSeries(t)
	require.Contains(t, known, "idemd_http_delivery_attempts_total", "series of packages other than internal/metrics are found")
	series := regexp.MustCompile(`idemd_[a-z0-9_]+`)
	for _, f := range []string{"prometheus/alerts.yaml", "prometheus/alerts_test.yaml", "grafana/idemd-dashboard.json", "kubernetes/prometheusrule.yaml"} {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		names := series.FindAllString(string(data), -1)
		require.NotEmpty(t, names, f)
		for _, s := range names {
			base := s
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(s, suffix); ok && known[b] {
					base = b
				}
			}
			require.True(t, known[base], "%s uses series %s, which no Go file of idemd defines", f, s)
		}
	}
}

// exportedSeries returns the idemd_ series named by a string literal in the module's
// non-test Go files.
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	literal := regexp.MustCompile(`"(idemd_[a-z0-9_]+)"`)
	known := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllStringSubmatch(string(src), -1) {
			known[m[1]] = true
		}
		return nil
	})
	require.NoError(t, err)
	return known
}

// TestDevPipelinesValid: the embedded dev file, the compose file's and the Kubernetes
// ConfigMap's are valid pipelines files (given their secrets).
func TestDevPipelinesValid(t *testing.T) {
	t.Parallel()
	// One value serves as every secret (16 bytes or more) and as a token=tenant list.
	lookup := func(string) (string, bool) { return "token-0123456789abcdef=tenant", true }
	_, err := config.Parse("idemd.dev.yaml", DevPipelines, lookup)
	require.NoError(t, err)

	// The compose file's: it runs PostgreSQL and Kafka only, so its pipelines may name no
	// Pub/Sub or SQS resource (serve would refuse to start without their endpoints).
	compose, err := os.ReadFile("idemd.compose.yaml")
	require.NoError(t, err)
	f, err := config.Parse("idemd.compose.yaml", compose, lookup)
	require.NoError(t, err)
	res := f.Resources()
	require.Empty(t, res.PubSubSubscriptions, "the compose file runs no Pub/Sub")
	require.Empty(t, res.PubSubTopics, "the compose file runs no Pub/Sub")
	require.Empty(t, res.SQSSubscriptions, "the compose file runs no SQS")
	require.Empty(t, res.SQSTargets, "the compose file runs no SQS")
	composeFile, err := os.ReadFile("docker-compose.yml")
	require.NoError(t, err)
	require.Contains(t, string(composeFile), "./idemd.compose.yaml:/etc/idemd/idemd.yaml:ro", "the file compose mounts")

	data, err := os.ReadFile("kubernetes/idemd.yaml")
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		if doc.Kind == "ConfigMap" {
			_, err := config.Parse("configmap idemd.yaml", []byte(doc.Data["idemd.yaml"]), lookup)
			require.NoError(t, err)
		}
	}
}
