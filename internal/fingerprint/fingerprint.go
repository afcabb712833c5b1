// Package fingerprint computes the payload fingerprints idemd compares when an id is seen
// again. Two payloads that mean the same JSON document (key order, whitespace) have the same
// fingerprint; fields that a provider changes between retries can be left out.
//
// The canonical form is computed in one pass over the body, without decoding it into Go
// values: strings and numbers are copied from the input (re-escaped only where they hold
// escapes), and each object's members are reordered in place. A body that is not exactly
// one JSON value of valid UTF-8 text is fingerprinted by its raw bytes. Unicode escapes
// that are not valid UTF-16 (an unpaired surrogate such as "\ud800") count as invalid
// text, like invalid UTF-8: decoding them would turn each into U+FFFD, so that different
// bodies would share one fingerprint.
package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"hash"
	"math"
	"slices"
	"sync"
	"unicode/utf8"
)

// Canonical returns the canonical form of a JSON document: object keys sorted (by their
// UTF-8 bytes; of a key given twice, the last member counts), no insignificant whitespace,
// numbers kept as written, strings escaped as encoding/json escapes them (without HTML
// escaping). Fields named by ignore (JSON pointers such as "/pending_webhooks" or
// "/data/previous_attributes", through objects only) are removed. ok is false when body
// is not a single JSON value of valid text; then the caller should use the raw bytes.
func Canonical(body []byte, ignore ...string) (out []byte, ok bool) {
	c := getCanon()
	defer putCanon(c)
	if !c.canonical(body, ignore) {
		return nil, false
	}
	return bytes.Clone(c.out), true
}

// Body is the fingerprint of a message body: SHA-256 of its canonical JSON, or of its raw
// bytes when it is not JSON.
func Body(body []byte, ignore ...string) []byte {
	fp, _ := BodyCanonical(body, ignore...)
	return fp
}

// BodyCanonical is Body, and whether body had a canonical form: one JSON value of valid
// text, nothing but white space after it, no escaped unpaired surrogate. A door that must
// check that before it reads the body's fields (jsonpointer.Valid accepts every body that
// has one) reads a JSON body once instead of twice.
func BodyCanonical(body []byte, ignore ...string) (fp []byte, canonical bool) {
	c := getCanon()
	defer putCanon(c)
	if c.canonical(body, ignore) {
		return c.sum(jsonTag, c.out), true
	}
	return c.sum(rawTag, body), false
}

// BodyJSON is Body(body), without ignored fields, and whether body is JSON as
// encoding/json sees it: exactly json.Valid(body) && utf8.Valid(body). A door that needs
// both (the Kafka door's content-type) reads a JSON body once instead of twice; a body that
// is not canonical JSON (not JSON, or JSON with an unpaired surrogate) is checked again by
// json.Valid.
func BodyJSON(body []byte) (fp []byte, isJSON bool) {
	c := getCanon()
	defer putCanon(c)
	if c.canonical(body, nil) {
		// canonical accepts what bytes.TrimSpace trims after the value; encoding/json
		// only its four white-space bytes.
		return c.sum(jsonTag, c.out), onlyJSONSpace(body[c.pos:])
	}
	return c.sum(rawTag, body), utf8.Valid(body) && json.Valid(body)
}

// onlyJSONSpace reports whether b holds nothing but JSON's white space.
func onlyJSONSpace(b []byte) bool {
	for _, x := range b {
		if x != ' ' && x != '\t' && x != '\n' && x != '\r' {
			return false
		}
	}
	return true
}

// Request is the fingerprint of an API request: method, path and the canonical body.
func Request(method, path string, body []byte) []byte {
	c := getCanon()
	defer putCanon(c)
	m, p := []byte(method), []byte(path)
	if c.canonical(body, nil) {
		return c.sum(m, p, jsonTag, c.out)
	}
	return c.sum(m, p, rawTag, body)
}

var (
	jsonTag = []byte("json")
	rawTag  = []byte("raw")
)

// Sum hashes parts with their lengths, so that ("ab","c") and ("a","bc") differ.
func Sum(parts ...[]byte) []byte {
	return sumWith(sha256.New(), new([8]byte), parts)
}

// sumWith is Sum with a given hash and length buffer (which escape through the hash's
// interface, so that a caller that reuses them allocates only the result).
func sumWith(h hash.Hash, n *[8]byte, parts [][]byte) []byte {
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return h.Sum(make([]byte, 0, sha256.Size))
}

// maxDepth is encoding/json's nesting limit: a deeper document is not JSON to it, so it is
// not JSON here either, and fingerprints stay what they were.
const maxDepth = 10000

// maxPooled is the largest buffer kept for reuse: one huge body must not pin its memory.
const maxPooled = 1 << 20

// canon is the reusable state of one canonicalization.
type canon struct {
	in  []byte
	pos int
	// out is the canonical form being written.
	out []byte
	// members are the members of every object being written, innermost last.
	members []member
	// keys holds the decoded form of keys that contain escapes.
	keys []byte
	// text holds a decoded string while it is re-escaped; scratch, an object's members
	// while they are reordered.
	text, scratch []byte
	// live are the ignore pointers still matching the path, per object being written.
	live   []live
	ignore []string
	depth  int
	h      hash.Hash
	n      [8]byte
}

// member is one member of an object: its decoded key and its span in out, from the key's
// opening quote to the end of its value (the comma before it excluded).
type member struct {
	// prefix is the key's first eight bytes, big-endian, zero-padded: members are ordered
	// by it first, and by the whole key only where it is equal.
	prefix         uint64
	keyOff, keyLen int32
	start, end     int32
	keyInInput     bool
}

// keyPrefix is member.prefix of key.
func keyPrefix(key []byte) uint64 {
	if len(key) >= 8 {
		return binary.BigEndian.Uint64(key)
	}
	var p uint64
	for i, b := range key {
		p |= uint64(b) << (56 - 8*i)
	}
	return p
}

// compare orders a and b by their keys' bytes.
func (c *canon) compare(a, b *member) int {
	switch {
	case a.prefix < b.prefix:
		return -1
	case a.prefix > b.prefix:
		return 1
	}
	return bytes.Compare(c.key(a), c.key(b))
}

// live is an ignore pointer that matched the path so far: off is the index of the '/'
// starting its next token.
type live struct {
	ptr string
	off int
}

var pool = sync.Pool{New: func() any { return &canon{h: sha256.New()} }}

func getCanon() *canon { return pool.Get().(*canon) }

func putCanon(c *canon) {
	if cap(c.out) > maxPooled || cap(c.scratch) > maxPooled || cap(c.text) > maxPooled || cap(c.keys) > maxPooled {
		return
	}
	c.in, c.ignore = nil, nil
	pool.Put(c)
}

func (c *canon) sum(parts ...[]byte) []byte {
	c.h.Reset()
	return sumWith(c.h, &c.n, parts)
}

// canonical writes body's canonical form into c.out and reports whether body is one JSON
// value of valid text.
func (c *canon) canonical(body []byte, ignore []string) bool {
	// Invalid UTF-8 would be decoded as U+FFFD: two different bodies, one fingerprint.
	// Offsets are kept as int32: a body of 2 GiB or more is not canonicalized.
	if len(body) > math.MaxInt32/2 || !utf8.Valid(body) {
		return false
	}
	c.in, c.pos, c.depth, c.ignore = body, 0, 0, ignore
	c.out, c.members, c.keys, c.live = c.out[:0], c.members[:0], c.keys[:0], c.live[:0]
	for _, p := range ignore {
		if p != "" && p[0] == '/' {
			c.live = append(c.live, live{ptr: p})
		}
	}
	c.space()
	if !c.value(0, len(c.live)) {
		return false
	}
	// What follows the value may only be white space (as bytes.TrimSpace sees it).
	return len(bytes.TrimSpace(body[c.pos:])) == 0
}

func (c *canon) space() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// value writes the value at c.pos; c.live[lo:hi] are the ignore pointers that apply to its
// members when it is an object.
func (c *canon) value(lo, hi int) bool {
	if c.pos >= len(c.in) {
		return false
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object(lo, hi)
	case b == '[':
		return c.array()
	case b == '"':
		start, end, escaped, ok := c.str()
		if !ok {
			return false
		}
		return c.writeString(start, end, escaped)
	case b == '-' || (b >= '0' && b <= '9'):
		start := c.pos
		if !c.number() {
			return false
		}
		c.out = append(c.out, c.in[start:c.pos]...)
		return true
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return false
}

func (c *canon) literal(lit string) bool {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(lit)) {
		return false
	}
	c.pos += len(lit)
	c.out = append(c.out, lit...)
	return true
}

// number skips a JSON number (RFC 8259 grammar) at c.pos.
func (c *canon) number() bool {
	in, i := c.in, c.pos
	if i < len(in) && in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && in[i] >= '1' && in[i] <= '9':
		i = digits(in, i)
	default:
		return false
	}
	if i < len(in) && in[i] == '.' {
		j := digits(in, i+1)
		if j == i+1 {
			return false
		}
		i = j
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		j := digits(in, i)
		if j == i {
			return false
		}
		i = j
	}
	c.pos = i
	return true
}

func digits(in []byte, i int) int {
	for i < len(in) && in[i] >= '0' && in[i] <= '9' {
		i++
	}
	return i
}

// str skips the string at c.pos and returns the span of its contents (quotes excluded) and
// whether it holds escapes, or a 0xE2 byte (which may start U+2028 or U+2029, written
// escaped): escaped is false when the contents are their own canonical form. Escapes are
// checked for syntax here, for meaning by unescape.
func (c *canon) str() (start, end int, escaped, ok bool) {
	in := c.in
	i := c.pos + 1
	start = i
	for i < len(in) {
		if !strStop[in[i]] {
			i++
			continue
		}
		switch b := in[i]; {
		case b == '"':
			c.pos = i + 1
			return start, i, escaped, true
		case b == '\\':
			escaped = true
			if i+1 >= len(in) {
				return 0, 0, false, false
			}
			switch in[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(in) || !isHex(in[i+2]) || !isHex(in[i+3]) || !isHex(in[i+4]) || !isHex(in[i+5]) {
					return 0, 0, false, false
				}
				i += 6
			default:
				return 0, 0, false, false
			}
		case b < 0x20:
			return 0, 0, false, false
		default: // 0xE2
			escaped = true
			i++
		}
	}
	return 0, 0, false, false
}

// strStop marks the bytes str stops at inside a string: '"', '\\', control characters
// and 0xE2.
var strStop = func() (t [256]bool) {
	for b := range 0x20 {
		t[b] = true
	}
	t['"'], t['\\'], t[0xe2] = true, true, true
	return t
}()

func isHex(b byte) bool {
	return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F')
}

func hexVal(b []byte) rune {
	var r rune
	for _, x := range b[:4] {
		r <<= 4
		switch {
		case x >= '0' && x <= '9':
			r |= rune(x - '0')
		case x >= 'a' && x <= 'f':
			r |= rune(x - 'a' + 10)
		default:
			r |= rune(x - 'A' + 10)
		}
	}
	return r
}

// unescape appends the text of string contents raw (syntax already checked by str) to dst.
// ok is false when an escape is not valid UTF-16: an unpaired surrogate.
func unescape(dst, raw []byte) ([]byte, bool) {
	for i := 0; i < len(raw); {
		b := raw[i]
		if b != '\\' {
			j := i + 1
			for j < len(raw) && raw[j] != '\\' {
				j++
			}
			dst = append(dst, raw[i:j]...)
			i = j
			continue
		}
		switch e := raw[i+1]; e {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hexVal(raw[i+2:])
			switch {
			case r >= 0xd800 && r < 0xdc00:
				// A high surrogate must be followed by an escaped low one.
				if i+12 > len(raw) || raw[i+6] != '\\' || raw[i+7] != 'u' {
					return dst, false
				}
				lo := hexVal(raw[i+8:])
				if lo < 0xdc00 || lo > 0xdfff {
					return dst, false
				}
				dst = utf8.AppendRune(dst, 0x10000+(r-0xd800)<<10+(lo-0xdc00))
				i += 12
				continue
			case r >= 0xdc00 && r <= 0xdfff:
				return dst, false
			}
			dst = utf8.AppendRune(dst, r)
			i += 6
			continue
		default: // '"', '\\', '/'
			dst = append(dst, e)
		}
		i += 2
	}
	return dst, true
}

const hexDigits = "0123456789abcdef"

// writeString writes the string whose contents are c.in[start:end] (str's span), escaped
// exactly as encoding/json's encoder (HTML escaping off) escapes its decoded text; escaped
// is str's.
func (c *canon) writeString(start, end int, escaped bool) bool {
	if !escaped {
		// str has seen no '"', '\\', control character, or 0xE2 (U+2028 and U+2029 are
		// E2 80 A8 and E2 80 A9): the string is written as it is, quotes included.
		c.out = append(c.out, c.in[start-1:end+1]...)
		return true
	}
	var ok bool
	if c.text, ok = unescape(c.text[:0], c.in[start:end]); !ok {
		return false
	}
	c.out = appendQuoted(c.out, c.text)
	return true
}

// appendQuoted appends s (valid UTF-8) quoted and escaped as encoding/json does with
// SetEscapeHTML(false): '"', '\\' and control characters escaped, U+2028 and U+2029 as
// \u2028 and \u2029, everything else as it is.
func appendQuoted(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b >= 0x20 && b != '"' && b != '\\' && b != 0xe2 {
			i++
			continue
		}
		if b == 0xe2 {
			// U+2028 and U+2029 are E2 80 A8 and E2 80 A9.
			if i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xa8 || s[i+2] == 0xa9) {
				dst = append(dst, s[start:i]...)
				dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[s[i+2]&0xf])
				i += 3
				start = i
				continue
			}
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		switch b {
		case '\\', '"':
			dst = append(dst, '\\', b)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// open starts an array or object at c.pos and reports whether it is empty (then it is also
// closed) or too deep.
func (c *canon) open(opener, closer byte) (empty, ok bool) {
	c.depth++
	if c.depth > maxDepth {
		return false, false
	}
	c.pos++
	c.out = append(c.out, opener)
	c.space()
	if c.pos < len(c.in) && c.in[c.pos] == closer {
		c.pos++
		c.depth--
		c.out = append(c.out, closer)
		return true, true
	}
	return false, true
}

// next moves past the ',' before the next element (more) or past closer (not more, and the
// caller writes it).
func (c *canon) next(closer byte) (more, ok bool) {
	c.space()
	if c.pos >= len(c.in) {
		return false, false
	}
	switch c.in[c.pos] {
	case ',':
		c.pos++
		c.space()
		return true, true
	case closer:
		c.pos++
		c.depth--
		return false, true
	}
	return false, false
}

func (c *canon) array() bool {
	if empty, ok := c.open('[', ']'); empty || !ok {
		return ok
	}
	for n := 0; ; n++ {
		if n > 0 {
			c.out = append(c.out, ',')
		}
		// Pointers do not go through arrays: none applies inside.
		if !c.value(len(c.live), len(c.live)) {
			return false
		}
		more, ok := c.next(']')
		if !ok {
			return false
		}
		if !more {
			c.out = append(c.out, ']')
			return true
		}
	}
}

// key returns a member's decoded key.
func (c *canon) key(m *member) []byte {
	if m.keyInInput {
		return c.in[m.keyOff : m.keyOff+m.keyLen]
	}
	return c.keys[m.keyOff : m.keyOff+m.keyLen]
}

func (c *canon) object(lo, hi int) bool {
	if empty, ok := c.open('{', '}'); empty || !ok {
		return ok
	}
	body := len(c.out)
	base := len(c.members)
	for {
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return false
		}
		ks, ke, escaped, ok := c.str()
		if !ok {
			return false
		}
		m := member{keyOff: int32(ks), keyLen: int32(ke - ks), keyInInput: true}
		if escaped {
			off := len(c.keys)
			if c.keys, ok = unescape(c.keys, c.in[ks:ke]); !ok {
				return false
			}
			m = member{keyOff: int32(off), keyLen: int32(len(c.keys) - off)}
		}
		m.prefix = keyPrefix(c.key(&m))
		c.space()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return false
		}
		c.pos++
		c.space()

		// Pointers that name this member remove it; those that go through it apply to
		// its value.
		key := c.key(&m)
		skip := false
		clo := len(c.live)
		for i := lo; i < hi; i++ {
			l := c.live[i]
			next, last, match := token(l.ptr, l.off, key)
			switch {
			case !match:
			case last:
				skip = true
			default:
				c.live = append(c.live, live{ptr: l.ptr, off: next})
			}
		}
		chi := len(c.live)

		comma := len(c.out)
		if len(c.members) > base {
			c.out = append(c.out, ',')
		}
		m.start = int32(len(c.out))
		if !c.writeString(ks, ke, escaped) {
			return false
		}
		c.out = append(c.out, ':')
		if !c.value(clo, chi) {
			return false
		}
		c.live = c.live[:clo]
		m.end = int32(len(c.out))
		if skip {
			c.out = c.out[:comma]
		} else {
			c.members = append(c.members, m)
		}

		more, ok := c.next('}')
		if !ok {
			return false
		}
		if !more {
			c.finish(body, base)
			c.out = append(c.out, '}')
			return true
		}
	}
}

// smallObject is the most members that finish sorts by insertion.
const smallObject = 16

// finish puts the members written since out[body] (c.members[base:]) in key order, keeping
// the last of equal keys, as decoding into a map and sorting its keys does.
func (c *canon) finish(body, base int) {
	ms := c.members[base:]
	defer func() { c.members = c.members[:base] }()
	sorted := true
	for i := 1; i < len(ms); i++ {
		if c.compare(&ms[i-1], &ms[i]) >= 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return
	}
	if len(ms) <= smallObject {
		// Insertion sort, stable: a member moves only past greater keys.
		for i := 1; i < len(ms); i++ {
			for j := i; j > 0 && c.compare(&ms[j], &ms[j-1]) < 0; j-- {
				ms[j], ms[j-1] = ms[j-1], ms[j]
			}
		}
	} else {
		slices.SortStableFunc(ms, func(a, b member) int { return c.compare(&a, &b) })
	}
	c.scratch = append(c.scratch[:0], c.out[body:]...)
	c.out = c.out[:body]
	for i := range ms {
		if i+1 < len(ms) && ms[i].prefix == ms[i+1].prefix && bytes.Equal(c.key(&ms[i]), c.key(&ms[i+1])) {
			continue // a later member has the same key
		}
		if len(c.out) > body {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, c.scratch[int(ms[i].start)-body:int(ms[i].end)-body]...)
	}
}

// token matches the JSON pointer token of ptr that starts at ptr[off] ('/') against key:
// "~1" stands for '/', "~0" for '~'. next is the index of the following '/', last is true
// when the token is ptr's last.
func token(ptr string, off int, key []byte) (next int, last, match bool) {
	i, k := off+1, 0
	for i < len(ptr) && ptr[i] != '/' {
		b := ptr[i]
		i++
		if b == '~' && i < len(ptr) && (ptr[i] == '0' || ptr[i] == '1') {
			if ptr[i] == '1' {
				b = '/'
			}
			i++
		}
		if k >= len(key) || key[k] != b {
			// Skip to the token's end.
			for i < len(ptr) && ptr[i] != '/' {
				i++
			}
			return i, i == len(ptr), false
		}
		k++
	}
	return i, i == len(ptr), k == len(key)
}
