package rls

import (
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ServerOptions are the gRPC server options that Envoy's rate-limit
// service needs beside Register: a codec that reads a RateLimitRequest
// whose entries are not valid UTF-8. Proto3 refuses such a message whole,
// so the call fails, and Envoy lets a request through when its rate-limit
// service fails (failure_mode_deny is false by default): a client that puts
// one invalid byte in a header would skip every limit of the request. With
// this codec such a value is judged by its bytes, as any other, and every
// other descriptor is decided as usual. A call is capped at 4 MiB, gRPC's
// default. sketchproxy.RateLimitServerOptions hands them to programs.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(lenientCodec{encoding.GetCodecV2("proto")}),
		// A call is judged in time linear in its size, and this bounds it
		// at gRPC's default, which envoyproxy/ratelimit's server keeps: a
		// lower cap turns a call theirs answers (2.1 MB of descriptors
		// were measured there) into an error, and Envoy then lets the
		// request through unlimited.
		grpc.MaxRecvMsgSize(maxRLSMessage),
	}
}

// maxRLSMessage bounds one ShouldRateLimit call: 4 MiB, gRPC's default.
const maxRLSMessage = 4 << 20

// lenientCodec is gRPC's proto codec, but for a RateLimitRequest that the
// proto codec refuses: that one it reads field by field, keeping strings as
// the bytes they are (a Go string may hold any bytes).
type lenientCodec struct{ encoding.CodecV2 }

func (c lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	req, ok := v.(*rlsv3.RateLimitRequest)
	if err == nil || !ok {
		return err
	}
	b := data.Materialize()
	if lerr := readRLSRequest(b, req); lerr != nil {
		return err // malformed, not merely invalid UTF-8: the proto codec's error
	}
	return nil
}

// readRLSRequest reads a RateLimitRequest from its wire form into req
// (envoy.service.ratelimit.v3: domain 1, descriptors 2, hits_addend 3),
// skipping unknown fields.
func readRLSRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	*req = rlsv3.RateLimitRequest{}
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			req.Domain = string(v)
		case num == 2 && typ == protowire.BytesType:
			d := &rlv3.RateLimitDescriptor{}
			if err := readDescriptor(v, d); err != nil {
				return err
			}
			req.Descriptors = append(req.Descriptors, d)
		case num == 3 && typ == protowire.VarintType:
			req.HitsAddend = uint32(n)
		}
		return nil
	})
}

// readDescriptor reads a RateLimitDescriptor (entries 1, limit 2,
// hits_addend 3, is_negative_hits 4).
func readDescriptor(b []byte, d *rlv3.RateLimitDescriptor) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			e := &rlv3.RateLimitDescriptor_Entry{}
			err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					e.Key = string(v)
				case num == 2 && typ == protowire.BytesType:
					e.Value = string(v)
				}
				return nil
			})
			if err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
		case num == 2 && typ == protowire.BytesType:
			o := &rlv3.RateLimitDescriptor_RateLimitOverride{}
			err := eachField(v, func(num protowire.Number, typ protowire.Type, _ []byte, n uint64) error {
				switch {
				case num == 1 && typ == protowire.VarintType:
					o.RequestsPerUnit = uint32(n)
				case num == 2 && typ == protowire.VarintType:
					o.Unit = typev3.RateLimitUnit(n)
				}
				return nil
			})
			if err != nil {
				return err
			}
			d.Limit = o
		case num == 3 && typ == protowire.BytesType:
			h := &wrapperspb.UInt64Value{}
			err := eachField(v, func(num protowire.Number, typ protowire.Type, _ []byte, n uint64) error {
				if num == 1 && typ == protowire.VarintType {
					h.Value = n
				}
				return nil
			})
			if err != nil {
				return err
			}
			d.HitsAddend = h
		case num == 4 && typ == protowire.VarintType:
			d.IsNegativeHits = n != 0
		}
		return nil
	})
}

// eachField calls f with each field of the message b: its number, its
// wire type, and its bytes (length-delimited) or its value (varint).
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
		var v []byte
		var n uint64
		switch typ {
		case protowire.BytesType:
			v, l = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			n, l = protowire.ConsumeVarint(b)
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
		if err := f(num, typ, v, n); err != nil {
			return err
		}
	}
	return nil
}
