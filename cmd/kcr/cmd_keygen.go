package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kcr-dev/kcr/images"
)

// keygenOpts are keygen's arguments and flags.
type keygenOpts struct {
	cmdline
	prefix  string
	comment string
}

func keygenCmd(g *globals) *cobra.Command {
	var opts keygenOpts
	cmd := &cobra.Command{
		Use:   "keygen -o PREFIX",
		Short: "Create an ed25519 key pair to sign images (PREFIX.key, secret) and verify them (PREFIX.pub)",
		Long: `Create an ed25519 key pair for signed images: PREFIX.key, the private key (mode 0600),
for kcr checkpoint --sign, and PREFIX.pub, the public key, for kcr restore/import/inspect
--verify-key. Existing files are never overwritten.

Both are text files, one key a line: "kcr-ed25519-private-key BASE64-SEED" and
"kcr-ed25519-public-key BASE64-KEY [comment]". Public key files may hold several keys
(concatenate .pub files into a keyring); lines starting with # are comments.`,
		Args: cobra.NoArgs,
		RunE: runE(g, &opts, runKeygen),
	}
	cmd.Flags().StringVarP(&opts.prefix, "output", "o", "", "write PREFIX.key and PREFIX.pub")
	cmd.Flags().StringVar(&opts.comment, "comment", "", "comment at the end of the public key's line (e.g. who owns it)")
	return cmd
}

// signFlag adds --sign.
func signFlag(f *pflag.FlagSet, file *string) {
	f.StringVar(file, "sign", "", "sign the image's manifest with this private key (from kcr keygen)")
}

// verifyKeyFlag adds --verify-key.
func verifyKeyFlag(f *pflag.FlagSet, files *[]string) {
	f.StringArrayVar(files, "verify-key", nil, "require the image to be signed by a key in this public key file (repeatable; a file may hold several keys)")
}

// loadSignKey reads --sign's key; "" means no signing.
func loadSignKey(file string) (ed25519.PrivateKey, error) {
	if file == "" {
		return nil, nil
	}
	k, err := images.LoadPrivateKey(file)
	if err != nil {
		return nil, &exitError{exitUsage, fmt.Errorf("--sign: %w", err)}
	}
	return k, nil
}

// loadVerifyKeys reads --verify-key's files; none means no check.
func loadVerifyKeys(files []string) ([]ed25519.PublicKey, error) {
	if len(files) == 0 {
		return nil, nil
	}
	keys, err := images.LoadPublicKeys(files...)
	if err != nil {
		return nil, &exitError{exitUsage, fmt.Errorf("--verify-key: %w", err)}
	}
	return keys, nil
}

// hasSignature reports whether the image in dir carries a signature file.
func hasSignature(dir string) bool {
	fi, err := os.Lstat(dir + "/" + images.SignatureName)
	return err == nil && fi.Mode().IsRegular()
}

// keygenJSON is kcr keygen --json's one shape: the files written.
type keygenJSON struct {
	PrivateKey  string `json:"private_key"`
	PublicKey   string `json:"public_key"`
	Fingerprint string `json:"fingerprint"`
}

// runKeygen runs kcr keygen: results on out's stdout, the report on its stderr.
func runKeygen(ctx context.Context, opts *keygenOpts, out *output) error {
	prefix, comment := opts.prefix, opts.comment
	if prefix == "" {
		return &exitError{exitUsage, errors.New("keygen needs -o PREFIX: the key pair is written to PREFIX.key and PREFIX.pub")}
	}
	pub, err := images.GenerateKeyFiles(prefix, comment)
	if err != nil {
		return err
	}
	fp := images.Fingerprint(pub)
	fmt.Fprintf(out.stderr, "wrote %s.key (private: keep it secret) and %s.pub (public, %s)\n", prefix, prefix, fp)
	if out.json {
		return out.JSON(keygenJSON{PrivateKey: prefix + ".key", PublicKey: prefix + ".pub", Fingerprint: fp})
	}
	return nil
}
