package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kgo"
	kscram "github.com/twmb/franz-go/pkg/sasl/scram"
)

// security is -tls-ca, -scram-user and -scram-password: TLS with the CA
// of that PEM file, SASL SCRAM-SHA-512 (docs/kafka-security.md).
type security struct {
	ca, user, password string
}

func (s security) tlsConfig() (*tls.Config, error) {
	if s.ca == "" {
		return nil, nil
	}
	b, err := os.ReadFile(s.ca)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", s.ca)
	}
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, nil
}

// kafkaGo sets the kafka-go consumer's Dialer and the producer's Transport.
func (s security) kafkaGo(rc *kafka.ReaderConfig, w *kafka.Writer) error {
	cfg, err := s.tlsConfig()
	if err != nil {
		return err
	}
	var mech sasl.Mechanism
	if s.user != "" {
		if mech, err = scram.Mechanism(scram.SHA512, s.user, s.password); err != nil {
			return err
		}
	}
	if cfg == nil && mech == nil {
		return nil
	}
	rc.Dialer = &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true, TLS: cfg, SASLMechanism: mech}
	w.Transport = &kafka.Transport{TLS: cfg, SASL: mech}
	return nil
}

// kgo returns the franz-go options.
func (s security) kgo() ([]kgo.Opt, error) {
	cfg, err := s.tlsConfig()
	if err != nil {
		return nil, err
	}
	var opts []kgo.Opt
	if cfg != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if s.user != "" {
		opts = append(opts, kgo.SASL(kscram.Auth{User: s.user, Pass: s.password}.AsSha512Mechanism()))
	}
	return opts, nil
}
