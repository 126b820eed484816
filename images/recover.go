package images

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// PendingName is the draft manifest a checkpoint writes into its temporary
// directory before CRIU dumps: what kcr knew before the dump, so that an
// image whose kcr died after the dump can still be completed (Recover).
const PendingName = "manifest.pending.json"

// CRIUDoneName is the file CRIU writes into its images directory only
// after a successful dump (its statistics): its presence says the dump
// finished.
const CRIUDoneName = "stats-dump"

// ErrNotRecoverable is returned by Recover for a directory whose dump did
// not finish.
var ErrNotRecoverable = errors.New("not a recoverable image")

// WritePending writes m as the builder's draft manifest.
func (b *Builder) WritePending(m *Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("images: %s: encode draft manifest: %w", b.final, err)
	}
	if err := os.WriteFile(filepath.Join(b.tmp, PendingName), data, filePerm); err != nil {
		return fmt.Errorf("images: %s: write draft manifest: %w%s", b.final, err, ioHint(err))
	}
	return nil
}

// Reopen returns a Builder for the temporary directory tmp of a checkpoint
// whose kcr died before it published the image, and the draft manifest it
// left. The image will be published at the path the checkpoint was given.
// It fails with ErrNotRecoverable unless CRIU's dump in tmp finished.
func Reopen(tmp string) (*Builder, *Manifest, error) {
	b, abs, err := reopen(tmp)
	if err != nil {
		return nil, nil, err
	}
	data, err := os.ReadFile(filepath.Join(abs, PendingName))
	if err != nil {
		return nil, nil, fmt.Errorf("images: %s: %w: no draft manifest (%v); remove the directory", tmp, ErrNotRecoverable, err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, nil, fmt.Errorf("images: %s: %w: draft manifest: %v; remove the directory", tmp, ErrNotRecoverable, err)
	}
	if _, err := os.Stat(filepath.Join(b.CRIUDir(), CRIUDoneName)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("images: %s: %w: CRIU's dump did not finish (no %s), so the process was resumed, not dumped; remove the directory", tmp, ErrNotRecoverable, CRIUDoneName)
	} else if err != nil {
		return nil, nil, fmt.Errorf("images: %s: %w", tmp, err)
	}
	return b, &m, nil
}

// reopen maps a checkpoint's temporary directory to a Builder of its image.
func reopen(tmp string) (*Builder, string, error) {
	abs, err := filepath.Abs(tmp)
	if err != nil {
		return nil, "", fmt.Errorf("images: %s: %w", tmp, err)
	}
	parent, base := filepath.Split(abs)
	i := strings.Index(base, tmpMarker)
	if !strings.HasPrefix(base, ".") || i < 2 {
		return nil, "", fmt.Errorf("images: %s: %w: not the temporary directory of a checkpoint (.NAME%s…)", tmp, ErrNotRecoverable, tmpMarker)
	}
	b := &Builder{final: filepath.Join(parent, base[1:i]), tmp: abs}
	if err := checkFree(b.final, b.final); err != nil {
		return nil, "", err
	}
	return b, abs, nil
}

// Recover completes and publishes the image in tmp: see Reopen. With a
// signer, the manifest is signed (again) before the image is published.
//
// Recover refuses (ErrUntrusted) a directory that another user owns or
// could have written, as Open does with Trusted: what it publishes was
// written by whoever could write there, and a signature would vouch for it.
func Recover(ctx context.Context, tmp string, signer ed25519.PrivateKey) (*Image, error) {
	if _, _, err := reopen(tmp); err != nil {
		return nil, err
	}
	if err := checkTree(tmp, recoverFix); err != nil {
		return nil, err
	}
	// kcr died after the manifest was written: only the rename is left.
	if data, err := os.ReadFile(filepath.Join(tmp, ManifestName)); err == nil {
		b, _, err := reopen(tmp)
		if err != nil {
			return nil, err
		}
		var m Manifest
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("images: %s: %w: manifest: %v; remove the directory", tmp, ErrNotRecoverable, err)
		}
		if signer != nil {
			if err := b.writeRootFile(signatureTmp, SignatureName, signManifest(signer, data)); err != nil {
				return nil, fmt.Errorf("images: %s: write signature: %w%s", tmp, err, ioHint(err))
			}
		}
		if err := b.publish(ctx, "recover"); err != nil {
			return nil, err
		}
		return Open(ctx, b.final)
	}
	b, m, err := Reopen(tmp)
	if err != nil {
		return nil, err
	}
	b.SignWith(signer)
	return b.Commit(ctx, m)
}

// FindPending lists the temporary directories of checkpoints in dir whose
// kcr died after a finished dump: Recover completes them.
func FindPending(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".") || !strings.Contains(e.Name(), tmpMarker) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if _, _, err := Reopen(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}
