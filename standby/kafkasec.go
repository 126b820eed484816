package standby

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
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

// KafkaSecurity is how the supervisor's own Kafka clients (the lag watch
// and the group hold) reach the brokers: TLS and SASL. The zero value is
// PLAINTEXT without SASL. The service's own clients are its business.
//
// As root, every file is read as images.ReadTrustedFile reads: it and the
// directories above it must belong to root (or the caller) and not be
// writable by group or others.
type KafkaSecurity struct {
	// TLS connects with TLS. It is implied by TLSCA, TLSCert and
	// TLSServerName.
	TLS bool
	// TLSCA is a PEM file of the CAs that sign the brokers' certificates
	// (default: the system's).
	TLSCA string
	// TLSCert and TLSKey are PEM files of a client certificate and its key,
	// for brokers that ask for one (ssl.client.auth=required).
	TLSCert, TLSKey string
	// TLSServerName is the name checked in the brokers' certificates
	// (default: the host of each broker's address).
	TLSServerName string

	// SASLMechanism is "" (no SASL), "plain", "scram-sha-256",
	// "scram-sha-512" or "oauthbearer" (any case).
	SASLMechanism string
	// SASLUser is the user of plain and SCRAM.
	SASLUser string
	// SASLPassword, or the content of SASLPasswordFile (read once, at New;
	// a trailing newline is dropped), is the password of plain and SCRAM:
	// one of them, not both.
	SASLPassword     string
	SASLPasswordFile string
	// SASLTokenFile holds the OAUTHBEARER token. It is read at every
	// authentication, so whatever renews the token (a sidecar, a
	// projected service account token) replaces the file's content.
	SASLTokenFile string
}

// Mechanisms of KafkaSecurity.SASLMechanism.
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

// set reports whether any option is set.
func (k *KafkaSecurity) set() bool { return *k != KafkaSecurity{} }

// check validates the options; its errors name the flag and the fix.
func (k *KafkaSecurity) check() error {
	k.SASLMechanism = strings.ToLower(k.SASLMechanism)
	secret := k.SASLPassword != "" || k.SASLPasswordFile != ""
	switch k.SASLMechanism {
	case "":
		if k.SASLUser != "" || secret || k.SASLTokenFile != "" {
			return errors.New("SASL credentials without --kafka-sasl-mechanism: give the mechanism (plain, scram-sha-256, scram-sha-512 or oauthbearer)")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		switch {
		case k.SASLUser == "":
			return fmt.Errorf("--kafka-sasl-mechanism %s needs --kafka-sasl-user", k.SASLMechanism)
		case !secret:
			return fmt.Errorf("--kafka-sasl-mechanism %s needs the password: --kafka-sasl-password-file FILE, or $KCR_KAFKA_SASL_PASSWORD", k.SASLMechanism)
		case k.SASLPassword != "" && k.SASLPasswordFile != "":
			return errors.New("two SASL passwords: give --kafka-sasl-password-file or $KCR_KAFKA_SASL_PASSWORD, not both")
		case k.SASLTokenFile != "":
			return fmt.Errorf("--kafka-sasl-token-file is for oauthbearer, not %s", k.SASLMechanism)
		}
	case SASLOAuthBearer:
		switch {
		case k.SASLTokenFile == "":
			return errors.New("--kafka-sasl-mechanism oauthbearer needs --kafka-sasl-token-file")
		case k.SASLUser != "" || secret:
			return errors.New("--kafka-sasl-mechanism oauthbearer takes its identity from the token: drop the SASL user and password")
		}
	default:
		return fmt.Errorf("--kafka-sasl-mechanism %q: want plain, scram-sha-256, scram-sha-512 or oauthbearer", k.SASLMechanism)
	}
	if (k.TLSCert == "") != (k.TLSKey == "") {
		return errors.New("--kafka-tls-cert and --kafka-tls-key go together: give both, or neither")
	}
	return nil
}

// kgoOpts reads the files and returns the kgo options of the supervisor's
// clients (none for PLAINTEXT without SASL). Call check first.
func (k *KafkaSecurity) kgoOpts(log *slog.Logger) ([]kgo.Opt, error) {
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

func (k *KafkaSecurity) tlsConfig() (*tls.Config, error) {
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

func (k *KafkaSecurity) mechanism() (sasl.Mechanism, error) {
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
