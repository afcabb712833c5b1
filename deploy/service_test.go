package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The public Service exposes the receiver only: the admin port (API, console, pprof) is not
// on it.
func TestPublicServiceHasNoAdminPort(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("kubernetes/idemd.yaml")
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	found := false
	for {
		var doc struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Spec struct {
				Ports []struct {
					Name       string `yaml:"name"`
					Port       int    `yaml:"port"`
					TargetPort any    `yaml:"targetPort"`
				} `yaml:"ports"`
			} `yaml:"spec"`
		}
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if doc.Kind != "Service" || doc.Metadata.Name != "idemd" {
			continue
		}
		found = true
		require.NotEmpty(t, doc.Spec.Ports)
		for _, p := range doc.Spec.Ports {
			require.NotEqual(t, "admin", p.Name)
			require.NotEqual(t, "admin", p.TargetPort)
			require.NotEqual(t, 9090, p.Port)
		}
	}
	require.True(t, found, "the Service idemd is in kubernetes/idemd.yaml")
}
