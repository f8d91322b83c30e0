// The objects behind the C API's opaque handles, shared by api_comm.cc and
// api_device.cc (or api_device_stub.cc without CUDA).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "squall/squall.h"
#include "src/bootstrap/bootstrap.h"
#include "src/coll/communicator.h"
#include "src/coll/compressed_state.h"
#include "src/core/transports.h"
#include "src/transport/nccl/device_comm.h"

namespace squall::core {
// What api_device.cc attaches to a compressor: the device state of a
// communicator built from NCCL, or the pinned staging buffers that let a host
// communicator take device pointers.
struct DeviceAttachment {
  virtual ~DeviceAttachment() = default;
};
}  // namespace squall::core

struct squallComm {
  std::unique_ptr<squall::bootstrap::Bootstrap> bootstrap;  // null over MPI and NCCL
  std::unique_ptr<squall::transport::Transport> transport;
  std::unique_ptr<squall::coll::Communicator> coll;  // null for a communicator built from NCCL
  squall::core::TransportKind kind = squall::core::TransportKind::kTcp;
  std::chrono::milliseconds timeout{0};
  // Set by squallCommInitFromNccl (over the caller's ncclComm_t, not owned).
  std::unique_ptr<squall::transport::nccl::DeviceComm> nccl;
  ~squallComm() {
    coll.reset();  // stops the worker before the transport goes
    transport.reset();
    bootstrap.reset();
  }
};

struct squallCompressor {
  squallComm_t comm = nullptr;
  std::unique_ptr<squall::coll::CompressedState> state;  // host communicators
  std::unique_ptr<squall::core::DeviceAttachment> device;
  uint64_t calls = 0;
};

namespace squall::optim {
class Optimizer;
struct Config;
struct Info;
}  // namespace squall::optim

namespace squall::core {
// Implemented in api_device.cc (CUDA and NCCL built in) or api_device_stub.cc.
// Creates the device state of a compressor on a communicator built from NCCL.
Status createDeviceCompressor(squallComm_t comm, size_t count, const codec::Spec& spec,
                              squallCompressor* compressor);
Status resetDeviceCompressor(squallCompressor* compressor);
Status deviceCompressorStats(squallCompressor* compressor, squallCompressorStats_t* stats);

// The device optimizer of a squallOptimizer on a communicator from NCCL
// (src/optim/cuda), and the host staging of device buffers for an optimizer
// on a host communicator. Without CUDA they return squallUnsupported.
Status createDeviceOptimizer(squallComm_t comm, size_t count, const optim::Config& config,
                             std::unique_ptr<DeviceAttachment>* out);
Status deviceOptimizerStep(DeviceAttachment* optimizer, float* dParams, const float* dGrads,
                           float lr, void* stream);
Status stagedOptimizerStep(optim::Optimizer* optimizer, float* dParams, const float* dGrads,
                           float lr, void* stream);
Status deviceOptimizerInfo(DeviceAttachment* optimizer, optim::Info* info);
Status deviceOptimizerStateSize(DeviceAttachment* optimizer, size_t* bytes);
Status deviceOptimizerSaveState(DeviceAttachment* optimizer, void* buffer, size_t capacity,
                                size_t* written);
Status deviceOptimizerLoadState(DeviceAttachment* optimizer, const void* buffer, size_t bytes);
}  // namespace squall::core
