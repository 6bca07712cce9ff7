package timing

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func names(ps []Phase) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func TestMarkRecordsPhasesInOrderAndAddsRepeats(t *testing.T) {
	r := Start()
	ctx := With(context.Background(), r)
	time.Sleep(2 * time.Millisecond)
	Mark(ctx, "lookup")
	Mark(ctx, "restore")
	time.Sleep(2 * time.Millisecond)
	Mark(ctx, "lookup")
	got := r.Phases()
	if diff := cmp.Diff([]string{"lookup", "restore"}, names(got)); diff != "" {
		t.Fatalf("phases (-want +got):\n%s", diff)
	}
	if got[0].Took < 4*time.Millisecond {
		t.Errorf("lookup took %s, want the two sleeps (>= 4ms) added up", got[0].Took)
	}
	if got[1].Took >= 2*time.Millisecond {
		t.Errorf("restore took %s, want well under the sleep that followed it", got[1].Took)
	}
}

func TestMarkWithoutRecorderDoesNothing(t *testing.T) {
	Mark(context.Background(), "x") // must not panic
	var r *Recorder
	r.Mark("x")
	if r.Phases() != nil {
		t.Fatal("a nil recorder has phases")
	}
}

func TestRecorderIsBounded(t *testing.T) {
	r := Start()
	for i := 0; i < 3*MaxPhases; i++ {
		r.Mark(string(rune('a'+i%26)) + string(rune('a'+i/26)))
	}
	got := r.Phases()
	if len(got) != MaxPhases || got[MaxPhases-1].Name != "other" {
		t.Fatalf("%d phases, last %q; want %d, the last \"other\"", len(got), got[len(got)-1].Name, MaxPhases)
	}
}

func TestLogValueIsAGroupOfDurations(t *testing.T) {
	r := Start()
	r.Mark("config")
	r.Mark("lookup")
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("ADD", "phases", r)
	if !regexp.MustCompile(`phases\.config=\S+s phases\.lookup=\S+s`).Match(buf.Bytes()) {
		t.Fatalf("log line %q lacks phases.config= and phases.lookup= durations", buf.String())
	}
}
