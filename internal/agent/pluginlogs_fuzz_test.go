package agent

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzIstioRecordsAreOneJSONLineEach: whatever Istio's plugin posts, istioRecords
// refuses it or turns each record into one line holding one JSON object marked
// "plugin":"istio"; it never panics (the post is served by the agent).
func FuzzIstioRecordsAreOneJSONLineEach(f *testing.F) {
	for _, s := range []string{
		`["{\"level\":\"info\",\"time\":\"2026-11-25T16:00:00.123456Z\",\"msg\":\"Checking pod\",\"pod\":\"app/web\"}", "not json"]`,
		`["{\"level\":\"error\",\"msg\":\"  failed  \",\"attempt\":{\"n\": 2}}\n"]`,
		`[]`, `{"msg":"an object"}`, `["[1,2]", "\"a string\"", "{}"]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		lines, err := istioRecords(body)
		if err != nil {
			return
		}
		for _, l := range lines {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(l, &m); err != nil || m == nil || bytes.ContainsAny(l, "\r\n") {
				t.Fatalf("%q: line %q is not one JSON object on one line: %v", body, l, err)
			}
			if string(m["plugin"]) != `"istio"` {
				t.Errorf("%q: line %q is not marked as Istio's plugin's", body, l)
			}
		}
	})
}
