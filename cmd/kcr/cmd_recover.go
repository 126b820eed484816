package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/images"
)

// recoverOpts are recover's arguments and flags.
type recoverOpts struct {
	cmdline
	signFile string
}

func recoverCmd(g *globals) *cobra.Command {
	var opts recoverOpts
	cmd := &cobra.Command{
		Use:   "recover DIR",
		Short: "Finish images whose kcr checkpoint died after the dump (DIR: the image's name given to -o, the hidden .NAME.kcr-tmp-* directory, or the directory holding them)",
		Args:  cobra.ExactArgs(1),
		RunE:  runE(g, &opts, runRecover),
	}
	signFlag(cmd.Flags(), &opts.signFile)
	return cmd
}

// recoverJSON is kcr recover --json's one shape: the images finished.
type recoverJSON struct {
	Images []string `json:"images"`
}

// runRecover runs kcr recover: results on out's stdout, the report on its stderr.
func runRecover(ctx context.Context, opts *recoverOpts, out *output) error {
	args := opts.args
	signFile := opts.signFile
	key, err := loadSignKey(signFile)
	if err != nil {
		return err
	}
	dirs := []string{args[0]}
	if !strings.Contains(filepath.Base(filepath.Clean(args[0])), ".kcr-tmp-") {
		if dirs = images.FindPending(args[0]); len(dirs) == 0 {
			// The image's name, as given to kcr checkpoint -o.
			dirs = images.FindPendingOf(args[0])
		}
		if len(dirs) == 0 {
			return fmt.Errorf("%s: %w: no interrupted checkpoint with a finished dump in it, nor of an image of that name", args[0], images.ErrNotRecoverable)
		}
	}
	var recovered []string
	for _, d := range dirs {
		img, err := images.Recover(ctx, d, key)
		if err != nil {
			return err
		}
		fmt.Fprintf(out.stderr, "kcr: recovered %s\n", img.Dir)
		recovered = append(recovered, img.Dir)
	}
	if out.json {
		return out.JSON(recoverJSON{Images: recovered})
	}
	return nil
}
