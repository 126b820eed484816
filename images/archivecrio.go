package images

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"
)

// Names in a CRI-O checkpoint archive written by kcr (WriteCRIOFile).
const (
	// CRIOManifestName is the kcr manifest's name in the archive.
	CRIOManifestName = "kcr-manifest.json"
	// CRIOSignatureName is its signature's (SignatureName), right after it.
	CRIOSignatureName = "kcr-manifest.sig"
	// CRIOCheckpointDir holds CRIU's files: the image's criu/ directory.
	CRIOCheckpointDir = "checkpoint"
)

// crioOwn are the archive's files for CRI-O and checkpointctl, not listed
// in the kcr manifest: an import skips them.
var crioOwn = map[string]bool{"config.dump": true, "spec.dump": true}

// ImportCRIOFile imports a CRI-O checkpoint archive written by "kcr export
// --format cri-o" (a tar, plain or zstd-compressed) into the image final,
// with every check of [Import]: kcr-manifest.json is the manifest,
// checkpoint/ becomes criu/, and CRI-O's config.dump and spec.dump are
// skipped. An archive without kcr's manifest (one written by Podman or
// CRI-O) is refused with [ErrNotImage]: nothing could verify it.
func ImportCRIOFile(ctx context.Context, file, final string, opts ...ImportOption) (*Image, error) {
	return ImportFile(ctx, file, final, append(opts, crioLayout)...)
}

// ImportCRIO imports a CRI-O checkpoint archive read from r, as
// [ImportCRIOFile] does (r may be the layer of an OCI checkpoint image).
func ImportCRIO(ctx context.Context, r io.Reader, final string, opts ...ImportOption) (*Image, error) {
	return Import(ctx, r, final, append(opts, crioLayout)...)
}

var crioLayout ImportOption = importOpt{func(c *importConfig) { c.crio = true }}

// crioName maps an entry of a CRI-O archive to its path in the image; ""
// means skip it.
func crioName(name string) string {
	switch {
	case crioOwn[name]:
		return ""
	case name == CRIOManifestName:
		return ManifestName
	case name == CRIOSignatureName:
		return SignatureName
	case name == ManifestName, name == SignatureName:
		return name + ".archived" // only kcr's names fill these: refused as unlisted
	case name == CRIOCheckpointDir:
		return CRIUSubdir
	}
	if rest, ok := strings.CutPrefix(name, CRIOCheckpointDir+"/"); ok {
		return CRIUSubdir + "/" + rest
	}
	if name == CRIUSubdir || strings.HasPrefix(name, CRIUSubdir+"/") {
		return "archived-" + name // only checkpoint/ may fill criu/
	}
	return name
}

// WriteCRIOFile writes img, a verified image of a container (open, as
// [OpenForExport] returns it), as a checkpoint archive in CRI-O's layout,
// the one checkpointctl reads, published by [WriteNewFile]: never partial,
// never over a file. The archive holds config.dump and spec.dump (spec, the
// container's OCI spec, marked as CRI-O's, for the container id), the kcr
// manifest and its signature (CRIOManifestName, CRIOSignatureName), the
// image's root files named in extra if it has them, and CRIU's files under
// CRIOCheckpointDir. [ImportCRIO] reads it back.
func WriteCRIOFile(ctx context.Context, img *Image, out, id string, spec map[string]any, extra ...string) error {
	ann, _ := spec["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
	}
	meta, _ := json.Marshal(map[string]string{"name": id})
	created := img.Manifest.Created.Format(time.RFC3339Nano)
	ann["io.container.manager"] = "cri-o"
	ann["io.kubernetes.cri-o.Metadata"] = string(meta)
	ann["io.kubernetes.cri-o.Created"] = created
	spec["annotations"] = ann
	specDump, _ := json.Marshal(spec)
	configDump, _ := json.Marshal(map[string]any{"id": id, "name": id, "runtime": "runc",
		"createdTime": img.Manifest.Created, "checkpointedTime": img.Manifest.Created})

	return WriteNewFile(ctx, out, func(f *os.File) error {
		return writeCRIOTar(ctx, img, f, configDump, specDump, extra)
	})
}

// writeCRIOTar writes the CRI-O archive's entries to w.
func writeCRIOTar(ctx context.Context, img *Image, w io.Writer, configDump, specDump []byte, extra []string) error {
	tw := tar.NewWriter(w)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), ModTime: img.Manifest.Created}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("config.dump", configDump); err != nil {
		return err
	}
	if err := add("spec.dump", specDump); err != nil {
		return err
	}
	mb, err := img.ReadRootFile(ManifestName)
	if err != nil {
		return err
	}
	if err := add(CRIOManifestName, mb); err != nil {
		return err
	}
	// The signature goes along, so that whoever unpacks the archive can
	// check who wrote the image.
	if sig, err := img.ReadRootFile(SignatureName); err == nil {
		if err := add(CRIOSignatureName, sig); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("export: %w", err)
	}
	for _, name := range extra {
		data, err := img.ReadRootFile(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if err := add(name, data); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: CRIOCheckpointDir + "/", Mode: 0o700, ModTime: img.Manifest.Created}); err != nil {
		return err
	}
	for _, e := range img.Manifest.Files {
		if path.Dir(e.Path) != CRIUSubdir {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		src, err := img.OpenListed(e)
		if err == nil {
			err = tw.WriteHeader(&tar.Header{Name: CRIOCheckpointDir + "/" + path.Base(e.Path), Mode: 0o600, Size: e.Size, ModTime: img.Manifest.Created})
		}
		if err == nil {
			_, err = io.Copy(tw, src)
		}
		if src != nil {
			src.Close()
		}
		if err != nil {
			return fmt.Errorf("export %s: %w", e.Path, err)
		}
	}
	return tw.Close()
}
