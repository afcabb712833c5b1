// Package pgtest gives each test a real PostgreSQL schema of its own, migrated to the
// latest version and dropped at cleanup. The server is TEST_DATABASE_URL, by default the
// local one (postgres://postgres@127.0.0.1:5432/test).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/outageproxy"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/migrations"
)

// URLDefault is the database tests use when TEST_DATABASE_URL is unset.
const URLDefault = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns the test database's connection string.
func URL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return URLDefault
}

// DB is one test's database: a pool and the schema idemd's tables were migrated into.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
	// URL connects to the same database; the schema is not in it.
	URL string
}

// Options adjust New.
type Options struct {
	// MaxConns bounds the pool. Defaults to 8.
	MaxConns int32
}

// New creates a fresh schema, migrates it and returns a pool on it. The schema and the pool
// go away at cleanup.
func New(tb testing.TB) *DB {
	tb.Helper()
	return NewWithOptions(tb, Options{})
}

// NewWithOptions is New with options.
func NewWithOptions(tb testing.TB, opts Options) *DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	schema := SchemaName(tb)
	pool := Pool(tb, opts.MaxConns)
	if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: schema}); err != nil {
		tb.Fatalf("pgtest: migrating schema %s: %v", schema, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A test that failed with a transaction open would make the DROP wait for it for
		// ever: bounded, the schema is left behind instead, and the run goes on.
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			return err
		})
		if err != nil {
			tb.Logf("pgtest: dropping schema %s: %v", schema, err)
		}
	})
	return &DB{Pool: pool, Schema: schema, URL: URL()}
}

// Pool returns a new pool on the test database, closed at cleanup.
func Pool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	return poolOn(tb, poolConfig(tb), maxConns)
}

// OutagePool is Pool through an outage proxy (internal/outageproxy): a test takes the proxy
// down to make PostgreSQL unreachable for this pool alone, without touching the server other
// tests share. The pool's tables are the test database's (use a DB's Schema with it).
func OutagePool(tb testing.TB, maxConns int32) (*pgxpool.Pool, *outageproxy.Proxy) {
	tb.Helper()
	cfg := poolConfig(tb)
	proxy := outageproxy.New(tb, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, err := net.SplitHostPort(proxy.Addr())
	if err != nil {
		tb.Fatalf("pgtest: outage proxy address: %v", err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		tb.Fatalf("pgtest: outage proxy port: %v", err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	return poolOn(tb, cfg, maxConns), proxy
}

func poolConfig(tb testing.TB) *pgxpool.Config {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		tb.Fatalf("pgtest: parsing TEST_DATABASE_URL: %v", err)
	}
	return cfg
}

func poolOn(tb testing.TB, cfg *pgxpool.Config, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg.MaxConns = maxConns
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 8
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg.AfterConnect = pgarray.AfterConnect // as the daemon's pool
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pgtest: connecting: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		tb.Fatalf("pgtest: PostgreSQL at %s does not answer: %v", redact(URL()), err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// ExampleDB is New for runnable examples, which have no testing.TB: it connects to URL()
// with a small pool, migrates a fresh schema named example_<name>_<random> and returns the
// pool, the schema and a cleanup that drops the schema and closes the pool. It panics, with
// a message saying what failed, if the database cannot be reached or migrated.
func ExampleDB(name string) (pool *pgxpool.Pool, schema string, cleanup func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		panic(fmt.Sprintf("pgtest: parsing TEST_DATABASE_URL: %v", err))
	}
	cfg.MaxConns = 4
	cfg.AfterConnect = pgarray.AfterConnect
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(fmt.Sprintf("pgtest: connecting: %v", err))
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema = "example_" + name + "_" + hex.EncodeToString(b[:])
	if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: schema}); err != nil {
		pool.Close()
		panic(fmt.Sprintf("pgtest: migrating schema %s on PostgreSQL at %s: %v", schema, redact(URL()), err))
	}
	return pool, schema, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	}
}

// SchemaName returns a schema name unique to this test and run.
func SchemaName(tb testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.ToLower(tb.Name())
	name = strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '_'
	}, name)
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return "t_" + name + "_" + hex.EncodeToString(b[:])
}

// Exec runs sql on the pool, failing the test on error.
func (db *DB) Exec(tb testing.TB, sql string, args ...any) {
	tb.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// Count returns SELECT count(*) of the query's FROM/WHERE part, e.g. Count(t, "outbox WHERE topic = $1", x).
// Table names are qualified with the test schema when written as {schema}.
func (db *DB) Count(tb testing.TB, from string, args ...any) int {
	tb.Helper()
	var n int
	q := "SELECT count(*) FROM " + db.Q(from)
	if err := db.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		tb.Fatalf("pgtest: %s: %v", q, err)
	}
	return n
}

// Text returns the one text value sql selects ({schema} qualified as in Count), "" for
// NULL or no row.
func (db *DB) Text(tb testing.TB, sql string, args ...any) string {
	tb.Helper()
	var v *string
	err := db.Pool.QueryRow(context.Background(), db.Q(sql), args...).Scan(&v)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		tb.Fatalf("pgtest: %s: %v", sql, err)
	}
	if v == nil {
		return ""
	}
	return *v
}

// Plan returns PostgreSQL's plan of sql with its arguments (EXPLAIN), planned with
// sequential scans disabled: a "Seq Scan" in it means that no index can serve the
// statement, whatever the tables' sizes.
func (db *DB) Plan(tb testing.TB, sql string, args ...any) string {
	tb.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		tb.Fatalf("pgtest: begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		tb.Fatalf("pgtest: EXPLAIN %s: %v", sql, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatalf("pgtest: EXPLAIN %s: %v", sql, err)
	}
	return strings.Join(lines, "\n")
}

// Q replaces {schema} in sql with the quoted test schema.
func (db *DB) Q(sql string) string {
	return strings.ReplaceAll(sql, "{schema}", pgx.Identifier{db.Schema}.Sanitize())
}

func redact(u string) string {
	if i := strings.Index(u, "@"); i >= 0 {
		if j := strings.Index(u, "://"); j >= 0 && j < i {
			return u[:j+3] + "…" + u[i:]
		}
	}
	return u
}
