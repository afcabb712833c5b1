package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

type manifest struct {
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
		Template struct {
			Spec struct {
				Containers []struct {
					Env []struct {
						Name  string `yaml:"name"`
						Value string `yaml:"value"`
					} `yaml:"env"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func manifests(t *testing.T, path string) []manifest {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var out []manifest
	for {
		var m manifest
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, m)
	}
}

// The public Service exposes the receiver only: the admin port (API, console, pprof) is not
// on it. The Deployment makes the admin server listen on the pod's address, which its probes
// need (the default, 127.0.0.1:9090, is not reachable from the kubelet).
func TestPublicServiceHasNoAdminPort(t *testing.T) {
	t.Parallel()
	var service, deployment bool
	for _, m := range manifests(t, "kubernetes/idemd.yaml") {
		switch {
		case m.Kind == "Service" && m.Metadata.Name == "idemd":
			service = true
			require.NotEmpty(t, m.Spec.Ports)
			for _, p := range m.Spec.Ports {
				require.NotEqual(t, "admin", p.Name)
				require.NotEqual(t, "admin", p.TargetPort)
				require.NotEqual(t, 9090, p.Port)
			}
		case m.Kind == "Deployment":
			deployment = true
			addr := ""
			for _, e := range m.Spec.Template.Spec.Containers[0].Env {
				if e.Name == "IDEMD_ADMIN_ADDR" {
					addr = e.Value
				}
			}
			require.True(t, strings.HasPrefix(addr, ":"), "IDEMD_ADMIN_ADDR is %q: the probes need the pod's address", addr)
		}
	}
	require.True(t, service, "the Service idemd is in kubernetes/idemd.yaml")
	require.True(t, deployment)
}
