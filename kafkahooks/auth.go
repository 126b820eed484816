package kafkahooks

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/kcr-dev/kcr/internal/conntrack"
)

// authCheckTimeout bounds the after-restore check of the SASL credentials:
// a broker that does not answer must not hold the restore.
const authCheckTimeout = 3 * time.Second

// ErrAuthAfterRestore marks an after-restore hook error: the brokers refused
// the client's SASL credentials after a restore (a password changed or a
// user removed while the image waited). The clients would otherwise retry
// in the background, each request failing the same way.
var ErrAuthAfterRestore = errors.New("kafkahooks: SASL authentication failed after the restore")

// checkAuth authenticates once to the first of addrs (a comma-separated
// list) that answers, with mech over tlsCfg, and returns an error wrapping
// ErrAuthAfterRestore if a broker refused the credentials. Anything else (a
// broker down, the deadline) is nil: reaching brokers is the clients' own
// business. The connection is closed before it returns.
func checkAuth(ctx context.Context, addrs string, dial func(context.Context, string, string) (net.Conn, error), tlsCfg *tls.Config, mech sasl.Mechanism, clientID string) error {
	if mech == nil || addrs == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, authCheckTimeout)
	defer cancel()
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	conns := conntrack.New(dial, nil)
	tr := &kafka.Transport{Dial: conns.DialContext, TLS: tlsCfg, SASL: mech, ClientID: clientID}
	defer func() {
		tr.CloseIdleConnections()
		conns.CloseAll(true)
	}()
	for _, a := range strings.Split(addrs, ",") {
		cl := &kafka.Client{Addr: kafka.TCP(a), Transport: tr}
		_, err := cl.ApiVersions(ctx, &kafka.ApiVersionsRequest{Addr: kafka.TCP(a)})
		switch {
		case err == nil:
			return nil
		case errors.Is(err, kafka.SASLAuthenticationFailed), errors.Is(err, kafka.IllegalSASLState), errors.Is(err, kafka.UnsupportedSASLMechanism):
			return fmt.Errorf("%w: %s to %s: %w (did the credentials change while the image waited?)", ErrAuthAfterRestore, mech.Name(), a, err)
		case ctx.Err() != nil:
			return nil
		}
	}
	return nil
}
