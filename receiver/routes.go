package receiver

// Route is one method and path the receiver answers, for documentation (the OpenAPI
// document of the receiver's public contract).
type Route struct {
	Method string
	// Path is an OpenAPI path template: a source's path, or "{path}/{key}" for the PUT, GET
	// and DELETE of an API source.
	Path string
	// Source is the source's name; Scheme its verification scheme.
	Source, Scheme string
	// Headers are the headers that carry the request's signature (Verify.SignatureHeaders).
	Headers []string
	// API is true for sources with the Idempotency-Key contract.
	API bool
	// KeyRequired is true for API sources that refuse requests without a key.
	KeyRequired bool
}

// Routes lists what a Receiver built from sources answers: POST on each source's path, and
// on API sources PUT {path}/{key} (the key in the URL), GET {path}/{key} with
// Idempotency.Lookup and DELETE {path}/{key} with Delete.
func Routes(sources []Source) []Route {
	var out []Route
	for _, s := range sources {
		r := Route{Method: "POST", Path: s.RoutePath(), Source: s.Name, Scheme: s.Verify.Scheme, Headers: s.Verify.SignatureHeaders(), API: s.Idempotency != nil}
		if r.API {
			r.KeyRequired = s.Idempotency.Required
		}
		out = append(out, r)
		if !r.API {
			continue
		}
		item := r
		item.Path = r.Path + "/{key}"
		methods := []string{"PUT"}
		if s.Idempotency.Lookup {
			methods = append(methods, "GET")
		}
		if s.Delete != nil {
			methods = append(methods, "DELETE")
		}
		for _, m := range methods {
			item.Method = m
			out = append(out, item)
		}
	}
	return out
}
