// Package faults holds idemd's fault suite: tests that run the real idemd binary as
// subprocesses against PostgreSQL and in-process Kafka-protocol brokers, kill it with
// SIGKILL, cut its database connections and take its broker away, and then check that
// every guarantee of the specification still holds (no effect lost, none repeated, every
// outbox row published with a stable operation id). It also holds the bad-input catalogue
// and the security checks of the HTTP receiver. The package has no code of its own: see
// RELIABILITY.md at the repository root for what each test proves and how to run it.
//
// The short sizes run in `make test`; IDEMD_FAULTS=long (`make faults`) runs the long ones.
package faults
