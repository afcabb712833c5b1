// Package pgarray has array arguments that pgx encodes without an allocation per element.
//
// pgx encodes a []string through pgtype.FlatArray, whose Index returns each element as an
// interface value (a 16-byte allocation per string), and a [][]byte through reflection
// (an allocation per element as well, and reflection's cost). The types here return a
// pointer to each element instead, which an interface holds without allocating, and the
// element type gives pgx its value through pgtype.TextValuer or pgtype.BytesValuer. What
// reaches PostgreSQL is the same.
//
// On a connection where Register ran (the daemon's pool, from its AfterConnect) they skip
// pgx's element-by-element encoding altogether: each array writes its binary form itself,
// after one growth of pgx's buffer (binary.go). Reserve, called before a batch is sent,
// makes that one growth per statement, and grows pgx's write buffer once for the batch
// (reserve.go).
package pgarray

import (
	"database/sql/driver"

	"github.com/jackc/pgx/v5/pgtype"
)

// Text is a one-dimensional text[] argument. A nil Text is SQL NULL; its elements are
// never NULL.
type Text []string

// Bytes is a one-dimensional bytea[] argument. A nil Bytes is SQL NULL; a nil element is
// a NULL element, as in a [][]byte.
type Bytes [][]byte

type textElem string

func (e *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*e), Valid: true}, nil
}

type bytesElem []byte

func (e *bytesElem) BytesValue() ([]byte, error) { return *e, nil }

// Dimensions implements pgtype.ArrayGetter.
func (a Text) Dimensions() []pgtype.ArrayDimension { return dims(a) }

// Index implements pgtype.ArrayGetter.
func (a Text) Index(i int) any { return (*textElem)(&a[i]) }

// IndexType implements pgtype.ArrayGetter.
func (a Text) IndexType() any { return new(textElem) }

// Dimensions implements pgtype.ArrayGetter.
func (a Bytes) Dimensions() []pgtype.ArrayDimension { return dims(a) }

// Index implements pgtype.ArrayGetter.
func (a Bytes) Index(i int) any { return (*bytesElem)(&a[i]) }

// IndexType implements pgtype.ArrayGetter.
func (a Bytes) IndexType() any { return new(bytesElem) }

// UUID is a one-dimensional uuid[] argument. pgx encodes a []pgtype.UUID through
// reflection (its element type has no slice plan of its own); UUID hands it a pointer to
// each element, which is a pgtype.UUIDValuer. A nil UUID is SQL NULL; an element with
// Valid false is a NULL element.
type UUID []pgtype.UUID

// Dimensions implements pgtype.ArrayGetter.
func (a UUID) Dimensions() []pgtype.ArrayDimension { return dims(a) }

// Index implements pgtype.ArrayGetter.
func (a UUID) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a UUID) IndexType() any { return new(pgtype.UUID) }

// Value is the plain []pgtype.UUID, for pgx where the parameter's type is not known.
func (a UUID) Value() (driver.Value, error) { return []pgtype.UUID(a), nil }

// Value is the plain []string, for pgx where the parameter's type is not known.
func (a Text) Value() (driver.Value, error) { return []string(a), nil }

// Value is the plain [][]byte, for pgx where the parameter's type is not known.
func (a Bytes) Value() (driver.Value, error) { return [][]byte(a), nil }

// Int8 is a one-dimensional int8[] argument. A nil Int8 is SQL NULL. pgx encodes a []int64
// through pgtype.FlatArray, an interface value per element.
type Int8 []int64

// Dimensions implements pgtype.ArrayGetter.
func (a Int8) Dimensions() []pgtype.ArrayDimension { return dims(a) }

// Index implements pgtype.ArrayGetter.
func (a Int8) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a Int8) IndexType() any { return new(int64) }

// Value is the plain []int64, for pgx where the parameter's type is not known.
func (a Int8) Value() (driver.Value, error) { return []int64(a), nil }

// JSONB is a one-dimensional jsonb[] (or json[]) argument of JSON texts, which PostgreSQL
// checks. A nil JSONB is SQL NULL; its elements are never NULL.
type JSONB []string

// Dimensions implements pgtype.ArrayGetter.
func (a JSONB) Dimensions() []pgtype.ArrayDimension { return dims(a) }

// Index implements pgtype.ArrayGetter: the element is a string, which pgx's JSON codecs
// send as the JSON text it is.
func (a JSONB) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a JSONB) IndexType() any { return new(string) }

// Value is the plain []string, for pgx where the parameter's type is not known.
func (a JSONB) Value() (driver.Value, error) { return []string(a), nil }

// dims is the dimensions of a one-dimensional array a, nil (NULL) for a nil a.
func dims[T any](a []T) []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}
