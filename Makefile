# The whole test suite: vet, every test against real PostgreSQL and a real Kafka-protocol
# broker, a short run of every fuzz target, and the TypeScript client's tests. CI runs
# exactly `make test`.
GO ?= go
FUZZTIME ?= 20000x

.PHONY: test vet unit fuzz-short fuzz bench faults ts

test: vet unit fuzz-short ts

vet:
	$(GO) vet ./...

unit:
	$(GO) test -p 2 -count=1 -timeout 15m ./...

fuzz-short:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

# The TypeScript client (clients/typescript): unit tests over the case table it shares with
# idemclient, and tests against idemd built from this tree. Needs Node.js and npm: without
# them this fails, it never skips. Debian 12's nodejs is 18, which lacks the global crypto
# object without a flag; the package itself targets Node >= 20.
ts:
	@command -v node >/dev/null 2>&1 || { echo "make ts: node is not installed; the TypeScript client's tests need Node.js >= 20 and npm (Debian: apt-get install nodejs npm)" >&2; exit 1; }
	@command -v npm >/dev/null 2>&1 || { echo "make ts: npm is not installed; the TypeScript client's tests need it (Debian: apt-get install npm)" >&2; exit 1; }
	@major=$$(node -p 'process.versions.node.split(".")[0]'); \
	if [ "$$major" -lt 18 ]; then echo "make ts: Node.js $$(node --version) is too old; the TypeScript client needs Node.js >= 20" >&2; exit 1; fi; \
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
