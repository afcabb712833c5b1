package pgarray

import (
	"context"
	"encoding/binary"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Register makes the connection of m encode this package's arrays itself in PostgreSQL's
// binary array format, with one growth of pgx's parameter buffer per array. Without it pgx
// encodes them element by element (Index, a plan per element, a call per value) into a
// buffer that it lets go of after each statement (above 256 bytes) and so rebuilds by
// doubling for every statement: for the unit's batches that was a tenth of the daemon's
// CPU and a quarter of the bytes it allocated (BENCHMARKS.md, phase 14). What reaches
// PostgreSQL is the same bytes.
//
// Register wraps the codecs of text[], varchar[], bytea[], uuid[], int8[], json[] and
// jsonb[]: a value of another type, and the text format (the simple protocol), still go
// through pgx's own codec. It also encodes a []any of strings and nils (the columns of a
// multi-message effect) for text[], varchar[], json[] and jsonb[]; any other element sends
// that value through pgx's codec. Call it from the pool's AfterConnect, as for pgx's
// other type extensions; calling it again on the same map does nothing. pgx's CopyFrom no
// longer recognises these types as arrays when it is given one as a string (the daemon
// never does: its only COPY is the bench's, of no array column).
func Register(m *pgtype.Map) {
	if Registered(m) {
		return
	}
	// First: a reservation (Reserve) is a struct, which pgx's own wrappers would take for a
	// composite value.
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapReserved}, m.TryWrapEncodePlanFuncs...)
	for _, a := range wrapped {
		t, ok := m.TypeForOID(a.array)
		if !ok {
			continue
		}
		if _, done := t.Codec.(*codec); done {
			continue
		}
		m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: &codec{Codec: t.Codec, elem: a.elem}})
	}
}

// Registered says whether Register ran on m.
func Registered(m *pgtype.Map) bool {
	t, ok := m.TypeForOID(pgtype.TextArrayOID)
	if !ok {
		return false
	}
	_, ok = t.Codec.(*codec)
	return ok
}

// AfterConnect is Register as a pgxpool.Config.AfterConnect.
func AfterConnect(_ context.Context, c *pgx.Conn) error {
	Register(c.TypeMap())
	return nil
}

var wrapped = []struct{ array, elem uint32 }{
	{pgtype.TextArrayOID, pgtype.TextOID},
	{pgtype.VarcharArrayOID, pgtype.VarcharOID},
	{pgtype.ByteaArrayOID, pgtype.ByteaOID},
	{pgtype.UUIDArrayOID, pgtype.UUIDOID},
	{pgtype.Int8ArrayOID, pgtype.Int8OID},
	{pgtype.JSONArrayOID, pgtype.JSONOID},
	{pgtype.JSONBArrayOID, pgtype.JSONBOID},
}

// codec is an array type's codec (pgtype.ArrayCodec) with this package's binary encoding in
// front of it; scanning and decoding are the wrapped codec's.
type codec struct {
	pgtype.Codec
	elem uint32 // the element type's OID
}

func (c *codec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if format == pgtype.BinaryFormatCode {
		switch v := value.(type) {
		case binaryArray:
			if v.elemOK(c.elem) {
				return encodeArray{elem: c.elem}
			}
		case []any:
			// pgx encodes a []any through reflection, as the elements of an ArrayGetter:
			// pgtype.FlatArray[any] is that ArrayGetter, for the elements that are not strings.
			if textual(c.elem) {
				if next := c.Codec.PlanEncode(m, oid, format, pgtype.FlatArray[any](nil)); next != nil {
					return &encodeStrings{elem: c.elem, next: next}
				}
			}
		}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

// binaryArray is an array of this package: its binary form, computed in one pass.
type binaryArray interface {
	elemOK(oid uint32) bool
	null() bool
	len() int
	// size is the length of the binary form of the elements (each with its length word),
	// and whether one of them is NULL.
	size() (n int, hasNull bool)
	appendElems(buf []byte, elem uint32) []byte
}

const arrayHeaderLen = 20 // ndim, has-null flag, element OID, one dimension's length and lower bound

// appendHeader appends the header of a one-dimensional array of n elements, as pgx's
// ArrayCodec writes it (a dimension of length 0 for an empty array).
func appendHeader(buf []byte, n int, hasNull bool, elem uint32) []byte {
	var flag uint32
	if hasNull {
		flag = 1
	}
	buf = binary.BigEndian.AppendUint32(buf, 1)
	buf = binary.BigEndian.AppendUint32(buf, flag)
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	return binary.BigEndian.AppendUint32(buf, 1)
}

type encodeArray struct{ elem uint32 }

func (p encodeArray) Encode(value any, buf []byte) ([]byte, error) {
	a := value.(binaryArray)
	if a.null() {
		return nil, nil
	}
	n, hasNull := a.size()
	buf = slices.Grow(buf, arrayHeaderLen+n)
	buf = appendHeader(buf, a.len(), hasNull, p.elem)
	return a.appendElems(buf, p.elem), nil
}

// textual says whether strings are the binary form of the element type (text, varchar and
// json), or are with a version byte in front (jsonb).
func textual(elem uint32) bool {
	switch elem {
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.JSONOID, pgtype.JSONBOID:
		return true
	}
	return false
}

// encodeStrings encodes a []any of strings and nils; another element hands the whole value
// to next, the wrapped codec's plan.
type encodeStrings struct {
	elem uint32
	next pgtype.EncodePlan
}

func (p *encodeStrings) Encode(value any, buf []byte) ([]byte, error) {
	s := value.([]any)
	if s == nil {
		return nil, nil
	}
	n, hasNull := 0, false
	for _, e := range s {
		switch v := e.(type) {
		case string:
			n += 4 + len(v) + jsonbVersion(p.elem)
		case nil:
			n += 4
			hasNull = true
		default:
			return p.next.Encode(pgtype.FlatArray[any](s), buf)
		}
	}
	buf = slices.Grow(buf, arrayHeaderLen+n)
	buf = appendHeader(buf, len(s), hasNull, p.elem)
	for _, e := range s {
		if v, ok := e.(string); ok {
			buf = appendString(buf, v, p.elem)
		} else {
			buf = appendNull(buf)
		}
	}
	return buf, nil
}

// jsonbVersion is the length of the version byte that jsonb's binary form begins with.
func jsonbVersion(elem uint32) int {
	if elem == pgtype.JSONBOID {
		return 1
	}
	return 0
}

func appendString(buf []byte, s string, elem uint32) []byte {
	if elem == pgtype.JSONBOID {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)+1))
		buf = append(buf, 1)
	} else {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
	}
	return append(buf, s...)
}

func appendNull(buf []byte) []byte { return binary.BigEndian.AppendUint32(buf, 0xFFFFFFFF) }

func (a Text) elemOK(oid uint32) bool { return oid == pgtype.TextOID || oid == pgtype.VarcharOID }
func (a Text) null() bool             { return a == nil }
func (a Text) len() int               { return len(a) }
func (a Text) size() (int, bool) {
	n := 4 * len(a)
	for _, s := range a {
		n += len(s)
	}
	return n, false
}
func (a Text) appendElems(buf []byte, elem uint32) []byte {
	for _, s := range a {
		buf = appendString(buf, s, elem)
	}
	return buf
}

func (a JSONB) elemOK(oid uint32) bool { return oid == pgtype.JSONBOID || oid == pgtype.JSONOID }
func (a JSONB) null() bool             { return a == nil }
func (a JSONB) len() int               { return len(a) }
func (a JSONB) size() (int, bool) {
	n, _ := Text(a).size()
	return n + len(a)*jsonbVersion(pgtype.JSONBOID), false // room for jsonb's version bytes
}
func (a JSONB) appendElems(buf []byte, elem uint32) []byte { return Text(a).appendElems(buf, elem) }

func (a Bytes) elemOK(oid uint32) bool { return oid == pgtype.ByteaOID }
func (a Bytes) null() bool             { return a == nil }
func (a Bytes) len() int               { return len(a) }
func (a Bytes) size() (int, bool) {
	n, hasNull := 4*len(a), false
	for _, b := range a {
		n += len(b)
		hasNull = hasNull || b == nil
	}
	return n, hasNull
}
func (a Bytes) appendElems(buf []byte, _ uint32) []byte {
	for _, b := range a {
		if b == nil {
			buf = appendNull(buf)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(b)))
		buf = append(buf, b...)
	}
	return buf
}

func (a UUID) elemOK(oid uint32) bool { return oid == pgtype.UUIDOID }
func (a UUID) null() bool             { return a == nil }
func (a UUID) len() int               { return len(a) }
func (a UUID) size() (int, bool) {
	n, hasNull := 0, false
	for _, u := range a {
		if u.Valid {
			n += 4 + 16
		} else {
			n += 4
			hasNull = true
		}
	}
	return n, hasNull
}
func (a UUID) appendElems(buf []byte, _ uint32) []byte {
	for i := range a {
		if !a[i].Valid {
			buf = appendNull(buf)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, 16)
		buf = append(buf, a[i].Bytes[:]...)
	}
	return buf
}

func (a Int8) elemOK(oid uint32) bool { return oid == pgtype.Int8OID }
func (a Int8) null() bool             { return a == nil }
func (a Int8) len() int               { return len(a) }
func (a Int8) size() (int, bool)      { return 12 * len(a), false }
func (a Int8) appendElems(buf []byte, _ uint32) []byte {
	for _, v := range a {
		buf = binary.BigEndian.AppendUint32(buf, 8)
		buf = binary.BigEndian.AppendUint64(buf, uint64(v))
	}
	return buf
}
