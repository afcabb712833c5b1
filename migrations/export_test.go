package migrations

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// MigrateTo moves schema to version, up or down (tests of one migration).
func MigrateTo(ctx context.Context, conn *pgx.Conn, schema string, version int32) error {
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	m, err := newMigrator(ctx, conn, schema)
	if err != nil {
		return err
	}
	return m.MigrateTo(ctx, version)
}
