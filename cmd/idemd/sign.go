package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/receiver"
)

// signature returns the headers that authenticate body for a source's scheme (SPEC 3.1),
// in a stable order. id is the message id the scheme carries in a header, where it has one.
func signature(v *receiver.Verify, secret string, body []byte, id string, now time.Time) ([][2]string, error) {
	ts := strconv.FormatInt(now.Unix(), 10)
	mac := func(key []byte, parts ...string) []byte {
		h := hmac.New(sha256.New, key)
		for _, p := range parts {
			h.Write([]byte(p))
		}
		return h.Sum(nil)
	}
	switch v.Scheme {
	case "stripe":
		return [][2]string{{"Stripe-Signature", "t=" + ts + ",v1=" + hex.EncodeToString(mac([]byte(secret), ts, ".", string(body)))}}, nil
	case "standard-webhooks":
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		if err != nil {
			return nil, fmt.Errorf("the standard-webhooks secret is not whsec_<base64>")
		}
		sig := base64.StdEncoding.EncodeToString(mac(key, id, ".", ts, ".", string(body)))
		return [][2]string{{"webhook-id", id}, {"webhook-timestamp", ts}, {"webhook-signature", "v1," + sig}}, nil
	case "github":
		return [][2]string{{"X-GitHub-Delivery", id}, {"X-Hub-Signature-256", "sha256=" + hex.EncodeToString(mac([]byte(secret), string(body)))}}, nil
	case "shopify":
		return [][2]string{{"X-Shopify-Event-Id", id}, {"X-Shopify-Hmac-Sha256", base64.StdEncoding.EncodeToString(mac([]byte(secret), string(body)))}}, nil
	case "slack":
		return [][2]string{{"X-Slack-Request-Timestamp", ts}, {"X-Slack-Signature", "v0=" + hex.EncodeToString(mac([]byte(secret), "v0:", ts, ":", string(body)))}}, nil
	case "hmac-sha256":
		sum := mac([]byte(secret), string(body))
		if v.Encoding == "base64" {
			return [][2]string{{v.Header, base64.StdEncoding.EncodeToString(sum)}}, nil
		}
		return [][2]string{{v.Header, hex.EncodeToString(sum)}}, nil
	}
	return nil, fmt.Errorf("scheme %s has no signature", v.Scheme)
}

func (c *cli) sign(args []string) int {
	fs := c.flags("sign", "", "Print a curl command that POSTs a correctly signed (or authenticated) request to a source.\n"+
		"Without IDEMD_PIPELINES_FILE or -pipelines it uses dev's pipelines and development secrets, as dev\n"+
		"does, even where ./idemd.yaml exists.", true)
	pipelines := fs.String("pipelines", "", "pipelines file (overrides IDEMD_PIPELINES_FILE)")
	source := fs.String("source", "stripe", "source name")
	body := fs.String("body", "", "request body (default: an example event for the source)")
	base := fs.String("url", "", "base URL of the receiver (default: http://IDEMD_HTTP_ADDR when that is set, https with IDEMD_TLS_CERT_FILE; else "+signURLDefault+")")
	id := fs.String("id", "", "message id for schemes that carry it in a header, or the Idempotency-Key (default: random)")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if code, ok := c.noArgs(fs); !ok {
		return code
	}
	e, err := loadEnvFor("sign", c.env)
	if err != nil {
		return c.fail("sign", exitUsage, err)
	}
	if *pipelines != "" {
		e.PipelinesFile, e.set["IDEMD_PIPELINES_FILE"] = *pipelines, true
	}
	f, _, err := devPipelines(e, c.env)
	if err != nil {
		return c.fail("sign", exitUsage, err)
	}
	if *base == "" {
		*base = signURLDefault
		if e.set["IDEMD_HTTP_ADDR"] {
			*base = receiverURL(e.HTTPAddr, e.TLSCertFile != "")
		}
	}
	var src *receiver.Source
	for _, s := range f.Sources {
		if s.Name == *source {
			src = s
		}
	}
	if src == nil {
		err := fmt.Errorf("no source %q in %s (sources: %s)", *source, f.Path, strings.Join(sourceNames(f), ", "))
		if _, statErr := os.Stat(e.PipelinesFile); !e.set["IDEMD_PIPELINES_FILE"] && statErr == nil {
			// As dev, sign reads dev's pipelines unless a file is named, even where the
			// default file exists: say how to sign for that one.
			err = fmt.Errorf("%w; %s exists here: to sign for its sources, pass -pipelines %s or set IDEMD_PIPELINES_FILE", err, e.PipelinesFile, e.PipelinesFile)
		}
		return c.fail("sign", exitUsage, err)
	}
	line, err := exampleRequest(src, strings.TrimRight(*base, "/"), []byte(*body), *id, time.Now(), !e.set["IDEMD_PIPELINES_FILE"] && c.env[tokensEnvDev] == "")
	if err != nil {
		return c.fail("sign", exitUsage, err)
	}
	fmt.Fprintln(c.stdout, line)
	return exitOK
}

func sourceNames(f *config.File) []string {
	var out []string
	for _, s := range f.Sources {
		out = append(out, s.Name)
	}
	return out
}

// signURLDefault is where sign sends its requests when neither -url nor IDEMD_HTTP_ADDR says.
const signURLDefault = "http://127.0.0.1:8080"

// receiverURL is the base URL of a receiver listening on addr, as a client on this host
// reaches it.
func receiverURL(addr string, tls bool) string {
	if tls {
		return "https://" + localAddr(addr)
	}
	return "http://" + localAddr(addr)
}

// exampleRequest returns a curl command for src that works as pasted: signed, with the
// headers its message id is read from. showToken prints a bearer token (only dev's own
// development tokens: a token the user set is not printed); otherwise the command reads it
// from $TOKEN, and a comment line before it says which variable holds the tokens.
func exampleRequest(src *receiver.Source, base string, body []byte, id string, now time.Time, showToken bool) (string, error) {
	if id == "" {
		id = fmt.Sprintf("%s_%d", map[bool]string{true: "key", false: "evt"}[src.Idempotency != nil], now.UnixNano())
	}
	if len(body) == 0 {
		body = exampleBody(src, id, now)
	}
	headers := [][2]string{{"Content-Type", "application/json"}}
	switch src.Verify.Scheme {
	case "bearer":
		token := "$TOKEN"
		if showToken {
			for t, tenant := range src.Verify.Tokens {
				if tenant == "acme" || token == "$TOKEN" {
					token = t
				}
			}
		}
		headers = append(headers, [2]string{"Authorization", "Bearer " + token})
	case "none":
	default:
		if len(src.Verify.Secrets) == 0 {
			return "", fmt.Errorf("source %s has no secret", src.Name)
		}
		sig, err := signature(&src.Verify, src.Verify.Secrets[0], body, id, now)
		if err != nil {
			return "", err
		}
		headers = append(headers, sig...)
	}
	if src.Idempotency != nil {
		headers = append(headers, [2]string{"Idempotency-Key", id})
	} else if src.MessageID != nil {
		// message_id: {header: …}, or header parts of a composite: the scheme's signature
		// headers carry its default id headers only.
		for _, name := range idHeaders(src.MessageID) {
			if !slices.ContainsFunc(headers, func(h [2]string) bool { return strings.EqualFold(h[0], name) }) {
				headers = append(headers, [2]string{name, id})
			}
		}
	}
	var b strings.Builder
	if src.Verify.Scheme == "bearer" && !showToken {
		holder := "the source's bearer tokens"
		if src.Verify.TokensEnv != "" {
			holder = "the tokens in " + src.Verify.TokensEnv + ` ("token=tenant,…")`
		}
		b.WriteString("# set TOKEN to one of " + holder + " first\n")
	}
	b.WriteString("curl -sS -i -X POST " + shellQuote(base+src.RoutePath()))
	for _, h := range headers {
		v := h[1]
		if strings.Contains(v, "$TOKEN") {
			b.WriteString(` -H "` + h[0] + ": " + v + `"`)
			continue
		}
		b.WriteString(" -H " + shellQuote(h[0]+": "+v))
	}
	b.WriteString(" --data-binary " + shellQuote(string(body)))
	return b.String(), nil
}

// idHeaders are the headers a message id is read from: its own, or its parts'.
func idHeaders(f *pipeline.Field) []string {
	if f.Header != "" {
		return []string{f.Header}
	}
	var out []string
	for i := range f.Parts {
		out = append(out, idHeaders(&f.Parts[i])...)
	}
	return out
}

// exampleBody is a plausible event for the source's scheme.
func exampleBody(src *receiver.Source, id string, now time.Time) []byte {
	if src.Idempotency != nil {
		return []byte(`{"sku":"book-42","quantity":1}`)
	}
	switch src.Verify.Scheme {
	case "stripe":
		return []byte(fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","created":%d,"data":{"object":{"id":"pi_%d","object":"payment_intent","amount":2000,"currency":"eur"}}}`,
			id, now.Unix(), now.UnixNano()))
	case "slack":
		return []byte(fmt.Sprintf(`{"type":"event_callback","event_id":%q,"event":{"type":"app_mention","text":"hello"}}`, id))
	}
	return []byte(fmt.Sprintf(`{"id":%q,"type":"example.created","created":%d}`, id, now.Unix()))
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
