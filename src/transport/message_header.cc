#include "src/transport/message_header.h"

#include <cstring>
#include <string>

namespace squall::transport {
namespace {

template <typename T>
void put(uint8_t* out, size_t offset, T value) {
  std::memcpy(out + offset, &value, sizeof(T));
}

template <typename T>
T get(const uint8_t* in, size_t offset) {
  T value;
  std::memcpy(&value, in + offset, sizeof(T));
  return value;
}

}  // namespace

void encodeMessageHeader(const Tag& tag, uint64_t payloadBytes, uint8_t* out) {
  const Descriptor& d = tag.descriptor;
  put<uint32_t>(out, 0, kMessageMagic);
  put<uint32_t>(out, 4, tag.step);
  put<uint64_t>(out, 8, tag.sequence);
  put<uint64_t>(out, 16, payloadBytes);
  out[24] = static_cast<uint8_t>(d.kind);
  out[25] = static_cast<uint8_t>(d.dtype);
  out[26] = static_cast<uint8_t>(d.op);
  out[27] = d.codec;
  put<uint32_t>(out, 28, d.block);
  put<uint64_t>(out, 32, d.count);
}

MessageHeader decodeMessageHeader(const uint8_t* in) {
  MessageHeader h;
  Descriptor& d = h.tag.descriptor;
  h.magic = get<uint32_t>(in, 0);
  h.tag.step = get<uint32_t>(in, 4);
  h.tag.sequence = get<uint64_t>(in, 8);
  h.payloadBytes = get<uint64_t>(in, 16);
  d.kind = static_cast<CollKind>(in[24]);
  d.dtype = static_cast<DataType>(in[25]);
  d.op = static_cast<ReduceOp>(in[26]);
  d.codec = in[27];
  d.block = get<uint32_t>(in, 28);
  d.count = get<uint64_t>(in, 32);
  return h;
}

Status failMismatch(int self, int peer, const Tag& sent, uint64_t sentBytes, const Tag& posted,
                    size_t postedBytes) {
  return SQUALL_FAIL(Status::kInvalidUsage, Subsys::kTransport,
                     "rank %d sent %llu bytes for %s but this rank (%d) posted %zu bytes for %s: "
                     "the ranks called different collectives or counts",
                     peer, static_cast<unsigned long long>(sentBytes), describe(sent).c_str(), self,
                     postedBytes, describe(posted).c_str());
}

Status checkMessageHeader(const char* backend, int self, int peer, const Tag& expected,
                          size_t expectedPayload, const uint8_t* header, size_t available,
                          size_t messageBytes) {
  const MessageHeader got = available >= kMessageHeaderBytes && messageBytes >= kMessageHeaderBytes
                                ? decodeMessageHeader(header)
                                : MessageHeader{};
  SQUALL_REQUIRE(got.magic == kMessageMagic, Status::kCorruptData, Subsys::kTransport,
                 "rank %d received a %zu-byte %s message from rank %d without a valid squall "
                 "header while expecting %s; another program may be using the same "
                 "communicator or endpoint",
                 self, messageBytes, backend, peer, describe(expected).c_str());
  // A header that disagrees with the length it arrived with is damage, not a
  // usage error.
  SQUALL_REQUIRE(got.payloadBytes == messageBytes - kMessageHeaderBytes, Status::kCorruptData,
                 Subsys::kTransport,
                 "rank %d received a %s message from rank %d whose header announces %llu "
                 "payload bytes but which carries %zu; the message was damaged in transit",
                 self, backend, peer, static_cast<unsigned long long>(got.payloadBytes),
                 messageBytes - kMessageHeaderBytes);
  if (got.tag.sequence == expected.sequence && got.tag.step == expected.step &&
      got.tag.descriptor == expected.descriptor && got.payloadBytes == expectedPayload)
    return Status::kOk;
  return failMismatch(self, peer, got.tag, got.payloadBytes, expected, expectedPayload);
}

}  // namespace squall::transport
