package config

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/effectsql"
)

// PrepareSQL asks PostgreSQL to prepare every effect's SQL (and every delete.sql) without running it, and returns
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
	check := func(w *where, field, sql string) {
		if w == nil || strings.TrimSpace(sql) == "" {
			return
		}
		if err := prepare(ctx, conn.Conn(), sql); err != nil {
			if ctx.Err() != nil {
				errs = append(errs, err)
				return
			}
			msg := "does not prepare: " + err.Error()
			if w.commented[field] {
				msg += ` (the unquoted value is followed by a YAML comment: " #" starts one, as in the jsonb operator #>>; quote the SQL)`
			}
			errs = append(errs, &Error{File: f.Path, Line: w.lineOf(field), Pipeline: w.label, Field: field, Msg: msg})
		}
	}
	for _, s := range f.Sources {
		check(f.locs[s], "effect.sql", s.Effect.SQL)
		if s.Delete != nil {
			check(f.locs[s], "delete.sql", s.Delete.SQL)
		}
	}
	for _, s := range f.Subscriptions {
		check(f.locs[s], "effect.sql", s.Effect.SQL)
	}
	return errors.Join(errs...)
}

// prepare has the server prepare sql (internal/effectsql). Unknown parameters are not its
// concern here: the file's validation reports them, with their line.
func prepare(ctx context.Context, conn *pgx.Conn, sql string) error {
	_, _, err := effectsql.Compile(ctx, conn, sql)
	if errors.Is(err, effectsql.ErrUnknownParameter) {
		return nil
	}
	return err
}
