package tlsreload

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

// pki is a CA with a server certificate for 127.0.0.1 and a client one.
type pki struct {
	caPEM, certPEM, keyPEM []byte // the client's files
	server                 tls.Certificate
	pool                   *x509.CertPool
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name + " leaf"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	sDER, sKey := leaf(2, x509.ExtKeyUsageServerAuth)
	cDER, cKey := leaf(3, x509.ExtKeyUsageClientAuth)
	keyDER, _ := x509.MarshalPKCS8PrivateKey(cKey)
	p := &pki{
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cDER}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		server:  tls.Certificate{Certificate: [][]byte{sDER}, PrivateKey: sKey},
		pool:    x509.NewCertPool(),
	}
	p.pool.AddCert(ca)
	return p
}

func (p *pki) write(t *testing.T, f *Files) {
	t.Helper()
	for path, b := range map[string][]byte{f.CA: p.caPEM, f.Cert: p.certPEM, f.Key: p.keyPEM} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// A server that requires a client certificate, both from the current PKI.
func serve(t *testing.T, cur *atomic.Pointer[pki]) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		p := cur.Load()
		return &tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				c.(*tls.Conn).Handshake()
				c.Write([]byte("ok"))
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

func handshake(addr string, cfg *tls.Config) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 2)
	_, err = c.Read(buf) // the server's verdict on our certificate arrives here (TLS 1.3)
	return err
}

// The CA and the client certificate rotated on disk while the image
// waited: the restored process's handshakes fail until the after-restore
// hook reloads the files; a resume leaves them as they were.
func TestReloadAfterRestore(t *testing.T) {
	dir := t.TempDir()
	f := &Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "client.pem"), Key: filepath.Join(dir, "client.key")}
	old, rotated := newPKI(t, "ca-1"), newPKI(t, "ca-2")
	var cur atomic.Pointer[pki]
	cur.Store(old)
	addr := serve(t, &cur)
	old.write(t, f)
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
	reg := notify.NewRegistry()
	f.Register(reg)
	cfg := f.Config()
	if err := handshake(addr, cfg); err != nil {
		t.Fatalf("handshake with the first CA: %v", err)
	}

	cur.Store(rotated) // the brokers and the files move to the new CA
	rotated.write(t, f)
	if err := handshake(addr, cfg); err == nil {
		t.Fatal("handshake succeeded with the old certificates in memory; the test proves nothing")
	}
	ctx := context.Background()
	if res, err := reg.Simulate(ctx, notify.SimResume, 5*time.Second); err != nil || res.AfterErr != nil {
		t.Fatalf("resume: %v %v", err, res.AfterErr)
	}
	if err := handshake(addr, cfg); err == nil {
		t.Fatal("a resume reloaded the files; only a restore should")
	}
	if res, err := reg.Simulate(ctx, notify.SimRestore, 5*time.Second); err != nil || res.AfterErr != nil {
		t.Fatalf("restore: %v %v", err, res.AfterErr)
	}
	if err := handshake(addr, cfg); err != nil {
		t.Fatalf("handshake after the restore's reload: %v", err)
	}

	// A half-written file fails the hook and keeps the loaded certificates.
	os.WriteFile(f.CA, []byte("-----BEGIN CERT"), 0o600)
	if res, err := reg.Simulate(ctx, notify.SimRestore, 5*time.Second); err != nil || res.AfterErr == nil {
		t.Fatalf("restore with a broken CA file: %v, hook error %v; want the hook to fail", err, res.AfterErr)
	}
	if err := handshake(addr, cfg); err != nil {
		t.Fatalf("handshake after a failed reload: %v", err)
	}
}
