package hooks

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kcr-dev/kcr/notify"
)

// Every dial through a Conns counts as activity, and its open connections
// keep the process from being idle until they are closed.
func TestConnsActivity(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	reg := notify.NewRegistry()
	conns := TrackConns("http", nil, WithRegistry(reg))
	tr := &http.Transport{DialContext: conns.DialContext}
	res, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if a := reg.Activity(); a.Count != 1 || a.OpenConns != 1 {
		t.Fatalf("one kept-alive connection: %+v, want Count 1, OpenConns 1", a)
	}
	tr.CloseIdleConnections()
	conns.Close()
	if a := reg.Activity(); a.OpenConns != 0 || a.Count != 1 {
		t.Fatalf("after Close: %+v, want Count 1, OpenConns 0", a)
	}
}
