package standby

import (
	"errors"
	"fmt"
	"strings"
)

// KafkaSecurity is how the supervisor's own Kafka clients (the lag watch
// and the group hold) reach the brokers: TLS and SASL. The zero value is
// PLAINTEXT without SASL. The service's own clients are its business.
//
// As root, every file is read as images.ReadTrustedFile reads: it and the
// directories above it must belong to root (or the caller) and not be
// writable by group or others. Package kafkastandby reads them (its
// Security has the same fields).
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
