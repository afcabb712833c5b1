package signkey

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	require.Error(t, Check(nil))
	require.Error(t, Check([]byte("fifteen bytes!!")))
	require.NoError(t, Check([]byte("sixteen bytes!!!")))
}

func TestDecodeStandard(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "whsec_", "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 15)), "whsec_not base64!"} {
		_, err := DecodeStandard(s)
		require.Error(t, err, "%q", s)
	}
	// 20 characters of base64 are 15 bytes: the message says the key was decoded.
	_, err := DecodeStandard("erpsecreterpsecret12")
	require.ErrorContains(t, err, "shorter than 16 bytes once base64-decoded")
	require.ErrorContains(t, err, "decodes to 15 bytes")
	require.NotContains(t, err.Error(), "erpsecret")
	key, err := DecodeStandard("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	require.NoError(t, err)
	require.Len(t, key, 24)
	key2, err := DecodeStandard("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	require.NoError(t, err)
	require.Equal(t, key, key2, "the prefix is optional")
}
