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

	"golang.org/x/sys/unix"
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

// WritePending writes m as the builder's draft manifest, through the
// temporary directory's fd.
func (b *Builder) WritePending(m *Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("images: %s: encode draft manifest: %w", b.final, err)
	}
	if err := b.root.Remove(PendingName); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("images: %s: write draft manifest: %w%s", b.final, err, ioHint(err))
	}
	if err := b.writeNew(PendingName, data); err != nil {
		return fmt.Errorf("images: %s: write draft manifest: %w%s", b.final, err, ioHint(err))
	}
	return nil
}

// Reopen returns a Builder for the temporary directory tmp of a checkpoint
// whose kcr died before it published the image, and the draft manifest it
// left. The image will be published at the path the checkpoint was given.
// It fails with ErrNotRecoverable unless CRIU's dump in tmp finished. The
// draft is read through the directory's fd, never through a link nor from
// a FIFO.
func Reopen(tmp string) (*Builder, *Manifest, error) {
	b, err := reopen(tmp)
	if err != nil {
		return nil, nil, err
	}
	m, err := b.readPending(tmp)
	if err != nil {
		b.release()
		return nil, nil, err
	}
	return b, m, nil
}

// readPending reads the draft manifest and checks that the dump finished.
func (b *Builder) readPending(tmp string) (*Manifest, error) {
	data, err := readRootFile(b.root, PendingName, MaxManifestSize)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w: no draft manifest (%v); remove the directory", tmp, ErrNotRecoverable, err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("images: %s: %w: draft manifest: %v; remove the directory", tmp, ErrNotRecoverable, err)
	}
	if _, err := b.root.Lstat(filepath.Join(CRIUSubdir, CRIUDoneName)); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("images: %s: %w: CRIU's dump did not finish (no %s), so the process was resumed, not dumped; remove the directory", tmp, ErrNotRecoverable, CRIUDoneName)
	} else if err != nil {
		return nil, fmt.Errorf("images: %s: %w", tmp, err)
	}
	return &m, nil
}

// reopen maps a checkpoint's temporary directory to a Builder of its image,
// holding fds on its parent and on it.
func reopen(tmp string) (*Builder, error) {
	abs, err := filepath.Abs(tmp)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", tmp, err)
	}
	parent, base := filepath.Split(abs)
	parent = filepath.Clean(parent)
	i := strings.Index(base, tmpMarker)
	if !strings.HasPrefix(base, ".") || i < 2 {
		return nil, fmt.Errorf("images: %s: %w: not the temporary directory of a checkpoint (.NAME%s…)", tmp, ErrNotRecoverable, tmpMarker)
	}
	final := filepath.Join(parent, base[1:i])
	pd, _, err := openDir(parent, false, recoverFix)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", tmp, err)
	}
	b := &Builder{final: final, tmp: abs, parent: pd, tmpBase: base, finalBase: base[1:i]}
	if err := b.checkFree(); err != nil {
		b.release()
		return nil, err
	}
	fd, err := unix.Openat(int(pd.Fd()), base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		b.release()
		return nil, fmt.Errorf("images: %s: %w: %w", tmp, ErrNotRecoverable, &fs.PathError{Op: "open", Path: abs, Err: err})
	}
	b.dir = os.NewFile(uintptr(fd), abs)
	if b.root, err = rootOf(b.dir); err != nil {
		b.release()
		return nil, fmt.Errorf("images: %s: %w", tmp, err)
	}
	return b, nil
}

// Recover completes and publishes the image in tmp: see Reopen. With a
// signer, the manifest is signed (again) before the image is published.
//
// Recover refuses (ErrUntrusted) a directory that another user owns or
// could have written, as Open does with Trusted: what it publishes was
// written by whoever could write there, and a signature would vouch for it.
// That check comes first; everything is then read through fds.
func Recover(ctx context.Context, tmp string, signer ed25519.PrivateKey) (*Image, error) {
	if b, err := reopen(tmp); err != nil {
		return nil, err
	} else {
		b.release()
	}
	real, err := checkTree(tmp, recoverFix)
	if err != nil {
		return nil, err
	}
	b, err := reopen(real)
	if err != nil {
		return nil, err
	}
	// The directory checked is the one held: its parent is trusted now.
	if fi, err := b.dir.Stat(); err != nil || trustInfo(fi) != "" {
		b.release()
		return nil, newError(tmp, ".", ErrUntrusted, err, "the directory changed during the check; "+recoverFix)
	}
	// kcr died after the manifest was written: only the rename is left.
	if data, err := readRootFile(b.root, ManifestName, MaxManifestSize); err == nil {
		defer b.release()
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
	m, err := b.readPending(tmp)
	if err != nil {
		b.release()
		return nil, err
	}
	b.SignWith(signer)
	img, err := b.Commit(ctx, m)
	if err != nil {
		b.release()
	}
	return img, err
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
		if b, _, err := Reopen(p); err == nil {
			b.release()
			out = append(out, p)
		} else if sealed(p) {
			out = append(out, p)
		}
	}
	return out
}

// sealed reports whether tmp holds a commit that was cut off after it
// wrote the manifest (and removed the draft) but before the rename:
// Recover publishes it.
func sealed(tmp string) bool {
	b, err := reopen(tmp)
	if err != nil {
		return false
	}
	defer b.release()
	_, err = b.root.Lstat(ManifestName)
	return err == nil
}

// FindPendingOf lists the interrupted checkpoints of the image named final
// (kcr checkpoint's -o): the ".<base>.kcr-tmp-*" directories beside it
// that hold a finished dump.
func FindPendingOf(final string) []string {
	final = filepath.Clean(final)
	prefix := "." + filepath.Base(final) + tmpMarker
	var out []string
	for _, p := range FindPending(filepath.Dir(final)) {
		if strings.HasPrefix(filepath.Base(p), prefix) {
			out = append(out, p)
		}
	}
	return out
}
