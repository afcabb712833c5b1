// Package pgtext makes sender-controlled strings storable in PostgreSQL text and jsonb
// columns, which refuse NUL characters and invalid UTF-8 (SQLSTATE 22021, 22P05). idemd
// keeps such values (headers, ids in dead letters) for humans to read, so a lossy but visible
// replacement is the right trade: a dead letter that cannot be written would block its
// partition, which is worse.
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Clean returns s with invalid UTF-8 and NUL characters replaced by U+FFFD.
func Clean(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
