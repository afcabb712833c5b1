# The whole test suite: vet and staticcheck, every test against real PostgreSQL and a real
# Kafka-protocol broker (the packages with concurrency under the race detector), then a short
# run of every fuzz target. CI runs exactly `make test`.
GO ?= go
FUZZTIME ?= 20000x
# staticcheck, pinned; `go run pkg@version` fetches it through the Go module proxy once and
# keeps it in the module and build caches.
STATICCHECK_VERSION ?= v0.8.2
# The packages with concurrency: the receiver's group commit, the consumer, the relay
# (outbox), the HTTP deliverer and the unit of work they share. `unit` runs their tests with
# -race (instead of without, not as well: the suite stays within CI's time).
RACE_PKGS ?= ./receiver ./consumer ./outbox ./delivery ./exactlyonce
MODULE := $(shell $(GO) list -m)

.PHONY: test vet staticcheck unit fuzz-short fuzz bench faults

test: vet staticcheck unit fuzz-short

vet:
	$(GO) vet ./...

staticcheck:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

unit:
	$(GO) test -p 2 -count=1 -timeout 15m $$($(GO) list ./... | grep -v -x -F $(patsubst ./%,-e $(MODULE)/%,$(RACE_PKGS)))
	$(GO) test -race -p 2 -count=1 -timeout 15m $(RACE_PKGS)

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
