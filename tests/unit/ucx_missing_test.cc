// A host without UCX, played by pointing SQUALL_UCX_LIBRARY at a library that
// does not exist (main sets it before anything looks for UCX): communicators
// on the default transport run over TCP and say so in one INFO line per
// process; an explicit UCX request fails, saying what to install; and ranks
// with and without UCX agree on TCP. Ranks are threads (and, for the last, a
// second process) over loopback (SQUALL_SOCKET_IFNAME=lo, tests/meson.build).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "squall/squall.h"
#include "src/bootstrap/bootstrap.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/core/comm.h"
#include "src/transport/ucx/ucx_api.h"

namespace squall::core {
namespace {

constexpr const char* kMissingLibrary = "/nonexistent/squall-test/libucp.so.0";
constexpr const char* kFallbackLine = "UCX was not found, so TCP serves as the default transport";

std::mutex gLogMutex;
std::vector<std::string> gInfoLines;

void captureLog(LogLevel level, Subsys, const char*, int, const char* message) {
  std::lock_guard<std::mutex> lock(gLogMutex);
  if (level == LogLevel::kInfo) gInfoLines.emplace_back(message);
  if (level == LogLevel::kWarn) std::fprintf(stderr, "WARN %s\n", message);
}

int infoLinesWith(const std::string& text) {
  std::lock_guard<std::mutex> lock(gLogMutex);
  int n = 0;
  for (const std::string& line : gInfoLines) n += line.find(text) != std::string::npos ? 1 : 0;
  return n;
}

// Creates a communicator of n ranks (threads) with `config` and runs body on
// each; returns every rank's create status, and its last error in `errors`.
std::vector<Status> runRanks(int n, const CommConfig& config,
                             const std::function<void(Comm&)>& body,
                             std::vector<std::string>* errors) {
  bootstrap::UniqueId id;
  EXPECT_EQ(bootstrap::createUniqueId(&id), Status::kOk) << lastError();
  std::vector<Status> created(static_cast<size_t>(n), Status::kInternal);
  errors->assign(static_cast<size_t>(n), "");
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Comm> comm;
      created[static_cast<size_t>(r)] = Comm::create(id, n, r, config, &comm);
      if (created[static_cast<size_t>(r)] != Status::kOk) {
        (*errors)[static_cast<size_t>(r)] = lastError();
        return;
      }
      body(*comm);
      EXPECT_EQ(comm->barrier(), Status::kOk) << lastError();
    });
  }
  for (auto& t : threads) t.join();
  return created;
}

void expectNamesWhatToDo(const std::string& error) {
  EXPECT_NE(error.find("UCX could not be loaded"), std::string::npos) << error;
  EXPECT_NE(error.find(kMissingLibrary), std::string::npos) << error;
  EXPECT_NE(error.find("libucx0"), std::string::npos) << error;
  EXPECT_NE(error.find("SQUALL_UCX_LIBRARY"), std::string::npos) << error;
  EXPECT_NE(error.find("SQUALL_TRANSPORT=tcp"), std::string::npos) << error;
}

TEST(UcxMissing, TheLoaderSaysWhatIsMissing) {
  std::string why;
  EXPECT_EQ(transport::findUcx(&why), nullptr);
  EXPECT_NE(why.find(kMissingLibrary), std::string::npos) << why;
  EXPECT_NE(why.find("libucx0"), std::string::npos) << why;
}

TEST(UcxMissing, DefaultTransportRunsOverTcpAndSaysSoOnce) {
  CommConfig config;
  ASSERT_EQ(CommConfig::fromEnvironment(&config), Status::kOk) << lastError();
  ASSERT_EQ(config.transport, TransportKind::kUcxOrTcp);
  config.timeout = std::chrono::seconds(20);
  // Two communicators of three ranks one after the other, and a split of
  // each: every one runs over TCP, and the process says why only once.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> errors;
    auto created = runRanks(
        3, config,
        [](Comm& comm) {
          EXPECT_STREQ(comm.transportName(), "tcp");
          std::vector<float> x(1000, static_cast<float>(comm.rank() + 1)), y(1000, 0.0f);
          ASSERT_EQ(comm.allReduce(x.data(), y.data(), x.size(), DataType::kF32, ReduceOp::kSum),
                    Status::kOk)
              << lastError();
          for (float v : y) ASSERT_EQ(v, 6.0f);
          std::unique_ptr<Comm> half;
          ASSERT_EQ(comm.split(comm.rank() % 2, 0, &half), Status::kOk) << lastError();
          ASSERT_NE(half, nullptr);
          EXPECT_STREQ(half->transportName(), "tcp");
          EXPECT_EQ(half->barrier(), Status::kOk) << lastError();
        },
        &errors);
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(created[static_cast<size_t>(r)], Status::kOk)
          << "rank " << r << ": " << errors[static_cast<size_t>(r)];
  }
  EXPECT_EQ(infoLinesWith(kFallbackLine), 1);
  EXPECT_EQ(infoLinesWith("libucx0"), 1);
  // Through the C API, with the default config.
  squallUniqueId id;
  ASSERT_EQ(squallGetUniqueId(&id), squallSuccess) << squallGetLastError();
  squallComm_t comm = nullptr;
  ASSERT_EQ(squallCommInitRank(&comm, 1, id, 0, nullptr), squallSuccess) << squallGetLastError();
  const char* name = nullptr;
  EXPECT_EQ(squallCommTransport(comm, &name), squallSuccess);
  EXPECT_STREQ(name, "tcp");
  EXPECT_EQ(squallCommDestroy(comm), squallSuccess);
  EXPECT_EQ(infoLinesWith(kFallbackLine), 1);
}

TEST(UcxMissing, ExplicitUcxFailsSayingWhatToInstall) {
  // As squallTransportUcx and SQUALL_TRANSPORT=ucx resolve.
  CommConfig config;
  ASSERT_EQ(chooseTransport(squallTransportUcx, &config.transport), Status::kOk);
  ASSERT_EQ(config.transport, TransportKind::kUcx);
  setenv("SQUALL_TRANSPORT", "ucx", 1);
  TransportKind fromEnv = TransportKind::kTcp;
  ASSERT_EQ(chooseTransport(squallTransportDefault, &fromEnv), Status::kOk);
  setenv("SQUALL_TRANSPORT", "auto", 1);
  EXPECT_EQ(fromEnv, TransportKind::kUcx);
  config.timeout = std::chrono::seconds(20);
  std::vector<std::string> errors;
  auto created = runRanks(
      2, config, [](Comm&) { ADD_FAILURE() << "created over UCX"; }, &errors);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(created[static_cast<size_t>(r)], Status::kUnsupported) << "rank " << r;
    expectNamesWhatToDo(errors[static_cast<size_t>(r)]);
  }
  // Through the C API.
  squallUniqueId id;
  ASSERT_EQ(squallGetUniqueId(&id), squallSuccess) << squallGetLastError();
  squallConfig_t c = SQUALL_CONFIG_INIT;
  c.transport = squallTransportUcx;
  c.timeoutSeconds = 20;
  squallComm_t comm = nullptr;
  EXPECT_EQ(squallCommInitRank(&comm, 1, id, 0, &c), squallUnsupported);
  EXPECT_EQ(comm, nullptr);
  expectNamesWhatToDo(squallGetLastError());
  // None of this is the default transport's fallback.
  EXPECT_LE(infoLinesWith(kFallbackLine), 1);
}

// Set in the process UcxMixed starts as its rank 1: the unique id, in hex.
constexpr const char* kMixedIdVariable = "SQUALL_TEST_MIXED_ID";

CommConfig defaultConfig() {
  CommConfig config;
  EXPECT_EQ(chooseTransport(squallTransportDefault, &config.transport), Status::kOk);
  config.timeout = std::chrono::seconds(20);
  return config;
}

// Rank 1 of UcxMixed, with UCX; skipped unless UcxMixed started this process.
TEST(UcxMixed, RankWithUcx) {
  const char* hex = std::getenv(kMixedIdVariable);
  if (hex == nullptr) GTEST_SKIP() << "run by UcxMixed.RanksWithAndWithoutUcxAgreeOnTcp";
  ASSERT_NE(transport::findUcx(), nullptr) << "this rank was meant to have UCX";
  bootstrap::UniqueId id{};
  ASSERT_EQ(std::strlen(hex), 2 * sizeof(id.bytes));
  for (size_t i = 0; i < sizeof(id.bytes); ++i)
    id.bytes[i] = static_cast<uint8_t>(std::stoi(std::string(hex + 2 * i, 2), nullptr, 16));
  std::unique_ptr<Comm> comm;
  ASSERT_EQ(Comm::create(id, 2, 1, defaultConfig(), &comm), Status::kOk) << lastError();
  EXPECT_STREQ(comm->transportName(), "tcp");
  int64_t mine = 2, sum = 0;
  EXPECT_EQ(comm->allReduce(&mine, &sum, 1, DataType::kI64, ReduceOp::kSum), Status::kOk)
      << lastError();
  EXPECT_EQ(sum, 3);
  EXPECT_EQ(comm->barrier(), Status::kOk) << lastError();
  EXPECT_EQ(infoLinesWith("rank 0 cannot load UCX"), 1);
  EXPECT_EQ(infoLinesWith(kFallbackLine), 0);
}

// One rank without UCX (this process) and one with it (this binary again, in
// a process of its own, since whether UCX loads is settled once per process):
// on the default transport they agree on TCP instead of failing.
TEST(UcxMixed, RanksWithAndWithoutUcxAgreeOnTcp) {
  if (std::getenv(kMixedIdVariable) != nullptr) GTEST_SKIP() << "this is the rank with UCX";
  bootstrap::UniqueId id;
  ASSERT_EQ(bootstrap::createUniqueId(&id), Status::kOk) << lastError();
  std::string hex;
  for (uint8_t b : id.bytes) {
    char two[3];
    std::snprintf(two, sizeof(two), "%02x", b);
    hex += two;
  }
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    setenv(kMixedIdVariable, hex.c_str(), 1);
    setenv("SQUALL_UCX_LIBRARY", "libucp.so.0", 1);
    execl("/proc/self/exe", "ucx_missing_test", "--gtest_filter=UcxMixed.RankWithUcx",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(child, 0);
  std::unique_ptr<Comm> comm;
  EXPECT_EQ(Comm::create(id, 2, 0, defaultConfig(), &comm), Status::kOk) << lastError();
  if (comm != nullptr) {
    EXPECT_STREQ(comm->transportName(), "tcp");
    int64_t mine = 1, sum = 0;
    EXPECT_EQ(comm->allReduce(&mine, &sum, 1, DataType::kI64, ReduceOp::kSum), Status::kOk)
        << lastError();
    EXPECT_EQ(sum, 3);
    EXPECT_EQ(comm->barrier(), Status::kOk) << lastError();
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      FAIL() << "the rank with UCX did not finish within 40 s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the rank with UCX failed (its output is above), status " << status;
}

}  // namespace
}  // namespace squall::core

int main(int argc, char** argv) {
  // UcxMixed's rank with UCX keeps the library it was given.
  if (std::getenv(squall::core::kMixedIdVariable) == nullptr)
    setenv("SQUALL_UCX_LIBRARY", squall::core::kMissingLibrary, 1);
  setenv("SQUALL_TRANSPORT", "auto", 1);
  setenv("SQUALL_DEBUG", "INFO", 1);
  squall::reloadLogConfig();
  squall::setLogSink(&squall::core::captureLog);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
