package kafkastandby

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// The OAUTHBEARER token file is read at every authentication: a token
// renewed in place is the one sent next.
func TestKafkaTokenFileReadEachTime(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	k := Security{SASLMechanism: "OAuthBearer", SASLTokenFile: file}
	if _, err := k.kgoOpts(slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--kafka-sasl-token-file") {
		t.Fatalf("missing token file: %v, want an error naming --kafka-sasl-token-file", err)
	}
	if err := os.WriteFile(file, []byte("first.jwt.x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := k.mechanism() // one mechanism, as the client keeps it
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"first.jwt.x", "second.jwt.y"} {
		if err := os.WriteFile(file, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, msg, err := m.Authenticate(t.Context(), "127.0.0.1:9092")
		if err != nil || !strings.Contains(string(msg), "auth=Bearer "+tok+"\x01") {
			t.Fatalf("authenticate: %q, %v: want the token %s", msg, err, tok)
		}
	}
}

// As root, a password file another user could have written is refused:
// that user would choose what kcr standby sends to the brokers.
func TestKafkaFilesTrusted(t *testing.T) {
	imagetest.NeedRoot(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name string
		prep func(string)
	}{
		{"another uid's", func(p string) { os.Chown(p, imagetest.OtherUID, imagetest.OtherUID) }},
		{"group-writable", func(p string) { os.Chmod(p, 0o620) }},
	} {
		p := filepath.Join(dir, c.name)
		if err := os.WriteFile(p, []byte("pw\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c.prep(p)
		k := Security{SASLMechanism: "plain", SASLUser: "u", SASLPasswordFile: p}
		if _, err := k.kgoOpts(log); !errors.Is(err, images.ErrUntrusted) {
			t.Errorf("%s password file: %v, want ErrUntrusted", c.name, err)
		}
	}
}
