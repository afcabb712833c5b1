// Package printable makes text that senders control safe to show on an operator's terminal.
// Guarantee: what Escape returns holds only printable characters (letters, marks, numbers,
// punctuation, symbols and the ASCII space); every other byte or rune — C0 and C1 controls
// such as ESC and CSI, DEL, invalid UTF-8, line and paragraph separators, bidirectional
// overrides and other format characters — is written as a Go-style escape, and a backslash
// is doubled, so that two different inputs never print alike and no input can move the
// cursor, recolour the screen or reorder what follows it.
package printable

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Escape returns s with every non-printable character escaped: \n, \r and \t as such,
// invalid UTF-8 bytes as \xNN, other runes below U+0080 as \xNN, the rest as \uNNNN or
// \UNNNNNNNN. A backslash becomes \\. Printable text comes back unchanged (and unallocated).
func Escape(s string) string {
	if clean(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+size])
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += size
	}
	return b.String()
}

// Lines is Escape for multi-line text: each line is escaped and the line breaks are kept.
func Lines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Escape(l)
	}
	return strings.Join(lines, "\n")
}

// JSON escapes the non-printable characters that encoding/json leaves raw in its output
// (C1 controls, U+2028 and U+2029 when HTML escaping is off, bidirectional overrides,
// other format characters) as \uNNNN escapes. The result is the same JSON document:
// outside strings, JSON has only printable characters and the whitespace kept here (space,
// \t, \n, \r), which encoding/json never leaves raw inside a string.
func JSON(b []byte) []byte {
	if jsonClean(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == '\n', r == '\r', r == '\t', unicode.IsPrint(r) && !(r == utf8.RuneError && size == 1):
			out = append(out, b[i:i+size]...)
		case r == utf8.RuneError && size == 1:
			out = append(out, `\ufffd`...) // encoding/json never writes invalid UTF-8
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += size
	}
	return out
}

// clean reports whether s is printable as it is (no escape needed).
func clean(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '\\' {
			return cleanSlow(s)
		}
	}
	return true
}

// jsonClean reports whether JSON would leave b as it is.
func jsonClean(b []byte) bool {
	for i := 0; i < len(b); {
		c := b[i]
		if c < 0x80 {
			if c < 0x20 && c != '\n' && c != '\r' && c != '\t' || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if (r == utf8.RuneError && size == 1) || !unicode.IsPrint(r) {
			return false
		}
		i += size
	}
	return true
}

func cleanSlow(s string) bool {
	for _, r := range s {
		if r == '\\' || r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// JSONWriter returns a writer that passes each Write through JSON before w. Every Write
// must hold whole JSON values, as a json.Encoder writes them (one value per Encode call).
func JSONWriter(w io.Writer) io.Writer { return jsonWriter{w} }

type jsonWriter struct{ w io.Writer }

func (j jsonWriter) Write(b []byte) (int, error) {
	if _, err := j.w.Write(JSON(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}
