package config

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PrepareSQL asks PostgreSQL to prepare every effect's SQL without running it, and returns
// every statement that does not prepare (missing table, syntax, type mismatch), each naming
// the file, pipeline and field. The statements are described on one connection with the
// unnamed statement, so nothing stays behind on the server.
func (f *File) PrepareSQL(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("error acquiring a connection to prepare effect SQL: %w", err)
	}
	defer conn.Release()

	var errs []error
	check := func(w *where, e *Effect) {
		if w == nil || e == nil || strings.TrimSpace(e.SQL) == "" {
			return
		}
		if err := prepare(ctx, conn.Conn(), e.SQL); err != nil {
			if ctx.Err() != nil {
				errs = append(errs, err)
				return
			}
			msg := "does not prepare: " + err.Error()
			if w.commented["effect.sql"] {
				msg += ` (the unquoted value is followed by a YAML comment: " #" starts one, as in the jsonb operator #>>; quote the SQL)`
			}
			errs = append(errs, &Error{File: f.Path, Line: w.lineOf("effect.sql"), Pipeline: w.label, Field: "effect.sql", Msg: msg})
		}
	}
	for _, s := range f.Sources {
		check(s.loc, s.Effect)
	}
	for _, s := range f.Subscriptions {
		check(s.loc, s.Effect)
	}
	return errors.Join(errs...)
}

// prepare rewrites the named arguments the way pgx does when the effect runs, then has the
// server parse and describe the statement.
func prepare(ctx context.Context, conn *pgx.Conn, sql string) error {
	args := pgx.NamedArgs{}
	for _, name := range SQLParameters {
		args[name] = nil
	}
	rewritten, _, err := args.RewriteQuery(ctx, conn, sql, nil)
	if err != nil {
		return err
	}
	_, err = conn.PgConn().Prepare(ctx, "", rewritten, nil)
	return err
}
