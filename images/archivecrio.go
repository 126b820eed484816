package images

import (
	"context"
	"io"
	"strings"
)

// Names in a CRI-O checkpoint archive written by kcr (engine.ExportArchive).
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
