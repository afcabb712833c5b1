# The whole test suite: vet and staticcheck, every test against real PostgreSQL and a real
# Kafka-protocol broker (the packages with concurrency under the race detector), a short run
# of every fuzz target, and the TypeScript client's tests. CI runs exactly `make test`.
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

.PHONY: test vet staticcheck unit fuzz-short fuzz bench faults ts

test: vet staticcheck unit fuzz-short ts

vet:
	$(GO) vet ./...

staticcheck:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

unit:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1 || [ -n "$$IDEMD_CHROMIUM" ] \
		|| echo "WARNING: headless Chromium is missing: the console's browser tests (admin/browser_test.go) SKIP. Install it: apt-get install -y chromium" >&2
	$(GO) test -p 2 -count=1 -timeout 15m $$($(GO) list ./... | grep -v -x -F $(patsubst ./%,-e $(MODULE)/%,$(RACE_PKGS)))
	$(GO) test -race -p 2 -count=1 -timeout 15m $(RACE_PKGS)

fuzz-short:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

# The TypeScript client (clients/typescript): unit tests over the case table it shares with
# idemclient, and tests against idemd built from this tree. Needs Node.js and npm: without
# them this fails, it never skips. It needs Node.js >= 18: the package itself targets Node >= 20,
# and Debian 12's nodejs, 18, lacks the global crypto object without a flag, which it is given.
ts:
	@command -v node >/dev/null 2>&1 || { echo "make ts: node is not installed; the TypeScript client's tests need Node.js >= 18 (20 or later runs them without flags) and npm (Debian: apt-get install nodejs npm)" >&2; exit 1; }
	@command -v npm >/dev/null 2>&1 || { echo "make ts: npm is not installed; the TypeScript client's tests need it (Debian: apt-get install npm)" >&2; exit 1; }
	@major=$$(node -p 'process.versions.node.split(".")[0]'); \
	if [ "$$major" -lt 18 ]; then echo "make ts: Node.js $$(node --version) is too old; the TypeScript client's tests need Node.js >= 18 (20 or later runs them without flags)" >&2; exit 1; fi; \
	if [ "$$major" -lt 20 ]; then echo "make ts: Node.js $$(node --version): running with --experimental-global-webcrypto"; export NODE_OPTIONS="$$NODE_OPTIONS --experimental-global-webcrypto"; fi; \
	cd clients/typescript && npm ci --no-audit --no-fund --prefer-offline && GO="$(GO)" npm test

# Longer local fuzzing: make fuzz FUZZTIME=5m (a duration) or FUZZTIME=1000000x (executions)
fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

bench:
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

# The fault suite with its long sizes (100,000 messages, 10+ SIGKILLs per crash loop); the
# short sizes run in `unit`. Figures are the FIGURES lines of the output (RELIABILITY.md).
faults:
	IDEMD_FAULTS=long $(GO) test -count=1 -timeout 90m -v ./internal/faults
