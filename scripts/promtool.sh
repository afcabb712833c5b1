#!/usr/bin/env bash
# Prints the path of a promtool (Prometheus's rule checker), installing one when none is on
# PATH: first Debian's `prometheus` package (root with apt-get), else built from the Go module
# proxy into "$(go env GOPATH)/bin". Exits 1, naming what is missing, when neither works.
# Used by .ci/run and by the alert-rule test of deploy/.
set -euo pipefail

# Prometheus 3.x as a Go module (its go.mod has no replace directive, so `go install` works).
PROMETHEUS_MODULE=github.com/prometheus/prometheus/cmd/promtool@v0.316.0

found() {
	if command -v promtool >/dev/null 2>&1; then
		command -v promtool
		return 0
	fi
	local gobin
	gobin="$(go env GOBIN)"
	gobin="${gobin:-$(go env GOPATH)/bin}"
	if [ -x "$gobin/promtool" ]; then
		echo "$gobin/promtool"
		return 0
	fi
	return 1
}

found && exit 0

tried=()
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "promtool: installing Debian's prometheus package" >&2
	if { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; } >&2; then
		found && exit 0
		tried+=("Debian's prometheus package installed no promtool")
	else
		tried+=("apt-get install prometheus failed")
	fi
else
	tried+=("apt-get unavailable (not root, or not Debian)")
fi

if command -v go >/dev/null 2>&1; then
	echo "promtool: building $PROMETHEUS_MODULE from the Go module proxy" >&2
	if go install "$PROMETHEUS_MODULE" >&2; then
		found && exit 0
	fi
	tried+=("go install $PROMETHEUS_MODULE failed")
else
	tried+=("no go on PATH")
fi

echo "promtool: not found and could not be installed: $(IFS=';'; echo "${tried[*]}")" >&2
exit 1
