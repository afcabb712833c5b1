package delivery_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/delivery"
)

// SPEC 3.1 test vector, computed independently of this code.
const (
	vectorSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTS     = "1614265330"
	vectorBody   = `{"test": 2432232314}`
	vectorSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

// verifyIndependently is the receiving side's check, written from the Standard Webhooks
// text and not from package delivery: HMAC-SHA256 keyed by the base64-decoded secret after
// "whsec_", over id.timestamp.body, any of the space-separated v1 signatures.
func verifyIndependently(t testing.TB, secret, id, ts string, body []byte, header string) bool {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	require.NoError(t, err)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Split(header, " ") {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return true
		}
	}
	return false
}

func TestIndependentCheckMatchesTheSpecVector(t *testing.T) {
	t.Parallel()
	require.True(t, verifyIndependently(t, vectorSecret, vectorID, vectorTS, []byte(vectorBody), vectorSig))
	require.True(t, verifyIndependently(t, vectorSecret, vectorID, vectorTS, []byte(vectorBody), "v1,bm90IHRoaXM= "+vectorSig))
	require.False(t, verifyIndependently(t, vectorSecret, vectorID, "1614265331", []byte(vectorBody), vectorSig))
}

func TestSignMatchesTheSpecVector(t *testing.T) {
	t.Parallel()
	key, err := delivery.ParseSecret(vectorSecret)
	require.NoError(t, err)
	require.Equal(t, vectorSig, delivery.Sign(key, vectorID, 1614265330, []byte(vectorBody)))
	require.True(t, delivery.Verify(key, vectorID, vectorTS, []byte(vectorBody), "v1,bm90IHRoaXM= "+vectorSig))
	require.False(t, delivery.Verify(key, vectorID, vectorTS, []byte(`{"test": 2432232315}`), vectorSig))
	require.False(t, delivery.Verify(key, vectorID, "x", []byte(vectorBody), vectorSig))
}

func TestParseSecretRefusesBadSecrets(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "whsec_", "whsec_not base64!", "whsec_ZmlmdGVlbi1ieXRlcyEh" /* 15 bytes */} {
		_, err := delivery.ParseSecret(s)
		require.Error(t, err, s)
		require.NotContains(t, err.Error(), "base64!", "the secret is never echoed")
	}
}
