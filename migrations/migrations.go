// Package migrations holds idemd's SQL schema as numbered, embedded migrations and applies
// them. Guarantee: migrations are applied in order, each in its own transaction, under a
// PostgreSQL advisory lock, so that any number of idemd processes can start at once and the
// schema is migrated exactly once; the applied version is recorded in
// {schema}.schema_version.
//
// The migrations are run by github.com/jackc/tern/v2/migrate; a shipped migration is never
// edited, a new one follows it.
package migrations

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed *.sql
var files embed.FS

// SchemaDefault is the schema idemd's tables live in unless configured otherwise.
const SchemaDefault = "idemd"

// Config says where the migrations go.
type Config struct {
	// Schema is the PostgreSQL schema of idemd's tables. It is created when missing.
	// Defaults to "idemd".
	Schema string
	// OnApply, when set, is called before each migration that Apply applies, with its
	// version and name (the file name without .sql), so that a command can say what it
	// did. Defaults to nil.
	OnApply func(version int32, name string)
}

func (c *Config) schema() string {
	if c == nil {
		return SchemaDefault
	}
	return cmp.Or(c.Schema, SchemaDefault)
}

// Status is what a database holds compared with what this binary ships.
type Status struct {
	// Current is the version applied in the database (0 when none).
	Current int32
	// Latest is the highest version embedded in this binary.
	Latest int32
}

// UpToDate reports whether every embedded migration is applied.
func (s Status) UpToDate() bool { return s.Current >= s.Latest }

// Newer reports whether the schema was migrated past this binary's last migration, by a
// later idemd.
func (s Status) Newer() bool { return s.Current > s.Latest }

// ErrSchemaNewer: the schema was migrated by a later idemd than this one. Migrations are
// not undone: this binary can only run on it without migrating (IDEMD_MIGRATE=false), as a
// replica of the previous version does during a rolling update, when that version works on
// the newer schema (README, Migrations).
var ErrSchemaNewer = errors.New("the schema was migrated by a later idemd")

// NewerError is ErrSchemaNewer for schema at s, in words an operator can act on.
func (s Status) NewerError(schema string) error {
	return fmt.Errorf("schema %s is at version %d, past this idemd's last migration (%d): %w, and migrations are not undone; "+
		"run that version, or run this one with IDEMD_MIGRATE=false if it works on the newer schema (README, Migrations)",
		pgx.Identifier{schema}.Sanitize(), s.Current, s.Latest, ErrSchemaNewer)
}

// Apply migrates the schema to the latest version. It is safe to call from many processes
// at once: they serialize on an advisory lock and all but the first find nothing to do.
func Apply(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("error acquiring connection for migrations: %w", err)
	}
	defer conn.Release()
	return ApplyConn(ctx, conn.Conn(), cfg)
}

// ApplyConn is Apply on a single connection.
func ApplyConn(ctx context.Context, conn *pgx.Conn, cfg *Config) (err error) {
	schema := cfg.schema()
	lock := lockKey(schema)
	// CREATE SCHEMA IF NOT EXISTS is not safe against a concurrent creator, hence the lock
	// around everything, not only around tern's part.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lock); err != nil {
		return fmt.Errorf("error taking the migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the caller's may be the reason we are leaving.
		if _, unlockErr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lock); unlockErr != nil {
			err = errors.Join(err, fmt.Errorf("error releasing the migration lock: %w", unlockErr))
		}
	}()

	quoted := pgx.Identifier{schema}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+quoted); err != nil {
		return fmt.Errorf("error creating schema %s: %w", quoted, err)
	}
	m, err := newMigrator(ctx, conn, schema)
	if err != nil {
		return err
	}
	current, err := m.GetCurrentVersion(ctx)
	if err != nil {
		return fmt.Errorf("error reading the version of schema %s: %w", quoted, err)
	}
	if st := (Status{Current: current, Latest: int32(len(m.Migrations))}); st.Newer() {
		return st.NewerError(schema)
	}
	if cfg != nil && cfg.OnApply != nil {
		m.OnStart = func(version int32, name, _, _ string) { cfg.OnApply(version, strings.TrimSuffix(name, ".sql")) }
	}
	if err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("error applying migrations to schema %s: %w", quoted, err)
	}
	return nil
}

// CurrentStatus reports the applied and the latest versions without changing anything. A
// schema that does not exist yet is at version 0.
func CurrentStatus(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (Status, error) {
	schema := cfg.schema()
	latest, err := latestVersion()
	if err != nil {
		return Status{}, err
	}
	var exists bool
	err = pool.QueryRow(ctx,
		"SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = 'schema_version')",
		schema).Scan(&exists)
	if err != nil {
		return Status{}, fmt.Errorf("error reading migration status: %w", err)
	}
	if !exists {
		return Status{Latest: latest}, nil
	}
	var current int32
	err = pool.QueryRow(ctx, "SELECT version FROM "+pgx.Identifier{schema, "schema_version"}.Sanitize()).Scan(&current)
	if err != nil {
		return Status{}, fmt.Errorf("error reading migration status: %w", err)
	}
	return Status{Current: current, Latest: latest}, nil
}

func newMigrator(ctx context.Context, conn *pgx.Conn, schema string) (*migrate.Migrator, error) {
	m, err := migrate.NewMigrator(ctx, conn, pgx.Identifier{schema, "schema_version"}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("error preparing migrations: %w", err)
	}
	m.Data["schema"] = pgx.Identifier{schema}.Sanitize()
	if err := m.LoadMigrations(files); err != nil {
		return nil, fmt.Errorf("error loading embedded migrations: %w", err)
	}
	return m, nil
}

func latestVersion() (int32, error) {
	paths, err := migrate.FindMigrations(files)
	if err != nil {
		return 0, fmt.Errorf("error listing embedded migrations: %w", err)
	}
	return int32(len(paths)), nil
}

// lockKey is the advisory lock that serializes migrations of one schema.
func lockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idemd.migrations:" + schema))
	return int64(h.Sum64())
}
