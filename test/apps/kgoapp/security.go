package main

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kcr-dev/kcr/test/apps/appkit"
)

// secOpts are the kgo options of -sasl, -tls-ca and -kgo-log, added to every
// client the program builds.
var secOpts []kgo.Opt

// securityOpts turns the security flags into kgo options. The SASL
// callbacks run on every connection's authentication: a client kgohooks
// rebuilds after a restore asks them again, and Token mints a fresh token
// when the cached one expired while the image waited.
func securityOpts(sec *appkit.Security, kgoLogs bool) ([]kgo.Opt, error) {
	if err := sec.Check(); err != nil {
		return nil, err
	}
	var opts []kgo.Opt
	if kgoLogs {
		opts = append(opts, kgo.WithLogger(kgoLog{}))
	}
	tlsCfg, err := sec.TLS()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	switch sec.SASL {
	case "scram-sha-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: sec.User, Pass: sec.Password}.AsSha512Mechanism()))
	case "oauthbearer":
		opts = append(opts, kgo.SASL(oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			return oauth.Auth{Token: sec.Token()}, nil
		})))
	}
	return opts, nil
}
