// Package pgerr classifies errors from PostgreSQL, once, for every part of idemd: a transient
// error means "retry the whole transaction later, nothing is wrong with the message"; a
// permanent one means "this message's effect will fail the same way every time".
package pgerr

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Class is what to do about an error.
type Class int

const (
	// Unknown errors are not database errors; callers decide (a Go handler's own error).
	Unknown Class = iota
	// Transient errors go away on retry: connection loss, serialization failure, deadlock,
	// admin shutdown, lack of resources.
	Transient
	// Permanent errors come back every time for the same input: bad data (class 22),
	// constraint violations (class 23), syntax or undefined objects (class 42), limits
	// exceeded by the input (class 54).
	Permanent
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Permanent:
		return "permanent"
	default:
		return "unknown"
	}
}

// Classify says whether err is transient, permanent or neither as far as PostgreSQL goes.
func Classify(err error) Class {
	if err == nil {
		return Unknown
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classifyCode(pgErr.Code)
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return Transient
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return Transient
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return Transient
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return Transient
	}
	// pgx reports a connection that died mid-query in several wrappers; they all say so.
	msg := err.Error()
	if strings.Contains(msg, "conn closed") || strings.Contains(msg, "conn busy") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe") ||
		strings.Contains(msg, "failed to connect") || strings.Contains(msg, "unexpected EOF") {
		return Transient
	}
	return Unknown
}

func classifyCode(code string) Class {
	switch {
	case code == "40001", code == "40P01": // serialization_failure, deadlock_detected
		return Transient
	case code == "55P03": // lock_not_available
		return Transient
	case code == "57P01", code == "57P02", code == "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		return Transient
	case strings.HasPrefix(code, "08"): // connection exceptions
		return Transient
	case strings.HasPrefix(code, "53"): // insufficient resources
		return Transient
	case code == "57014": // query_canceled (statement_timeout): load, not the message
		return Transient
	case strings.HasPrefix(code, "22"), strings.HasPrefix(code, "23"), strings.HasPrefix(code, "42"):
		return Permanent
	case strings.HasPrefix(code, "54"): // program limit exceeded (an index row too large…): the input's size
		return Permanent
	case strings.HasPrefix(code, "P0"): // raised by PL/pgSQL: the user's own rule
		return Permanent
	default:
		return Unknown
	}
}

// Code returns err's SQLSTATE when PostgreSQL answered with an error, else "".
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// IsTransient reports whether err should be retried with the whole transaction. A canceled or
// expired context is not transient: the caller is leaving.
func IsTransient(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return Classify(err) == Transient
}

// IsUnreachable reports whether err is the failure to open a connection to PostgreSQL:
// refused, closed during the handshake, a name that does not resolve, TLS or authentication
// refused, "the database system is starting up". No connection can be had now, unlike a
// failure of work on a connection that was open (serialization failure, deadlock, a
// connection lost mid-transaction), where a retry on another connection usually succeeds
// at once. Such an error is also transient: the database may be back in a moment.
func IsUnreachable(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr)
}

// IsPermanent reports whether err will fail the same way on every retry.
func IsPermanent(err error) bool {
	return Classify(err) == Permanent
}

// Redact returns what may be said of err where payloads may not go (logs above debug
// level): a database error's SQLSTATE and the schema names it gives (constraint, table,
// column, data type), without its message and detail, which quote the values PostgreSQL
// refused ("invalid input syntax for type integer: \"abc\"", "Key (id)=(42) already
// exists"). Any other error is returned whole: it is not PostgreSQL's quoting of the input.
func Redact(err error) string {
	if err == nil {
		return ""
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err.Error()
	}
	var b strings.Builder
	b.WriteString("SQLSTATE ")
	b.WriteString(pgErr.Code)
	for _, f := range []struct{ name, value string }{
		{"constraint", pgErr.ConstraintName}, {"table", pgErr.TableName},
		{"column", pgErr.ColumnName}, {"data type", pgErr.DataTypeName},
	} {
		if f.value != "" {
			b.WriteString(", ")
			b.WriteString(f.name)
			b.WriteString(" ")
			b.WriteString(f.value)
		}
	}
	return b.String()
}

// ForLog is err as a log line may carry it: whole where payloads may be logged (debug
// level), else Redact's account of it.
func ForLog(err error, payloads bool) string {
	if payloads && err != nil {
		return err.Error()
	}
	return Redact(err)
}
