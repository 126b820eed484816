// Command kcr-hook is kcr's CRIU action script as a small program of its
// own: what "kcr criu-hook" does, without the rest of kcr, so that it
// starts in a fraction of kcr's time while CRIU waits for it before the
// freeze. "kcr install-runtime-hook" makes the script run it when it lies
// beside the kcr binary (go install ./cmd/...).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kcr-dev/kcr/criuaction"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := criuaction.Main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
