package faults

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTenantIsolation: tenant B using tenant A's Idempotency-Key gets its own result, never
// A's stored one, with the same or a different body; each tenant's retry replays its own.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	d := newDB(t, badInputDDL)
	nd := badInputNode(t, d, nil)
	p := nd.startReady()
	do := func(token string, body string) (int, string, http.Header) {
		req, err := http.NewRequest(http.MethodPost, "http://"+nd.httpAddr+"/v1/orders", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", "shared-key-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	codeA, bodyA, hA := do(biTokA, `{"item":"a"}`)
	require.Equal(t, 201, codeA, bodyA)
	require.Empty(t, hA.Get("Idempotent-Replayed"))
	require.Contains(t, bodyA, "tenant-a")

	codeB, bodyB, hB := do(biTokB, `{"item":"a"}`)
	require.Equal(t, 201, codeB, bodyB)
	require.Empty(t, hB.Get("Idempotent-Replayed"), "B's first request is new, not A's replay")
	require.Contains(t, bodyB, "tenant-b")
	require.NotEqual(t, bodyA, bodyB)

	// B with A's key and a different body: B's own key space, so a conflict with B's own
	// first request (422), never A's body.
	codeB2, bodyB2, _ := do(biTokB, `{"item":"other"}`)
	require.Equal(t, 422, codeB2, bodyB2)
	require.NotContains(t, bodyB2, "tenant-a")

	codeA2, bodyA2, hA2 := do(biTokA, `{"item":"a"}`)
	require.Equal(t, 201, codeA2)
	require.Equal(t, "true", hA2.Get("Idempotent-Replayed"))
	require.Equal(t, bodyA, bodyA2, "A's retry replays A's result byte for byte")
	codeB3, bodyB3, hB3 := do(biTokB, `{"item":"a"}`)
	require.Equal(t, 201, codeB3)
	require.Equal(t, "true", hB3.Get("Idempotent-Replayed"))
	require.Equal(t, bodyB, bodyB3)

	require.Equal(t, 1, d.count(t, "orders WHERE tenant = 'tenant-a'"))
	require.Equal(t, 1, d.count(t, "orders WHERE tenant = 'tenant-b'"))
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	require.Empty(t, scanSecrets(nd.allLogs()+bodyA+bodyB+bodyB2, biSecrets()))
}

// TestUnverifiedSourceRefused: scheme none is a configuration error (exit 2, the message
// names the pipeline and allow_unverified) unless allow_unverified: true is written.
func TestUnverifiedSourceRefused(t *testing.T) {
	t.Parallel()
	d := newDB(t, effectsDDL)
	src := `sources:
  - name: open
    verify: {scheme: none}
    message_id: {json: /id}
    effect: {sql: "INSERT INTO %s.effects (message_id, applied_by) VALUES (@message_id, @source)"}
`
	refused := newNode(t, d.schema, writeFile(t, fmt.Sprintf(src, d.schema)), "receiver", nil, nil)
	p := refused.start()
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("idemd started with an unverified source")
	}
	require.Equal(t, 2, p.ExitCode())
	require.Contains(t, p.Stderr(), "allow_unverified")
	require.Contains(t, p.Stderr(), `"open"`)

	allowed := newNode(t, d.schema, writeFile(t, fmt.Sprintf(strings.Replace(src, "    verify:", "    allow_unverified: true\n    verify:", 1), d.schema)), "receiver", nil, nil)
	p = allowed.startReady()
	resp, err := http.Post("http://"+allowed.httpAddr+"/webhooks/open", "application/json", strings.NewReader(`{"id":"u1"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, 0, p.Stop(t, stopTimeout))
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key; it returns the
// files and a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idemd-faults"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestTLS: with IDEMD_TLS_CERT_FILE and IDEMD_TLS_KEY_FILE the receiver serves HTTPS only;
// a client that trusts the certificate is served, plain HTTP is not; one variable alone, or
// a key that does not load, is a configuration error.
func TestTLS(t *testing.T) {
	t.Parallel()
	d := newDB(t, badInputDDL)
	certFile, keyFile, pool := selfSigned(t)
	nd := badInputNode(t, d, map[string]string{"IDEMD_TLS_CERT_FILE": certFile, "IDEMD_TLS_KEY_FILE": keyFile})
	p := nd.startReady()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true,
	}}
	body := evt("evt_tls_1")
	resp, err := client.Do(post("/webhooks/stripe", body, "Stripe-Signature", stripeSig(body, time.Now().Unix()))("https://" + nd.httpAddr))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "%s", b)
	require.NotNil(t, resp.TLS)
	var got struct{ Status string }
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, "processed", got.Status)

	// Plain HTTP on the TLS port is not served.
	resp, err = http.Post("http://"+nd.httpAddr+"/webhooks/stripe", "application/json", bytes.NewReader(body))
	if err == nil {
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	}
	// A client that does not trust the certificate refuses it.
	_, err = http.Post("https://"+nd.httpAddr+"/webhooks/stripe", "application/json", bytes.NewReader(body))
	require.Error(t, err)
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	require.Equal(t, 1, d.count(t, "effects"))

	for name, vars := range map[string]map[string]string{
		"cert only":          {"IDEMD_TLS_CERT_FILE": certFile},
		"key is not the key": {"IDEMD_TLS_CERT_FILE": certFile, "IDEMD_TLS_KEY_FILE": certFile},
	} {
		bad := badInputNode(t, d, vars)
		bp := bad.start()
		select {
		case <-bp.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: idemd started", name)
		}
		require.Equal(t, 2, bp.ExitCode(), name)
		require.Contains(t, bp.Stderr(), "IDEMD_TLS_", name)
		require.NotContains(t, bp.Stderr(), "PRIVATE KEY", name)
	}
}

// TestSignatureComparisonsAreConstantTime reads the receiver's verification source: every
// verifier's verify method reaches a constant-time comparison (anyMAC, which compares with
// subtle.ConstantTimeCompare, or subtle.ConstantTimeCompare, or ed25519.Verify), and no
// function there compares bytes or encoded MACs with ==, bytes.Equal or strings.EqualFold.
// It is a guard against a future edit; the review note in RELIABILITY.md says why.
func TestSignatureComparisonsAreConstantTime(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("..", "..", "receiver", "verify.go"), nil, 0)
	require.NoError(t, err)
	calls := func(n ast.Node) map[string]bool {
		out := map[string]bool{}
		ast.Inspect(n, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				switch fn := c.Fun.(type) {
				case *ast.Ident:
					out[fn.Name] = true
				case *ast.SelectorExpr:
					if x, ok := fn.X.(*ast.Ident); ok {
						out[x.Name+"."+fn.Sel.Name] = true
					}
				}
			}
			return true
		})
		return out
	}
	verifiers := 0
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok {
			continue
		}
		c := calls(fd)
		for _, banned := range []string{"bytes.Equal", "bytes.Compare", "hmac.Equal", "reflect.DeepEqual"} {
			require.False(t, c[banned], "%s calls %s: compare MACs with subtle.ConstantTimeCompare through anyMAC", fd.Name.Name, banned)
		}
		// No == or != between a string(…) conversion or an encoded MAC and anything.
		ast.Inspect(fd, func(n ast.Node) bool {
			be, ok := n.(*ast.BinaryExpr)
			if !ok || (be.Op != token.EQL && be.Op != token.NEQ) {
				return true
			}
			for _, side := range []ast.Expr{be.X, be.Y} {
				if call, ok := side.(*ast.CallExpr); ok {
					name := fmt.Sprint(call.Fun)
					if id, ok := call.Fun.(*ast.Ident); ok {
						name = id.Name
					}
					if name == "string" || strings.Contains(name, "EncodeToString") || name == "hmacSHA256" {
						t.Errorf("%s: %s compares a MAC with %s", fset.Position(be.Pos()), fd.Name.Name, be.Op)
					}
				}
			}
			return true
		})
		if fd.Name.Name == "anyMAC" {
			require.True(t, c["subtle.ConstantTimeCompare"], "anyMAC compares with subtle.ConstantTimeCompare")
		}
		// Bearer tokens are compared as digests (slices of fixed-size arrays), so that a
		// token of the wrong length costs the same time as one of the right length.
		if fd.Recv != nil && fmt.Sprint(fd.Recv.List[0].Type) == "bearerVerifier" {
			compares := 0
			ast.Inspect(fd, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "ConstantTimeCompare" {
					return true
				}
				compares++
				for _, arg := range call.Args {
					if _, digest := arg.(*ast.SliceExpr); !digest {
						t.Errorf("%s: bearerVerifier.%s compares %s, not a fixed-length digest", fset.Position(arg.Pos()), fd.Name.Name, types.ExprString(arg))
					}
				}
				return true
			})
			require.Positive(t, compares, "bearerVerifier.%s compares tokens with subtle.ConstantTimeCompare", fd.Name.Name)
		}
		if fd.Recv == nil || fd.Name.Name != "verify" {
			continue
		}
		recv := fmt.Sprint(fd.Recv.List[0].Type)
		if recv == "noneVerifier" {
			continue
		}
		verifiers++
		require.True(t, c["anyMAC"] || c["subtle.ConstantTimeCompare"] || c["ed25519.Verify"],
			"%s.verify reaches a constant-time comparison", recv)
	}
	require.GreaterOrEqual(t, verifiers, 5, "stripe, standard-webhooks, body HMAC, slack and bearer verifiers found")
}
