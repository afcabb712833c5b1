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
	"github.com/idemd/idemd/internal/metrics"
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

// TestSeriesExist: the alert rules and the dashboard only use series idemd exports.
func TestSeriesExist(t *testing.T) {
	t.Parallel()
	families, err := metrics.Registry.Gather()
	require.NoError(t, err)
	known := map[string]bool{}
	for _, f := range families {
		known[f.GetName()] = true
	}
	// Vectors without a sample yet are not gathered: list them from the source of truth.
	src, err := os.ReadFile("../internal/metrics/metrics.go")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`"(idemd_[a-z_]+)"`).FindAllStringSubmatch(string(src), -1) {
		known[m[1]] = true
	}
	series := regexp.MustCompile(`idemd_[a-z_]+`)
	for _, f := range []string{"prometheus/alerts.yaml", "grafana/idemd-dashboard.json"} {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, s := range series.FindAllString(string(data), -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(s, "_bucket"), "_sum"), "_count")
			require.True(t, known[base], "%s uses unknown series %s", f, s)
		}
	}
}

// TestDevPipelinesValid: the embedded dev file and the Kubernetes ConfigMap's file are valid
// pipelines files (given their secrets).
func TestDevPipelinesValid(t *testing.T) {
	t.Parallel()
	// One value serves as every secret (16 bytes or more) and as a token=tenant list.
	lookup := func(string) (string, bool) { return "token-0123456789abcdef=tenant", true }
	_, err := config.Parse("idemd.dev.yaml", DevPipelines, lookup)
	require.NoError(t, err)

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
