package kgohooks

import (
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

// The defaults the options' docs state, and what each option changes.
func TestOptionDefaults(t *testing.T) {
	c := newConfig(nil)
	if c.registry != notify.Default || c.log == nil || c.name != "" || c.txnID != SuffixTxnID || c.openTxn != AbortOpenTxn ||
		c.backoffMin != 50*time.Millisecond || c.backoffMax != time.Second {
		t.Errorf("defaults = %+v", c)
	}
	reg := notify.NewRegistry()
	c = newConfig([]Opt{nil, WithRegistry(reg), WithName("n"), WithTxnIDPolicy(KeepTxnID),
		WithOpenTxnPolicy(FailOnOpenTxn), WithRetryBackoff(time.Second, time.Millisecond)})
	if c.registry != reg || c.name != "n" || c.txnID != KeepTxnID || c.openTxn != FailOnOpenTxn ||
		c.backoffMin != time.Second || c.backoffMax != time.Second {
		t.Errorf("with options = %+v", c)
	}
	if c := newConfig([]Opt{WithRegistry(nil)}); c.registry != notify.Default {
		t.Errorf("WithRegistry(nil) registers with %p, want notify.Default", c.registry)
	}
}
