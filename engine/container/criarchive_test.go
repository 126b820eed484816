package container

import (
	"archive/tar"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/kcr-dev/kcr/images/oci"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest/containerimg"
)

// tarFiles reads the regular files of a tar.
func tarFiles(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			files[h.Name] = b
		}
	}
}

// TestExportForContainerd: the OCI image of a container that containerd's
// CRI plugin ran carries what containerd's restore reads: its checkpoint
// annotation on the manifest (beside CRI-O's), with the container's CRI
// name, and in the layer status.dump (the CRI ContainerStatus: name, base
// image, the kubelet annotations it carries over) and config.dump's
// rootfsImageName and rootfsImageRef; --base-image NAME@DIGEST gives the
// pullable reference.
func TestExportForContainerd(t *testing.T) {
	spec := `{"ociVersion":"1.0.2","annotations":{"io.kubernetes.cri.container-name":"kafkaapp","io.kubernetes.cri.image-name":"127.0.0.1:5000/svc:1","org.criu.config":"/etc/kcr/criu.conf"}}`
	img := containerimg.Write(t, containerimg.Options{Files: map[string]string{containerSpecFile: spec}})
	const digest = "127.0.0.1:5000/svc@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, c := range []struct{ base, wantName, wantRef string }{
		{"", "127.0.0.1:5000/svc:1", "127.0.0.1:5000/svc:1"},
		{digest, "127.0.0.1:5000/svc", digest},
	} {
		dir := filepath.Join(t.TempDir(), "oci")
		res, err := Export(context.Background(), ExportOptions{Image: img, Format: FormatOCI, Output: dir, BaseImage: c.base})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range res.Warnings {
			t.Errorf("base %q: warning %q", c.base, w)
		}
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		im, _ := idx.IndexManifest()
		ck, err := idx.Image(im.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := ck.Manifest()
		if m.Annotations[oci.CRIUAnnotation] != "kafkaapp" || m.Annotations[oci.CheckpointAnnotation] != "kafkaapp" {
			t.Errorf("annotations %v, want both runtimes' with the CRI name kafkaapp", m.Annotations)
		}
		layers, _ := ck.Layers()
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		files := tarFiles(t, rc)
		rc.Close()
		var config struct {
			ID              string `json:"id"`
			Name            string `json:"name"`
			RootfsImageName string `json:"rootfsImageName"`
			RootfsImageRef  string `json:"rootfsImageRef"`
		}
		if err := json.Unmarshal(files["config.dump"], &config); err != nil || config.Name != "kafkaapp" || config.RootfsImageName != c.wantName || config.RootfsImageRef != c.wantRef {
			t.Errorf("base %q: config.dump %+v (%v), want name kafkaapp, image %s by %s", c.base, config, err, c.wantName, c.wantRef)
		}
		var status struct {
			Metadata    struct{ Name string }
			Image       struct{ Image string }
			Annotations map[string]string
		}
		if err := json.Unmarshal(files["status.dump"], &status); err != nil || status.Metadata.Name != "kafkaapp" || status.Image.Image != c.wantName {
			t.Errorf("base %q: status.dump %s (%v), want name kafkaapp, image %s", c.base, files["status.dump"], err, c.wantName)
		}
		if status.Annotations[criuConfigAnnotation] != "/etc/kcr/criu.conf" {
			t.Errorf("status.dump annotations %v lack the spec's %s: the restored copy would run no hooks", status.Annotations, criuConfigAnnotation)
		}
		for _, k := range kubeletAnnotations {
			if _, ok := status.Annotations[k]; !ok {
				t.Errorf("status.dump lacks %s: containerd would not set the new container's", k)
			}
		}
	}
	_, err := Export(context.Background(), ExportOptions{Image: img, Format: FormatOCI, Output: filepath.Join(t.TempDir(), "x"), BaseImage: "Not A Name"})
	if err == nil {
		t.Error("--base-image 'Not A Name': no error")
	}
	if ents, _ := os.ReadDir(filepath.Dir(img)); len(ents) != 1 {
		t.Errorf("beside the image: %v", ents)
	}
}
