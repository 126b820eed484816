// Package tlsreload is an example: a client TLS configuration whose CA and
// client certificate are read again from their files after every restore,
// so that a service restored by kcr after the files were rotated on disk
// uses the new ones (docs/kafka-security.md).
//
// Give Files.Config() to kafka.Transport.TLS and kafka.Dialer.TLS
// (kafka-go) or kgo.DialTLSConfig (franz-go), and register the reload:
//
//	f := &tlsreload.Files{CA: "/etc/kafka/ca.pem", Cert: "/etc/kafka/client.pem", Key: "/etc/kafka/client.key"}
//	if err := f.Load(); err != nil { ... }
//	f.Register(notify.Default)
//	cfg := f.Config()
package tlsreload

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/kcr-dev/kcr/notify"
)

// Files names the PEM files of the CA to trust and of the client's
// certificate and key (Cert and Key may be empty: no client certificate).
type Files struct {
	CA, Cert, Key string
	// ServerName is checked against the brokers' certificates; empty: the
	// host the client dialed.
	ServerName string

	cur atomic.Pointer[loaded]
}

type loaded struct {
	roots *x509.CertPool
	cert  *tls.Certificate
}

// Load reads the files. On error the certificates loaded before stay in use.
func (f *Files) Load() error {
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return fmt.Errorf("tlsreload: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("tlsreload: %s holds no PEM certificate", f.CA)
	}
	l := &loaded{roots: roots}
	if f.Cert != "" {
		c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return fmt.Errorf("tlsreload: %w", err)
		}
		l.cert = &c
	}
	f.cur.Store(l)
	return nil
}

// Register reads the files again after every restore (not after a resume:
// the files did not move under a process that kept running). A failed
// reload fails the hook, which kcr restore reports.
func (f *Files) Register(reg *notify.Registry) (unregister func()) {
	return reg.Register("tls-files", notify.Func(nil, func(_ context.Context, ev notify.Event) error {
		if ev.Kind != notify.Restore {
			return nil
		}
		return f.Load()
	}))
}

// Config returns a client TLS configuration that uses the files as last
// loaded, on every handshake. Go's own RootCAs check is replaced by
// VerifyConnection (InsecureSkipVerify only skips that fixed check), so
// that the root pool can change.
func (f *Files) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // verified in VerifyConnection against the current roots
		VerifyConnection:   f.verify,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if l := f.cur.Load(); l != nil && l.cert != nil {
				return l.cert, nil
			}
			return &tls.Certificate{}, nil // none: the server decides
		},
	}
}

func (f *Files) verify(cs tls.ConnectionState) error {
	l := f.cur.Load()
	if l == nil {
		return errors.New("tlsreload: Load was not called")
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tlsreload: the server sent no certificate")
	}
	name := f.ServerName
	if name == "" {
		name = cs.ServerName
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: name, Roots: l.roots, Intermediates: inter})
	return err
}
