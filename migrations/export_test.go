package migrations

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// MigrateTo moves schema, which must exist, to version: up, or down through the migrations'
// drop parts.
func MigrateTo(ctx context.Context, conn *pgx.Conn, schema string, version int32) error {
	m, err := newMigrator(ctx, conn, schema)
	if err != nil {
		return err
	}
	return m.MigrateTo(ctx, version)
}
