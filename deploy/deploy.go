// Package deploy holds the deployment files of idemd (Dockerfile, compose, Kubernetes,
// Prometheus, Grafana) and embeds the two that the binary itself needs: the pipelines file
// and the effect tables of `idemd dev`, so that dev runs from any directory.
package deploy

import _ "embed"

// DevPipelines is idemd.dev.yaml.
//
//go:embed idemd.dev.yaml
var DevPipelines []byte

// DevSQL is idemd.dev.sql: the effect tables DevPipelines writes to.
//
//go:embed idemd.dev.sql
var DevSQL string
