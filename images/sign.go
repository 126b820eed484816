package images

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// Signed images. A checkpoint may sign its manifest with an ed25519 key;
// since the manifest holds the size and SHA-256 of every file, the
// signature covers the whole image. The signature is a file of its own,
// SignatureName, beside the manifest, and travels with it through export
// and import. Its one line reads
//
//	kcr-signature-v1 ed25519 <public key, base64> <signature, base64>
//
// and the signature is over sigContext followed by the manifest's exact
// bytes. Key files are text, one key a line, '#' comments and blank lines
// ignored:
//
//	kcr-ed25519-private-key <32-byte seed, base64>     (file mode 0600)
//	kcr-ed25519-public-key <32-byte key, base64> [comment]
//
// A public key file may hold several keys (a keyring): an image verifies
// if it is signed by any of them.

// SignatureName is the manifest's signature file in the image root.
const SignatureName = "manifest.sig"

// signatureTmp is where the signature is written before its rename.
const signatureTmp = SignatureName + ".tmp"

const (
	sigTag     = "kcr-signature-v1"
	privTag    = "kcr-ed25519-private-key"
	pubTag     = "kcr-ed25519-public-key"
	sigContext = "kcr image manifest signature v1\n" // binds the signature to its use
	// maxKeyFile and maxSigFile bound what is read of key and signature files.
	maxKeyFile = 1 << 20
	maxSigFile = 4 << 10
)

// ErrSignature: the image's signature is missing, malformed, made by a key
// that is not trusted, or does not match the manifest.
var ErrSignature = errors.New("image signature not valid")

// ErrKeyFile: a key file cannot be read or parsed.
var ErrKeyFile = errors.New("bad key file")

// Fingerprint names a public key in messages: "SHA256:" and the first 16
// hex digits of its SHA-256.
func Fingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "SHA256:" + hex.EncodeToString(sum[:8])
}

// GenerateKeyFiles writes a new key pair: the private key to prefix+".key"
// (mode 0600) and the public key to prefix+".pub" (mode 0644). It refuses
// to overwrite either file, and leaves neither behind on error.
func GenerateKeyFiles(prefix, comment string) (ed25519.PublicKey, error) {
	if prefix == "" {
		return nil, fmt.Errorf("images: keygen: no file prefix given; pass -o PREFIX")
	}
	if strings.ContainsAny(comment, "\n\r") {
		return nil, fmt.Errorf("images: keygen: the comment holds a line break; give one line")
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("images: keygen: %w", err)
	}
	privFile, pubFile := prefix+".key", prefix+".pub"
	for _, p := range []string{privFile, pubFile} {
		if _, err := os.Lstat(p); err == nil {
			return nil, fmt.Errorf("images: keygen: %s already exists: refusing to overwrite a key; choose another -o or remove it", p)
		}
	}
	privText := fmt.Sprintf("# kcr image signing key (ed25519); keep it secret, its public half is %s\n%s %s\n",
		Fingerprint(pub), privTag, base64.StdEncoding.EncodeToString(priv.Seed()))
	if err := writeNew(privFile, []byte(privText), 0o600); err != nil {
		return nil, err
	}
	pubLine := pubTag + " " + base64.StdEncoding.EncodeToString(pub)
	if comment != "" {
		pubLine += " " + comment
	}
	if err := writeNew(pubFile, []byte(pubLine+"\n"), 0o644); err != nil {
		os.Remove(privFile)
		return nil, err
	}
	return pub, nil
}

// writeNew creates file with data and mode, never replacing or following
// anything already there, and syncs it.
func writeNew(file string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("images: keygen: %s already exists: refusing to overwrite a key; choose another -o or remove it", file)
	}
	if err != nil {
		return fmt.Errorf("images: keygen: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode) // the umask may have narrowed it
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(file)
		return fmt.Errorf("images: keygen: write %s: %w", file, err)
	}
	return nil
}

// keyFix is the advice when a key file is refused by the owner rule.
const keyFix = "whoever can write a key file (or a directory above it) decides which images are trusted, or signs with their key: chown root: it and chmod go-w it and its directories"

// keyLines returns the non-comment lines of a key file, at most maxKeyFile
// bytes long. The file is read as ReadTrustedFile reads: as root, a key
// (a trust anchor) that another user could have written is refused.
func keyLines(file string, wantPrivate bool) ([][]string, error) {
	data, fi, err := readTrusted(file, maxKeyFile, keyFix)
	switch {
	case errors.Is(err, ErrUntrusted):
		return nil, fmt.Errorf("%w (%w)", err, ErrKeyFile)
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("images: %s: %w: %w: check the path, or write a key pair with kcr keygen -o PREFIX", file, ErrKeyFile, syscall.ENOENT)
	case errors.Is(err, errTooBig):
		return nil, fmt.Errorf("images: %s: %w: larger than %d bytes, not a key file", file, ErrKeyFile, maxKeyFile)
	case fi != nil && !fi.Mode().IsRegular():
		return nil, fmt.Errorf("images: %s: %w: a %s, not a key file", file, ErrKeyFile, kindOf(fi.Mode()))
	case err != nil:
		return nil, fmt.Errorf("images: %s: %w: %w", file, ErrKeyFile, err)
	}
	if wantPrivate && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("images: %s: %w: private key has mode %04o, readable by others: chmod 600 it (and consider it leaked)", file, ErrKeyFile, fi.Mode().Perm())
	}
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, maxKeyFile)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Fields(line))
	}
	return out, nil
}

// LoadPrivateKey reads a private key file written by GenerateKeyFiles. It
// refuses a file that group or others can read.
func LoadPrivateKey(file string) (ed25519.PrivateKey, error) {
	lines, err := keyLines(file, true)
	if err != nil {
		return nil, err
	}
	if len(lines) != 1 || len(lines[0]) != 2 || lines[0][0] != privTag {
		return nil, fmt.Errorf("images: %s: %w: want one line %q followed by the key: give the .key file written by \"kcr keygen\"", file, ErrKeyFile, privTag)
	}
	seed, err := base64.StdEncoding.DecodeString(lines[0][1])
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("images: %s: %w: the key is not %d bytes of base64: give the .key file written by \"kcr keygen\"", file, ErrKeyFile, ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// LoadPublicKeys reads public key files, each holding one key a line.
func LoadPublicKeys(files ...string) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for _, file := range files {
		lines, err := keyLines(file, false)
		if err != nil {
			return nil, err
		}
		if len(lines) == 0 {
			return nil, fmt.Errorf("images: %s: %w: no key in it: give a .pub file written by \"kcr keygen\"", file, ErrKeyFile)
		}
		for i, l := range lines {
			if l[0] == privTag {
				return nil, fmt.Errorf("images: %s: %w: this is a private key: give its .pub file, and keep the .key secret", file, ErrKeyFile)
			}
			pub, err := parsePublic(l)
			if err != nil {
				return nil, fmt.Errorf("images: %s: %w: key %d: %v: give a .pub file written by \"kcr keygen\"", file, ErrKeyFile, i+1, err)
			}
			keys = append(keys, pub)
		}
	}
	return keys, nil
}

func parsePublic(fields []string) (ed25519.PublicKey, error) {
	if len(fields) < 2 || fields[0] != pubTag {
		return nil, fmt.Errorf("want a line %q followed by the key", pubTag)
	}
	b, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("the key is not %d bytes of base64", ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}

// signManifest returns the content of the signature file for manifest.
func signManifest(priv ed25519.PrivateKey, manifest []byte) []byte {
	sig := ed25519.Sign(priv, signedMessage(manifest))
	pub := priv.Public().(ed25519.PublicKey)
	return fmt.Appendf(nil, "%s ed25519 %s %s\n", sigTag,
		base64.StdEncoding.EncodeToString(pub), base64.StdEncoding.EncodeToString(sig))
}

func signedMessage(manifest []byte) []byte {
	return append([]byte(sigContext), manifest...)
}

// verifySignature checks that sigFile is a signature of manifest by one of
// keys, and returns that key. label names the image or archive in errors;
// a nil sigFile means there is none.
func verifySignature(label string, manifest, sigFile []byte, keys []ed25519.PublicKey) (ed25519.PublicKey, error) {
	bad := func(format string, args ...any) error {
		return newError(label, SignatureName, ErrSignature, nil, fmt.Sprintf(format, args...))
	}
	if sigFile == nil {
		return nil, bad("%s missing: the image is not signed, and --verify-key asks for a signature; sign it with kcr checkpoint --sign, or drop --verify-key if you trust its source", SignatureName)
	}
	f := strings.Fields(string(sigFile))
	if len(f) != 4 || f[0] != sigTag || f[1] != "ed25519" || strings.Count(string(sigFile), "\n") > 1 {
		return nil, bad("%s is malformed (want one line %q): the signature was damaged or tampered with; refusing the image", SignatureName, sigTag+" ed25519 KEY SIG")
	}
	pb, err1 := base64.StdEncoding.DecodeString(f[2])
	sig, err2 := base64.StdEncoding.DecodeString(f[3])
	if err1 != nil || err2 != nil || len(pb) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize {
		return nil, bad("%s is malformed (bad key or signature encoding): the signature was damaged or tampered with; refusing the image", SignatureName)
	}
	pub := ed25519.PublicKey(pb)
	var trusted ed25519.PublicKey
	for _, k := range keys {
		if k.Equal(pub) {
			trusted = k
			break
		}
	}
	if trusted == nil {
		return nil, bad("signed by key %s, which is not one of the --verify-key keys: refusing the image; add that key's .pub if you trust its owner", Fingerprint(pub))
	}
	if !ed25519.Verify(trusted, signedMessage(manifest), sig) {
		return nil, bad("signature by %s does not match %s: the manifest was changed after it was signed, or the signature damaged; refusing the image", Fingerprint(pub), ManifestName)
	}
	return trusted, nil
}
