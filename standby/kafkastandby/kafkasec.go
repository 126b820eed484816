package kafkastandby

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kcr-dev/kcr/images"
)

// Security is standby.Options.Kafka (KafkaSecurity, whose fields it has,
// documented there): how kcr standby's own Kafka clients (the lag watch,
// the claims and the group hold) reach the brokers, TLS and SASL. Checked
// by standby; the zero value is PLAINTEXT without SASL.
type Security struct {
	TLS              bool
	TLSCA            string
	TLSCert, TLSKey  string
	TLSServerName    string
	SASLMechanism    string
	SASLUser         string
	SASLPassword     string
	SASLPasswordFile string
	SASLTokenFile    string
}

// Mechanisms of Security.SASLMechanism.
const (
	SASLPlain       = "plain"
	SASLScramSHA256 = "scram-sha-256"
	SASLScramSHA512 = "scram-sha-512"
	SASLOAuthBearer = "oauthbearer"
)

// kafkaFileFix is the advice when a Kafka CA or credential file is refused
// by the owner rule.
const kafkaFileFix = "whoever can write it decides which brokers kcr standby trusts, or what it sends them: chown root: it and chmod go-w it and its directories"

// maxKafkaFile bounds the CA, certificate, key, password and token files.
const maxKafkaFile = 1 << 20

// kgoOpts reads the files and returns the kgo options of the supervisor's
// clients (none for PLAINTEXT without SASL). standby checked k.
func (k *Security) kgoOpts(log *slog.Logger) ([]kgo.Opt, error) {
	k.SASLMechanism = strings.ToLower(k.SASLMechanism)
	var opts []kgo.Opt
	tlsOn := k.TLS || k.TLSCA != "" || k.TLSCert != "" || k.TLSServerName != ""
	if tlsOn {
		cfg, err := k.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if k.SASLMechanism == "" {
		return opts, nil
	}
	if k.SASLMechanism == SASLPlain && !tlsOn {
		log.Warn("standby: --kafka-sasl-mechanism plain without TLS: the password crosses the network in clear (add --kafka-tls)")
	}
	m, err := k.mechanism()
	if err != nil {
		return nil, err
	}
	return append(opts, kgo.SASL(m)), nil
}

func (k *Security) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.TLSServerName}
	if k.TLSCA != "" {
		pem, err := readKafkaFile("--kafka-tls-ca", k.TLSCA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--kafka-tls-ca %s: no PEM certificate in it: give the CA's certificate in PEM", k.TLSCA)
		}
	}
	if k.TLSCert != "" {
		certPEM, err := readKafkaFile("--kafka-tls-cert", k.TLSCert)
		if err != nil {
			return nil, err
		}
		keyPEM, err := readKafkaFile("--kafka-tls-key", k.TLSKey)
		if err != nil {
			return nil, err
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert %s, --kafka-tls-key %s: %v: give a PEM certificate and its PEM key", k.TLSCert, k.TLSKey, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func (k *Security) mechanism() (sasl.Mechanism, error) {
	if k.SASLMechanism == SASLOAuthBearer {
		file := k.SASLTokenFile
		if _, err := readToken(file); err != nil {
			return nil, err
		}
		return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			tok, err := readToken(file)
			return oauth.Auth{Token: tok}, err
		}), nil
	}
	pass := k.SASLPassword
	if k.SASLPasswordFile != "" {
		b, err := readKafkaFile("--kafka-sasl-password-file", k.SASLPasswordFile)
		if err != nil {
			return nil, err
		}
		if pass = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"); pass == "" {
			return nil, fmt.Errorf("--kafka-sasl-password-file %s is empty: write the password into it", k.SASLPasswordFile)
		}
	}
	switch k.SASLMechanism {
	case SASLPlain:
		return plain.Auth{User: k.SASLUser, Pass: pass}.AsMechanism(), nil
	case SASLScramSHA256:
		return scram.Auth{User: k.SASLUser, Pass: pass}.AsSha256Mechanism(), nil
	default:
		return scram.Auth{User: k.SASLUser, Pass: pass}.AsSha512Mechanism(), nil
	}
}

// readToken reads the OAUTHBEARER token file, without surrounding space.
func readToken(file string) (string, error) {
	b, err := readKafkaFile("--kafka-sasl-token-file", file)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("--kafka-sasl-token-file %s is empty: write the token into it", file)
	}
	return tok, nil
}

// readKafkaFile reads one of the files of flag, as root only one that no
// other user could have written.
func readKafkaFile(flag, file string) ([]byte, error) {
	b, err := images.ReadTrustedFile(file, maxKafkaFile, kafkaFileFix)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, file, err)
	}
	return b, nil
}
