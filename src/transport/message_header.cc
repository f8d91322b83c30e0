#include "src/transport/message_header.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace squall::transport {
namespace {

constexpr uint32_t kMagic = 0x314c5153;  // "SQL1"

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

// describe() plus what only a message has: the step (raw traffic shows it
// already) and the payload size.
std::string describeMessage(const Tag& tag, uint64_t bytes) {
  std::string text = describe(tag);
  char extra[64];
  if (tag.descriptor.kind != CollKind::kNone) {
    std::snprintf(extra, sizeof(extra), ", step %u", tag.step);
    text.append(extra);
  }
  std::snprintf(extra, sizeof(extra), ", %llu bytes", static_cast<unsigned long long>(bytes));
  text.append(extra);
  return text;
}

}  // namespace

// Layout: magic u32 | step u32 | sequence u64 | payload u64 | count u64 |
// block u32 | kind u8 | dtype u8 | op u8 | codec u8.
void encodeMessageHeader(const Tag& tag, uint64_t payloadBytes, uint8_t* out) {
  const Descriptor& d = tag.descriptor;
  put<uint32_t>(out, 0, kMagic);
  put<uint32_t>(out, 4, tag.step);
  put<uint64_t>(out, 8, tag.sequence);
  put<uint64_t>(out, 16, payloadBytes);
  put<uint64_t>(out, 24, d.count);
  put<uint32_t>(out, 32, d.block);
  out[36] = static_cast<uint8_t>(d.kind);
  out[37] = static_cast<uint8_t>(d.dtype);
  out[38] = static_cast<uint8_t>(d.op);
  out[39] = d.codec;
}

Status checkMessageHeader(const char* backend, int self, int peer, const Tag& expected,
                          size_t expectedPayload, const uint8_t* header, size_t available,
                          size_t messageBytes) {
  SQUALL_REQUIRE(available >= kMessageHeaderBytes && messageBytes >= kMessageHeaderBytes &&
                     get<uint32_t>(header, 0) == kMagic,
                 Status::kCorruptData, Subsys::kTransport,
                 "rank %d received a %zu-byte %s message from rank %d without a valid squall "
                 "header while expecting %s; another program may be using the same "
                 "communicator or endpoint",
                 self, messageBytes, backend, peer, describe(expected).c_str());
  Tag got;
  got.step = get<uint32_t>(header, 4);
  got.sequence = get<uint64_t>(header, 8);
  uint64_t payload = get<uint64_t>(header, 16);
  got.descriptor.count = get<uint64_t>(header, 24);
  got.descriptor.block = get<uint32_t>(header, 32);
  got.descriptor.kind = static_cast<CollKind>(header[36]);
  got.descriptor.dtype = static_cast<DataType>(header[37]);
  got.descriptor.op = static_cast<ReduceOp>(header[38]);
  got.descriptor.codec = header[39];
  // A header that disagrees with the length it arrived with is damage, not a
  // usage error.
  SQUALL_REQUIRE(payload == messageBytes - kMessageHeaderBytes, Status::kCorruptData,
                 Subsys::kTransport,
                 "rank %d received a %s message from rank %d whose header announces %llu "
                 "payload bytes but which carries %zu; the message was damaged in transit",
                 self, backend, peer, static_cast<unsigned long long>(payload),
                 messageBytes - kMessageHeaderBytes);
  if (got.sequence == expected.sequence && got.step == expected.step &&
      got.descriptor == expected.descriptor && payload == expectedPayload)
    return Status::kOk;
  return SQUALL_FAIL(Status::kInvalidUsage, Subsys::kTransport,
                     "rank %d expected %s from rank %d but received %s; the ranks called "
                     "different collectives or passed different counts: every rank must issue "
                     "the same collectives in the same order with the same arguments",
                     self, describeMessage(expected, expectedPayload).c_str(), peer,
                     describeMessage(got, payload).c_str());
}

}  // namespace squall::transport
