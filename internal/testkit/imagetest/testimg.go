// Package imagetest helps tests make and tamper with kcr images and archives:
// trees owned by another user, tar and zstd streams to take apart and put
// together.
package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// OtherUID is a uid that no test runs as: the owner of "another user's" files.
const OtherUID = 61001

// ChownAll gives dir and everything below it, links included, to uid.
func ChownAll(t testing.TB, dir string, uid int) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Zstd compresses data.
func Zstd(t testing.TB, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Unzstd decompresses data.
func Unzstd(t testing.TB, data []byte) []byte {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Entry is one entry of a tar stream.
type Entry struct {
	Hdr  tar.Header
	Data []byte
}

// Tar writes entries as a tar stream, with their headers as they are.
func Tar(t testing.TB, entries []Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := e.Hdr
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ReadTar lists the entries of a tar stream.
func ReadTar(t testing.TB, data []byte) []Entry {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	var out []Entry
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, Entry{*hdr, b})
	}
}

// Archive writes entries as a zstd-compressed tar stream: what kcr export
// writes.
func Archive(t testing.TB, entries []Entry) []byte {
	t.Helper()
	return Zstd(t, Tar(t, entries))
}

// ReadArchive lists the entries of a zstd-compressed tar stream.
func ReadArchive(t testing.TB, data []byte) []Entry {
	t.Helper()
	return ReadTar(t, Unzstd(t, data))
}

// TreeSize is the size of the file p, or of the regular files under it.
func TreeSize(t testing.TB, p string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
