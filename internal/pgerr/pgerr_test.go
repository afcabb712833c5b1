package pgerr

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	cases := []struct {
		code string
		want Class
	}{
		{"40001", Transient}, {"40P01", Transient}, {"57P01", Transient}, {"53300", Transient},
		{"53200", Transient}, {"08006", Transient},
		{"22P02", Permanent}, {"54000", Permanent}, {"23505", Permanent}, {"23503", Permanent}, {"42P01", Permanent}, {"42601", Permanent},
		{"XX000", Unknown},
	}
	for _, c := range cases {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: c.code})
		require.Equal(t, c.want, Classify(err), c.code)
	}
	require.False(t, IsTransient(context.Canceled))
	require.Equal(t, Unknown, Classify(errors.New("handler said no")))
}

func TestCode(t *testing.T) {
	t.Parallel()
	require.Equal(t, "42501", Code(fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "42501"})))
	require.Empty(t, Code(errors.New("not from PostgreSQL")))
	require.Empty(t, Code(nil))
}

func TestRedact(t *testing.T) {
	t.Parallel()
	refused := fmt.Errorf("effect: %w", &pgconn.PgError{Code: "22P02", Message: `invalid input syntax for type integer: "card 4242"`})
	require.Equal(t, "SQLSTATE 22P02", Redact(refused))
	dup := &pgconn.PgError{Code: "23505", Message: `duplicate key value violates unique constraint "payments_pkey"`,
		Detail: "Key (id)=(secret-42) already exists.", ConstraintName: "payments_pkey", TableName: "payments"}
	require.Equal(t, "SQLSTATE 23505, constraint payments_pkey, table payments", Redact(dup))
	require.Equal(t, "handler said no", Redact(errors.New("handler said no")))
	require.Empty(t, Redact(nil))
}

func TestIsUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Port 1 on the loopback: nothing listens there, the connection is refused.
	_, err := pgconn.Connect(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=5")
	require.Error(t, err)
	wrapped := fmt.Errorf("error beginning transaction: %w", err)
	require.True(t, IsUnreachable(wrapped), "%v", err)
	require.True(t, IsTransient(wrapped), "an unreachable database may be back in a moment")

	for _, err := range []error{
		&pgconn.PgError{Code: "40001"}, &pgconn.PgError{Code: "40P01"}, &pgconn.PgError{Code: "57P01"},
		errors.New("conn closed"), context.DeadlineExceeded, nil,
	} {
		require.False(t, IsUnreachable(err), "%v", err)
	}
}
