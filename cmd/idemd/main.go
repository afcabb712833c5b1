// Command idemd turns at-least-once delivery into exactly-once effects on PostgreSQL: it
// receives webhooks and API requests over HTTP, consumes Kafka topics, and publishes
// through a transactional outbox. Run `idemd help` for the commands; docs/daemon.md has the
// whole reference.
package main

import (
	"os"

	"github.com/idemd/idemd/internal/gctune"
)

func main() {
	gctune.DefaultFromEnv() // GOGC=200 unless the environment sets GOGC
	os.Exit(run(os.Args[1:], os.Environ()))
}
