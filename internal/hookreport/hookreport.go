// Package hookreport holds the typed report of a notify resource's last
// hook run, and turns it into the map notify.Reporter returns, with the keys
// encoding/json gives the struct: the struct's json tags are the keys of the
// image manifest.
package hookreport

import (
	"reflect"
	"strings"
	"sync"
)

// Slot holds the report of a resource's last hook run. The zero value is
// empty and ready to use.
type Slot[R any] struct {
	mu  sync.Mutex
	rep R
	set bool
}

// Store replaces the report.
func (s *Slot[R]) Store(rep R) {
	s.mu.Lock()
	s.rep, s.set = rep, true
	s.mu.Unlock()
}

// Load returns the last report, and false before the first hook run.
func (s *Slot[R]) Load() (R, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rep, s.set
}

// Map returns the last report as the map notify.Reporter wants; nil before
// the first hook run.
func (s *Slot[R]) Map() map[string]any {
	rep, ok := s.Load()
	if !ok {
		return nil
	}
	return Map(rep)
}

// Map flattens a report struct (or a pointer to one) into a map with the
// keys encoding/json would write, embedded structs inlined, but keeping each
// value's Go type (an int64 stays an int64) for in-process readers such as
// notify's Simulate. A nil pointer gives nil.
func Map(v any) map[string]any {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer && rv.IsNil() {
		return nil
	}
	m := map[string]any{}
	addFields(m, rv)
	return m
}

func addFields(m map[string]any, v reflect.Value) {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if f.Anonymous {
			addFields(m, fv)
			continue
		}
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if opts == "omitempty" && fv.IsZero() {
			continue
		}
		if fv.Kind() == reflect.Pointer {
			if fv.IsNil() {
				continue
			}
			fv = fv.Elem()
		}
		m[name] = fv.Interface()
	}
}
