package kgohooks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// authCheckTimeout bounds the after-restore check of the SASL credentials:
// a broker that does not answer must not hold the restore.
const authCheckTimeout = 3 * time.Second

// checkAuth asks a broker for metadata with the new client and returns an
// error wrapping ErrAuthAfterRestore if the brokers refused its SASL
// credentials; anything else (a broker down, the deadline) is the client's
// usual business. The connection stays, for the client's first requests.
func checkAuth(ctx context.Context, cl *kgo.Client) error {
	ctx, cancel := context.WithTimeout(ctx, authCheckTimeout)
	defer cancel()
	err := cl.Ping(ctx)
	if errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.IllegalSaslState) || errors.Is(err, kerr.UnsupportedSaslMechanism) {
		return fmt.Errorf("%w: %w (did the credentials change while the image waited?)", ErrAuthAfterRestore, err)
	}
	return nil
}
