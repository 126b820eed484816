package container

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kcr-dev/kcr/images"
)

// The spec annotations by which containerd's and CRI-O's CRI plugins
// record a container's CRI name and image.
var (
	criNameAnnotations  = []string{"io.kubernetes.cri.container-name", "io.kubernetes.container.name"}
	criImageAnnotations = []string{"io.kubernetes.cri.image-name", "io.kubernetes.cri-o.ImageName"}
)

// The kubelet's annotations that containerd's restore carries over from
// status.dump only if it has them: it then sets them to the new
// container's. Without the hash the kubelet takes the restored container
// for one of another spec and replaces it.
var kubeletAnnotations = []string{"io.kubernetes.container.hash", "io.kubernetes.container.restartCount"}

// criuConfigAnnotation names the CRIU configuration that runs kcr's hook
// (kcr install-runtime-hook). containerd gives a restored container the
// annotations of status.dump instead of its own: the spec's is carried
// there, so that the copy's after-restore hooks run.
const criuConfigAnnotation = "org.criu.config"

// criContainer describes the container of an image, whose OCI spec is
// spec, to the runtimes that restore its archive: its CRI name and image
// from the annotations containerd or CRI-O put in the spec, base if given
// instead, and status.dump, the CRI ContainerStatus containerd reads.
func criContainer(id string, spec map[string]any, base string) (images.CRIOContainer, error) {
	ann, _ := spec["annotations"].(map[string]any)
	first := func(keys []string) string {
		for _, k := range keys {
			if v, _ := ann[k].(string); v != "" {
				return v
			}
		}
		return ""
	}
	c := images.CRIOContainer{ID: id, Name: first(criNameAnnotations), BaseImage: first(criImageAnnotations)}
	if base != "" {
		c.BaseImage = base
	}
	if c.Name == "" {
		c.Name = id
	}
	if c.BaseImage == "" {
		return c, nil
	}
	if _, err := name.ParseReference(c.BaseImage); err != nil {
		return c, fmt.Errorf("base image %q: %w: give NAME:TAG or NAME@DIGEST", c.BaseImage, err)
	}
	// containerd pulls rootfsImageRef and tags it rootfsImageName, which
	// must be a name, not NAME@DIGEST. Names stay as given: containerd and
	// go-containerregistry qualify Docker Hub's differently.
	c.BaseImageRef = c.BaseImage
	if n, _, ok := strings.Cut(c.BaseImage, "@"); ok {
		c.BaseImage = n
	}
	st := &cri.ContainerStatus{Id: id, Metadata: &cri.ContainerMetadata{Name: c.Name},
		Image:       &cri.ImageSpec{Image: c.BaseImage, UserSpecifiedImage: c.BaseImage},
		ImageRef:    c.BaseImageRef,
		Annotations: map[string]string{}}
	for _, k := range kubeletAnnotations {
		st.Annotations[k] = "0"
	}
	if v, _ := ann[criuConfigAnnotation].(string); v != "" {
		st.Annotations[criuConfigAnnotation] = v
	}
	var err error
	if c.Status, err = json.Marshal(st); err != nil {
		return c, fmt.Errorf("status.dump: %w", err)
	}
	return c, nil
}
