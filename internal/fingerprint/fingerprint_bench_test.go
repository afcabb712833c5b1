package fingerprint

import "testing"

// benchBodies are a small event like the bench's and a full Stripe event with escapes.
var benchBodies = []struct {
	name string
	body []byte
}{
	{"small", []byte(`{"id":"evt-00000001","object":"event","type":"payment_intent.succeeded","created":1700000001,"data":{"object":{"id":"pi_000001","object":"payment_intent","amount":101,"currency":"eur","customer":"cus_00001"}}}`)},
	{"stripe", []byte(`{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","api_version":"2023-10-16","created":1686089970,"data":{"object":{"id":"pi_3NG8Dt2eZvKYlo2C0xK6h4Hn","object":"payment_intent","amount":2000,"amount_capturable":0,"amount_received":2000,"application":null,"capture_method":"automatic","client_secret":"pi_3NG8Dt2eZvKYlo2C0xK6h4Hn_secret_x","confirmation_method":"automatic","created":1686089969,"currency":"usd","customer":null,"description":"Caf\u00e9 order \"42\"","invoice":null,"last_payment_error":null,"latest_charge":"ch_3NG8Dt2eZvKYlo2C0m7Ouw2E","livemode":false,"metadata":{"order_id":"6735","note":"line1\nline2"},"payment_method_types":["card","link"],"status":"succeeded"}},"livemode":false,"pending_webhooks":1,"request":{"id":"req_1","idempotency_key":"ik_1"},"type":"payment_intent.succeeded"}`)},
}

// BenchmarkBody compares Body with the decode-and-re-encode fingerprint it replaced
// ("reference"), in the same run; "ignore" removes two members.
func BenchmarkBody(b *testing.B) {
	ignore := []string{"/pending_webhooks", "/request/idempotency_key"}
	for _, bb := range benchBodies {
		for _, impl := range []struct {
			name string
			fn   func([]byte, ...string) []byte
		}{
			{"streaming", Body},
			{"reference", func(body []byte, ignore ...string) []byte {
				c, _ := referenceCanonical(body, ignore...)
				return Sum([]byte("json"), c)
			}},
		} {
			for _, ig := range [][]string{nil, ignore} {
				name := bb.name + "/" + impl.name
				if ig != nil {
					name += "/ignore"
				}
				b.Run(name, func(b *testing.B) {
					b.ReportAllocs()
					b.SetBytes(int64(len(bb.body)))
					for b.Loop() {
						_ = impl.fn(bb.body, ig...)
					}
				})
			}
		}
	}
}
