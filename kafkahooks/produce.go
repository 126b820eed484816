package kafkahooks

import (
	"errors"
	"io"
	"time"

	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/produce"
)

// heldProduce is a copy of a produce request whose records can be encoded
// again for every attempt.
type heldProduce struct {
	base    produce.Request
	topics  []heldTopic
	records int
}

type heldTopic struct {
	topic string
	parts []heldPartition
}

type heldPartition struct {
	partition int32
	version   int8
	attrs     protocol.Attributes
	recs      []heldRecord
}

type heldRecord struct {
	offset     int64
	time       time.Time
	key, value []byte
	headers    []protocol.Header
}

func holdProduce(r *produce.Request) (*heldProduce, error) {
	h := &heldProduce{base: produce.Request{TransactionalID: r.TransactionalID, Acks: r.Acks, Timeout: r.Timeout}}
	for _, t := range r.Topics {
		ht := heldTopic{topic: t.Topic}
		for _, part := range t.Partitions {
			hp := heldPartition{partition: part.Partition, version: part.RecordSet.Version, attrs: part.RecordSet.Attributes}
			if rr := part.RecordSet.Records; rr != nil {
				for {
					rec, err := rr.ReadRecord()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						return nil, err
					}
					hr := heldRecord{offset: rec.Offset, time: rec.Time, headers: append([]protocol.Header(nil), rec.Headers...)}
					if hr.key, err = readBytes(rec.Key); err != nil {
						return nil, err
					}
					if hr.value, err = readBytes(rec.Value); err != nil {
						return nil, err
					}
					hp.recs = append(hp.recs, hr)
				}
			}
			h.records += len(hp.recs)
			ht.parts = append(ht.parts, hp)
		}
		h.topics = append(h.topics, ht)
	}
	return h, nil
}

func readBytes(b protocol.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	defer b.Close()
	out, err := io.ReadAll(b)
	if out == nil && err == nil {
		out = []byte{}
	}
	return out, err
}

// request builds a fresh request with fresh record readers.
func (h *heldProduce) request() *produce.Request {
	r := h.base
	r.Topics = make([]produce.RequestTopic, len(h.topics))
	for i, t := range h.topics {
		rt := produce.RequestTopic{Topic: t.topic, Partitions: make([]produce.RequestPartition, len(t.parts))}
		for j, part := range t.parts {
			recs := make([]protocol.Record, len(part.recs))
			for k, hr := range part.recs {
				recs[k] = protocol.Record{
					Offset:  hr.offset,
					Time:    hr.time,
					Key:     protocol.NewBytes(hr.key),
					Value:   protocol.NewBytes(hr.value),
					Headers: hr.headers,
				}
			}
			rt.Partitions[j] = produce.RequestPartition{
				Partition: part.partition,
				RecordSet: protocol.RecordSet{Version: part.version, Attributes: part.attrs, Records: protocol.NewRecordReader(recs...)},
			}
		}
		r.Topics[i] = rt
	}
	return &r
}
