package images

import (
	"archive/tar"
	"bytes"
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

// crioOwn are the archive's files for CRI-O, containerd and checkpointctl,
// not listed in the kcr manifest: an import skips them.
var crioOwn = map[string]bool{"config.dump": true, "spec.dump": true, "status.dump": true, rootfsDiffName: true}

// rootfsDiffName is the archive's tar of files that CRI-O and containerd
// add to the restored container's fresh root file system before CRIU
// runs.
const rootfsDiffName = "rootfs-diff.tar"

// CRIOContainer describes the checkpointed container to the runtimes that
// restore an archive of [WriteCRIOFile]: CRI-O and containerd read
// config.dump, containerd status.dump too.
type CRIOContainer struct {
	ID   string // the container's id
	Name string // its name (config.dump's name; default ID)
	// BaseImage is the image the container ran, by name (config.dump's
	// rootfsImageName); BaseImageRef is how a runtime pulls it
	// (rootfsImageRef: NAME@DIGEST or NAME:TAG; default BaseImage).
	// containerd restores only an archive that names one.
	BaseImage, BaseImageRef string
	// Status is status.dump, the CRI ContainerStatus of the container as
	// JSON, which containerd needs; nil writes none.
	Status []byte
}

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
// the one checkpointctl, CRI-O and containerd read, published by
// [WriteNewFile]: never partial, never over a file. The archive holds
// config.dump and spec.dump (spec, the container's OCI spec, marked as
// CRI-O's), status.dump if c has one, the kcr manifest and its signature
// (CRIOManifestName, CRIOSignatureName), the image's root files named in
// extra if it has them, and CRIU's files under CRIOCheckpointDir.
// [ImportCRIO] reads it back.
func WriteCRIOFile(ctx context.Context, img *Image, out string, c CRIOContainer, spec map[string]any, extra ...string) error {
	ann, _ := spec["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
	}
	if c.Name == "" {
		c.Name = c.ID
	}
	if c.BaseImageRef == "" {
		c.BaseImageRef = c.BaseImage
	}
	meta, _ := json.Marshal(map[string]string{"name": c.Name})
	created := img.Manifest.Created.Format(time.RFC3339Nano)
	ann["io.container.manager"] = "cri-o"
	ann["io.kubernetes.cri-o.Metadata"] = string(meta)
	ann["io.kubernetes.cri-o.Created"] = created
	spec["annotations"] = ann
	specDump, _ := json.Marshal(spec)
	config := map[string]any{"id": c.ID, "name": c.Name, "runtime": "runc",
		"createdTime": img.Manifest.Created, "checkpointedTime": img.Manifest.Created}
	if c.BaseImage != "" {
		config["rootfsImageName"] = c.BaseImage
		config["rootfsImageRef"] = c.BaseImageRef
	}
	configDump, _ := json.Marshal(config)
	dumps := []namedData{{"config.dump", configDump}, {"spec.dump", specDump}}
	if c.Status != nil {
		dumps = append(dumps, namedData{"status.dump", c.Status})
	}
	if diff := socketDirTar(img.Manifest.ControlSocket, img.Manifest.Created); diff != nil {
		dumps = append(dumps, namedData{rootfsDiffName, diff})
	}
	return WriteNewFile(ctx, out, func(f *os.File) error {
		return writeCRIOTar(ctx, img, f, dumps, extra)
	})
}

// socketDirTar returns a tar of the directories of the app's control
// socket (sock, as the container sees it), or nil if there is none: the
// app created them in the container's writable layer, which a runtime's
// restore starts afresh from the image, and CRIU cannot bind the socket
// again without them. The socket's own directory is the app's, 0700
// (notify); those above it 0755.
func socketDirTar(sock string, mtime time.Time) []byte {
	if !path.IsAbs(sock) || path.Clean(sock) != sock {
		return nil
	}
	var dirs []string
	for d := path.Dir(sock); d != "/"; d = path.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}
	if len(dirs) == 0 {
		return nil
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, d := range dirs {
		mode := int64(0o755)
		if i == len(dirs)-1 {
			mode = 0o700
		}
		if tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: mode, ModTime: mtime}) != nil {
			return nil
		}
	}
	if tw.Close() != nil {
		return nil
	}
	return buf.Bytes()
}

// namedData is a file of an archive that is not in the image.
type namedData struct {
	name string
	data []byte
}

// writeCRIOTar writes the CRI-O archive's entries to w.
func writeCRIOTar(ctx context.Context, img *Image, w io.Writer, dumps []namedData, extra []string) error {
	tw := tar.NewWriter(w)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), ModTime: img.Manifest.Created}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range dumps {
		if err := add(d.name, d.data); err != nil {
			return err
		}
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
