package exactlyonce

import (
	"errors"

	"github.com/idemd/idemd/internal/pgerr"
)

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: the message it came from will fail the same way on
// every retry, so it is dead-lettered after MaxAttempts instead of retried forever.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was marked Permanent or is a permanent database error
// (classes 22, 23, 42).
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p) || pgerr.IsPermanent(err)
}
