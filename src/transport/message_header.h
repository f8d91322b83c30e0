// The small header that backends without their own tag matching on the full
// Tag (UCX, MPI) put in front of every payload.
//
// Those backends match messages on a few low bits of (sequence, step) that fit
// their native tag; the header carries the whole Tag and the payload size so
// the receiver can check that the message it matched is really the one it
// asked for, and print both sides when it is not. The layout is fixed (40
// bytes, host byte order: every rank of a job is assumed to share it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/common/status.h"
#include "src/transport/transport.h"

namespace squall::transport {

constexpr size_t kMessageHeaderBytes = 40;

void encodeMessageHeader(const Tag& tag, uint64_t payloadBytes, uint8_t* out);

// Checks that a matched message is the one a receive expected: `header` holds
// the first `available` bytes of it and `messageBytes` is its full length
// (header included). Fails with kInvalidUsage describing both sides when the
// descriptor, the (sequence, step) or the size differ, and with kCorruptData
// when the header is unreadable.
Status checkMessageHeader(const char* backend, int self, int peer, const Tag& expected,
                          size_t expectedPayload, const uint8_t* header, size_t available,
                          size_t messageBytes);

}  // namespace squall::transport
