package deploy

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite the generated files (kubernetes/prometheusrule.yaml)")

// promtool returns the path of a promtool, installing one through scripts/promtool.sh
// (Debian's prometheus package, else the Go module proxy) when none is on PATH. It skips,
// loudly and naming what is missing, only when both ways fail.
func promtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	var stderr bytes.Buffer
	cmd := exec.Command("bash", "../scripts/promtool.sh")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("SKIPPED: the alert rules were NOT tested: no promtool (scripts/promtool.sh: %v)\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// TestAlertRules: the rules are valid, every alert has a promtool unit test, and the unit
// tests of alerts_test.yaml pass (absent series included).
func TestAlertRules(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	out, err := exec.Command(bin, "check", "rules", "prometheus/alerts.yaml").CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)
	out, err = exec.Command(bin, "test", "rules", "prometheus/alerts_test.yaml").CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s", out)

	tests, err := os.ReadFile("prometheus/alerts_test.yaml")
	require.NoError(t, err)
	for _, name := range alertNames(t) {
		require.Regexp(t, `alertname: `+name+`\s*\n\s*exp_alerts:\s*\n\s*- exp_labels`, string(tests),
			"alert %s has no promtool test in which it fires", name)
	}
}

// alertNames lists the alerts of prometheus/alerts.yaml.
func alertNames(t *testing.T) []string {
	t.Helper()
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	data, err := os.ReadFile("prometheus/alerts.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &rules))
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	require.NotEmpty(t, names)
	return names
}

// prometheusRule renders kubernetes/prometheusrule.yaml from prometheus/alerts.yaml: the
// same groups, node for node, in a PrometheusRule of the Prometheus Operator.
func prometheusRule(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile("prometheus/alerts.yaml")
	require.NoError(t, err)
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(data, &doc))
	var groups *yaml.Node
	root := doc.Content[0]
	for i := 0; i < len(root.Content); i += 2 {
		if root.Content[i].Value == "groups" {
			groups = root.Content[i+1]
		}
	}
	require.NotNil(t, groups, "alerts.yaml has no groups")
	rule := map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "PrometheusRule",
		"metadata":   map[string]any{"name": "idemd", "labels": map[string]string{"app.kubernetes.io/name": "idemd"}},
		"spec":       map[string]any{"groups": groups},
	}
	var b bytes.Buffer
	b.WriteString("# GENERATED from deploy/prometheus/alerts.yaml; do not edit. Regenerate with\n" +
		"#   go test ./deploy -run TestPrometheusRule -update\n" +
		"# The Prometheus Operator's form of the same rules: kubectl apply -f deploy/kubernetes/prometheusrule.yaml\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	require.NoError(t, enc.Encode(rule))
	require.NoError(t, enc.Close())
	return b.Bytes()
}

// TestPrometheusRule: the PrometheusRule holds exactly the rules of the plain rule file.
func TestPrometheusRule(t *testing.T) {
	t.Parallel()
	want := prometheusRule(t)
	if *update {
		require.NoError(t, os.WriteFile("kubernetes/prometheusrule.yaml", want, 0o644))
	}
	got, err := os.ReadFile("kubernetes/prometheusrule.yaml")
	require.NoError(t, err)
	require.Equal(t, string(want), string(got),
		"kubernetes/prometheusrule.yaml differs from prometheus/alerts.yaml: go test ./deploy -run TestPrometheusRule -update")

	// And semantically: the same groups, whatever the rendering.
	var plain, operator struct {
		Groups any `yaml:"groups"`
		Spec   struct {
			Groups any `yaml:"groups"`
		} `yaml:"spec"`
	}
	data, err := os.ReadFile("prometheus/alerts.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &plain))
	require.NoError(t, yaml.Unmarshal(got, &operator))
	require.Equal(t, plain.Groups, operator.Spec.Groups)
}

// yamlDocs decodes every document of a YAML file into generic maps.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		require.NoError(t, err, path)
		if d != nil {
			docs = append(docs, d)
		}
	}
}

// TestImagesPinned: every image the deploy files run names a version, never :latest or
// no tag at all (which means latest).
func TestImagesPinned(t *testing.T) {
	t.Parallel()
	image := regexp.MustCompile(`(?m)^\s*(?:-\s*)?image:\s*"?([^\s"#]+)`)
	count := 0
	require.NoError(t, filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, m := range image.FindAllStringSubmatch(string(data), -1) {
			count++
			ref := m[1]
			_, tag, tagged := strings.Cut(ref[strings.LastIndex(ref, "/")+1:], ":")
			require.True(t, tagged && tag != "" && tag != "latest", "%s: image %s is not pinned to a version", path, ref)
		}
		return nil
	}))
	require.GreaterOrEqual(t, count, 7)
}

// TestComposeObservability: the profile "observability" adds Prometheus, Grafana, an
// OpenTelemetry collector and Jaeger, and their files fit together: every mounted file
// exists, Prometheus scrapes idemd's admin port with the job the alerts expect and loads
// the rule file, Grafana provisions the dashboard from where it is mounted, idemd exports
// spans to the collector's OTLP port, and the collector forwards them to Jaeger.
func TestComposeObservability(t *testing.T) {
	t.Parallel()
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Profiles    []string          `yaml:"profiles"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Command     []string          `yaml:"command"`
		} `yaml:"services"`
	}
	data, err := os.ReadFile("docker-compose.yml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &compose))
	mounts := map[string]string{} // container path -> file here
	for _, name := range []string{"prometheus", "grafana", "otel-collector", "jaeger"} {
		s, ok := compose.Services[name]
		require.True(t, ok, "service %s", name)
		require.Equal(t, []string{"observability"}, s.Profiles, name)
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			_, err := os.Stat(parts[0])
			require.NoError(t, err, "%s mounts %s", name, parts[0])
			mounts[parts[1]] = filepath.Clean(parts[0])
		}
	}
	idemd := compose.Services["idemd"]
	require.Empty(t, idemd.Profiles, "idemd runs in every profile")

	// Prometheus: job idemd, target idemd's admin port, the rule file mounted where loaded.
	var prom struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	promFile := mounts["/etc/prometheus/prometheus.yml"]
	require.NotEmpty(t, promFile)
	data, err = os.ReadFile(promFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &prom))
	require.Len(t, prom.ScrapeConfigs, 1)
	require.Equal(t, "idemd", prom.ScrapeConfigs[0].JobName, "the alert rules select job=\"idemd\"")
	adminPort := strings.TrimPrefix(idemd.Environment["IDEMD_ADMIN_ADDR"], ":")
	require.NotEmpty(t, adminPort, "idemd's admin server must listen beyond loopback to be scraped")
	require.Equal(t, []string{"idemd:" + adminPort}, prom.ScrapeConfigs[0].StaticConfigs[0].Targets)
	for _, rf := range prom.RuleFiles {
		require.Equal(t, "prometheus/alerts.yaml", mounts[rf], "rule file %s", rf)
	}

	// Grafana: the dashboard provider's path holds the mounted dashboard.
	require.Equal(t, "grafana/provisioning", mounts["/etc/grafana/provisioning"])
	var provider struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	data, err = os.ReadFile("grafana/provisioning/dashboards/idemd.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &provider))
	require.Equal(t, "grafana/idemd-dashboard.json", mounts[provider.Providers[0].Options.Path+"/idemd-dashboard.json"])
	var datasources struct {
		Datasources []struct {
			URL string `yaml:"url"`
		} `yaml:"datasources"`
	}
	data, err = os.ReadFile("grafana/provisioning/datasources/prometheus.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &datasources))
	require.Equal(t, "http://prometheus:9090", datasources.Datasources[0].URL)

	// Traces: idemd -> collector (OTLP/HTTP) -> Jaeger (OTLP/gRPC).
	endpoint := idemd.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]
	m := regexp.MustCompile(`^\$\{OTEL_EXPORTER_OTLP_ENDPOINT-(.+)\}$`).FindStringSubmatch(endpoint)
	require.NotNil(t, m, "idemd's OTLP endpoint can be overridden from the environment: %s", endpoint)
	u, err := url.Parse(m[1])
	require.NoError(t, err)
	var collector struct {
		Receivers struct {
			OTLP struct {
				Protocols map[string]struct {
					Endpoint string `yaml:"endpoint"`
				} `yaml:"protocols"`
			} `yaml:"otlp"`
		} `yaml:"receivers"`
		Exporters map[string]struct {
			Endpoint string `yaml:"endpoint"`
		} `yaml:"exporters"`
	}
	data, err = os.ReadFile(mounts["/etc/otelcol/config.yaml"])
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(data, &collector))
	require.Equal(t, "otel-collector", u.Hostname())
	require.True(t, strings.HasSuffix(collector.Receivers.OTLP.Protocols["http"].Endpoint, ":"+u.Port()), "the collector's OTLP/HTTP port")
	require.Equal(t, "jaeger:4317", collector.Exporters["otlp/jaeger"].Endpoint)
}

// TestServiceMonitor: the ServiceMonitor selects a Service that exposes the pods' admin
// port, and names the job "idemd", which the alert rules select.
func TestServiceMonitor(t *testing.T) {
	t.Parallel()
	var monitor, service map[string]any
	for _, d := range yamlDocs(t, "kubernetes/servicemonitor.yaml") {
		switch d["kind"] {
		case "ServiceMonitor":
			monitor = d
		case "Service":
			service = d
		}
	}
	require.NotNil(t, monitor)
	require.NotNil(t, service)
	spec := monitor["spec"].(map[string]any)
	selector := spec["selector"].(map[string]any)["matchLabels"].(map[string]any)
	labels := service["metadata"].(map[string]any)["labels"].(map[string]any)
	for k, v := range selector {
		require.Equal(t, v, labels[k], "the ServiceMonitor selects the metrics Service (label %s)", k)
	}
	require.Equal(t, "idemd", labels[spec["jobLabel"].(string)], "job label")
	endpoint := spec["endpoints"].([]any)[0].(map[string]any)
	ports := service["spec"].(map[string]any)["ports"].([]any)
	require.Equal(t, endpoint["port"], ports[0].(map[string]any)["name"])
	require.Equal(t, "admin", ports[0].(map[string]any)["targetPort"], "the Deployment's container port named admin")
	require.Equal(t, "/metrics", endpoint["path"])
}
