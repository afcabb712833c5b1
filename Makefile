# The whole test suite: vet, every test against real PostgreSQL and a real Kafka-protocol
# broker, then a short run of every fuzz target. CI runs exactly `make test`.
GO ?= go
FUZZTIME ?= 20000x

.PHONY: test vet unit fuzz-short fuzz bench faults

test: vet unit fuzz-short

vet:
	$(GO) vet ./...

unit:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1 || [ -n "$$IDEMD_CHROMIUM" ] \
		|| echo "WARNING: headless Chromium is missing: the console's browser tests (admin/browser_test.go) SKIP. Install it: apt-get install -y chromium" >&2
	$(GO) test -p 2 -count=1 -timeout 15m ./...

fuzz-short:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

# Longer local fuzzing: make fuzz FUZZTIME=5m (a duration) or FUZZTIME=1000000x (executions)
fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

bench:
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

# The fault suite with its long sizes (100,000 messages, 10+ SIGKILLs per crash loop); the
# short sizes run in `unit`. Figures are the FIGURES lines of the output (RELIABILITY.md).
faults:
	IDEMD_FAULTS=long $(GO) test -count=1 -timeout 90m -v ./internal/faults
