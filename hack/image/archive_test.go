package image

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestArchiveIndexJSON: the index.json of an OCI archive is found and read whole;
// an archive without one, with one over the size limit, or with more entries than
// the limit before it is refused naming the archive and what is wrong. Its one
// manifest's digest is what Import tags.
func TestArchiveIndexJSON(t *testing.T) {
	const index = `{"schemaVersion":2,"manifests":[{"digest":"sha256:` + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `"}]}`
	type entry struct {
		name string
		body string
	}
	many := make([]entry, MaxArchiveEntries)
	for i := range many {
		many[i] = entry{"blobs/x", ""}
	}
	for _, tc := range []struct {
		name    string
		entries []entry
		want    string // the index.json read, or the error's text
		wantErr bool
	}{
		{"found after the blobs", []entry{{"oci-layout", `{}`}, {"blobs/sha256/a", "x"}, {"./index.json", index}}, index, false},
		{"none", []entry{{"oci-layout", `{}`}}, "no index.json", true},
		{"too large", []entry{{"index.json", strings.Repeat(" ", MaxIndexJSON+1)}}, "larger than 1048576 bytes", true},
		{"after too many entries", append(many, entry{"index.json", index}), "more than 10000 entries", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, e := range tc.entries {
				if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg}); err != nil {
					t.Fatal(err)
				}
				if _, err := tw.Write([]byte(e.body)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			archive := filepath.Join(t.TempDir(), "image.tar")
			if err := os.WriteFile(archive, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := ArchiveIndexJSON(archive)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), archive) {
					t.Fatalf("ArchiveIndexJSON = %v, want an error naming %s and saying %q", err, archive, tc.want)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("ArchiveIndexJSON = %q, %v; want the index", got, err)
			}
			digest, err := archiveManifestDigest(archive)
			if err != nil || !strings.HasPrefix(digest, "sha256:0123") {
				t.Errorf("archiveManifestDigest = %q, %v", digest, err)
			}
		})
	}
}
