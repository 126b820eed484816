package appkit

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"
)

// Security is what the test programs' -sasl, -sasl-user, -sasl-password,
// -tls-ca and -token-lifetime flags ask for; the zero value is plaintext
// without SASL.
type Security struct {
	SASL          string // "", "scram-sha-512" or "oauthbearer"
	User          string // SCRAM user, or the token's subject
	Password      string // SCRAM password
	CA            string // PEM file of the CA to trust; TLS when set
	TokenLifetime time.Duration

	mu     sync.Mutex
	token  string
	expiry time.Time
}

// Flags registers the flags on fs.
func (s *Security) Flags(fs *flag.FlagSet) {
	fs.StringVar(&s.SASL, "sasl", "", `SASL mechanism: "", "scram-sha-512" or "oauthbearer" (unsecured JWTs the program mints)`)
	fs.StringVar(&s.User, "sasl-user", "kcr", "SCRAM user, or the subject of the minted tokens")
	fs.StringVar(&s.Password, "sasl-password", "", "SCRAM password")
	fs.StringVar(&s.CA, "tls-ca", "", "PEM file of the CA to trust: connect with TLS")
	fs.DurationVar(&s.TokenLifetime, "token-lifetime", time.Minute, "with -sasl oauthbearer: lifetime of each minted token")
}

// Check validates the flags.
func (s *Security) Check() error {
	switch s.SASL {
	case "", "scram-sha-512", "oauthbearer":
	default:
		return fmt.Errorf("-sasl %q: want scram-sha-512 or oauthbearer", s.SASL)
	}
	if s.TokenLifetime < time.Second {
		return errors.New("-token-lifetime must be at least 1s")
	}
	return nil
}

// TLS returns the client TLS config, nil without -tls-ca. The CA file is
// read once: see docs/kafka-security.md for reloading it after a restore.
func (s *Security) TLS() (*tls.Config, error) {
	if s.CA == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(s.CA)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate", s.CA)
	}
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, nil
}

// Token returns an unsecured JWT (alg none) for Kafka's unsecured OAUTHBEARER
// validator. Like a real token provider it caches the token and mints a new
// one when less than a fifth of its lifetime is left, by the wall clock: a
// restored process must not present a token that expired while its image
// waited. Each mint is logged as event "token".
func (s *Security) Token() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.token != "" && s.expiry.Sub(now) > s.TokenLifetime/5 {
		return s.token
	}
	// Whole seconds, iat not after now: the validator allows no clock skew.
	iat := now.Unix()
	exp := iat + int64(s.TokenLifetime/time.Second)
	claims, _ := json.Marshal(map[string]any{"sub": s.User, "iat": iat, "exp": exp})
	enc := base64.RawURLEncoding
	s.token = enc.EncodeToString([]byte(`{"alg":"none"}`)) + "." + enc.EncodeToString(claims) + "."
	s.expiry = time.Unix(exp, 0)
	Emit("token", "exp", exp)
	return s.token
}
