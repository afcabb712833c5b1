package exactlyonce

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/processed"
)

// Business errors. An API effect may answer with something other than its result — a
// declined card (402), an unknown product (404), a rule of the business (409, 422) — and
// that answer is stored and replayed byte for byte, like a success, to every retry with the
// same key: it is the answer of the request, not a failure of idemd. The effect's writes
// commit with it (a SQL effect that records the declined attempt keeps the record), but the
// message's events are published only for a 2xx answer. Transient failures are never
// stored: they roll back and are answered "retry later".

// StatusColumn is the column that makes a row a business answer: when the first row an
// API effect's SQL returns has an integer StatusColumn, that is the answer's status, and
// the row without the column is its body.
const StatusColumn = "http_status"

// BusinessError is the answer a Go effect (Effect.Func) returns instead of its result. With
// Message.Answer set it becomes the stored answer (status Status, body Body as JSON: nil,
// json.RawMessage or []byte as they are, any other value encoded); elsewhere (a webhook, a
// consumed record) there is no answer to give, and it is a permanent failure.
type BusinessError struct {
	// Status is the answer's HTTP status, 200 to 599.
	Status int
	// Body is the answer's body.
	Body any
}

func (e *BusinessError) Error() string {
	return "the effect answered status " + strconv.Itoa(e.Status)
}

// result is what an effect returned.
type result struct {
	// body is the result as JSON; nil when there is none.
	body []byte
	// affected counts the rows the SQL affected (inserted, updated, deleted or returned);
	// -1 when no SQL ran.
	affected int64
	// reply is set when the effect answered a business error (or a StatusColumn row).
	reply *processed.Response
}

// rowsResult turns the rows an effect's SQL returned into its result: nil for none, an object
// for one, an array for more. With asAnswer, a StatusColumn in the first row is read (and
// removed from every row).
func rowsResult(rows []map[string]any, affected int64, asAnswer bool) (*result, error) {
	r := &result{affected: affected}
	if len(rows) == 0 {
		return r, nil
	}
	if v, ok := rows[0][StatusColumn]; ok && asAnswer {
		for i := range rows {
			rows[i] = maps.Clone(rows[i])
			delete(rows[i], StatusColumn)
		}
		if v != nil {
			status, err := statusOf(v)
			if err != nil {
				return nil, err
			}
			body, err := encode(rows[0])
			if err != nil {
				return nil, err
			}
			r.reply = jsonResponse(status, body)
			r.body = body
			return r, nil
		}
	}
	var v any = rows
	if len(rows) == 1 {
		v = rows[0]
	}
	body, err := encode(v)
	if err != nil {
		return nil, err
	}
	r.body = body
	return r, nil
}

// statusOf reads a StatusColumn value: an integer from 200 to 599.
func statusOf(v any) (int, error) {
	var n int64
	switch x := v.(type) {
	case int16:
		n = int64(x)
	case int32:
		n = int64(x)
	case int64:
		n = x
	case int:
		n = int64(x)
	default:
		return 0, Permanent(fmt.Errorf("the effect's %s column is %T: want an integer (smallint, integer or bigint)", StatusColumn, v))
	}
	if n < 200 || n > 599 {
		return 0, Permanent(fmt.Errorf("the effect's %s column is %d: want an HTTP status from 200 to 599", StatusColumn, n))
	}
	return int(n), nil
}

// businessReply turns a BusinessError into its answer.
func businessReply(be *BusinessError) (*processed.Response, error) {
	if be.Status < 200 || be.Status > 599 {
		return nil, Permanent(fmt.Errorf("exactlyonce.BusinessError status %d: want an HTTP status from 200 to 599", be.Status))
	}
	body, err := resultJSON(be.Body)
	if err != nil {
		return nil, err
	}
	return jsonResponse(be.Status, body), nil
}

// resultJSON is a Go effect's value as JSON: nil, json.RawMessage and []byte as they are.
func resultJSON(v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		return x, nil
	case []byte:
		return x, nil
	}
	return encode(v)
}

func encode(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, Permanent(fmt.Errorf("error encoding the effect's result: %w", err))
	}
	return b, nil
}

// jsonResponse is an answer with a JSON body; a 204 or an empty body has no body and no
// Content-Type.
func jsonResponse(status int, body []byte) *processed.Response {
	if status == http.StatusNoContent || len(body) == 0 {
		return &processed.Response{Status: status, Headers: map[string]string{}}
	}
	return &processed.Response{Status: status, Headers: map[string]string{"Content-Type": "application/json"}, Body: body}
}

// answer builds the answer of m, whose effect returned r (m.Answer is set).
func (m *Message) answer(r *result) *processed.Response {
	a := m.Answer
	switch {
	case r.reply != nil:
		return r.reply
	case r.affected == 0 && a.NoRows != nil:
		return a.NoRows
	}
	body := r.body
	if body == nil {
		body = a.Empty
	}
	return jsonResponse(a.Status, body)
}

// asBusinessError reports whether err is (or wraps) a BusinessError.
func asBusinessError(err error) (*BusinessError, bool) {
	var be *BusinessError
	ok := errors.As(err, &be)
	return be, ok
}

// collect reads rows into maps and reports how many rows the statement affected.
func collect(rows pgx.Rows) ([]map[string]any, int64, error) {
	out, err := pgx.CollectRows(rows, pgx.RowToMap)
	if err != nil {
		return nil, 0, err
	}
	return out, rows.CommandTag().RowsAffected(), nil
}
