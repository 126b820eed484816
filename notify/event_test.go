package notify_test

import (
	"testing"

	"github.com/kcr-dev/kcr/notify"
)

func TestEventShortID(t *testing.T) {
	for _, tc := range []struct {
		ev   notify.Event
		want string
	}{
		{notify.Event{InstanceID: "0123456789abcdef0123456789abcdef", Generation: 3}, "01234567"},
		{notify.Event{InstanceID: "abc", Generation: 3}, "abc"},
		{notify.Event{Generation: 7}, "g7"},
	} {
		if got := tc.ev.ShortID(); got != tc.want {
			t.Errorf("%+v.ShortID() = %q, want %q", tc.ev, got, tc.want)
		}
	}
}
