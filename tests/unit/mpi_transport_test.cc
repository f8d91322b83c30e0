// Tests of the MPI backend. An MPI program: meson runs it under mpirun with 2,
// 3 and 4 ranks over loopback TCP (see tests/meson.build). Every rank runs
// every test in the same order; waits have deadlines, so a rank that fails
// early cannot hang the others for long.
#include "src/transport/mpi/mpi_transport.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "src/transport/mpi/mpi_table.h"
#include "tests/unit/transport_exchange.h"

namespace squall::transport {
namespace {

using squall::testing::exchangeAll;
using squall::testing::rawTag;
using squall::testing::soon;
using namespace std::chrono_literals;

std::unique_ptr<Transport> makeMpi() {
  std::unique_ptr<Transport> transport;
  EXPECT_EQ(createMpiTransport(MPI_COMM_WORLD, &transport), Status::kOk) << lastError();
  return transport;
}

// The table is this program's MPI: its libmpi's functions, and the
// predefined handles as the program sees them. This program names all four,
// so the linker copies their objects into it (copy relocations) and libmpi
// uses those copies, not its own.
TEST(MpiTransport, TableIsTheProgramsMpi) {
  const mpi::Table* table = nullptr;
  ASSERT_EQ(mpi::mpiTable(&table), Status::kOk) << lastError();
  void* lib = dlopen("libmpi.so.40", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  EXPECT_EQ(reinterpret_cast<void*>(table->Isend), dlsym(lib, "MPI_Isend"));
  EXPECT_EQ(reinterpret_cast<void*>(table->Comm_dup), dlsym(lib, "MPI_Comm_dup"));
  dlclose(lib);
  EXPECT_EQ(table->byte, MPI_BYTE);
  EXPECT_EQ(table->commNull, MPI_COMM_NULL);
  EXPECT_EQ(table->errorsReturn, MPI_ERRORS_RETURN);
  EXPECT_EQ(table->requestNull, MPI_REQUEST_NULL);
  EXPECT_NE(std::string(table->origin).find("(already loaded)"), std::string::npos)
      << table->origin;
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  EXPECT_EQ(std::string(version).rfind(table->version, 0), 0u) << table->version;
}

TEST(MpiTransport, AllSizesToAllRanks) {
  auto t = makeMpi();
  ASSERT_NE(t, nullptr);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(t->rank(), rank);
  EXPECT_EQ(t->size(), size);
  EXPECT_TRUE(exchangeAll(*t, 1));
  EXPECT_TRUE(exchangeAll(*t, 2));
}

TEST(MpiTransport, OurTrafficDoesNotMatchTheApplications) {
  auto t = makeMpi();
  ASSERT_NE(t, nullptr);
  const int n = t->size(), me = t->rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
  // The application sends on MPI_COMM_WORLD with the tag our (1, 0) maps to
  // with Open MPI's 31 tag bits.
  int appOut = 1000 + me, appIn = -1;
  MPI_Request app[2];
  MPI_Irecv(&appIn, 1, MPI_INT, prev, 1 << 12, MPI_COMM_WORLD, &app[0]);
  MPI_Isend(&appOut, 1, MPI_INT, next, 1 << 12, MPI_COMM_WORLD, &app[1]);
  uint32_t out = 7u + me, in = 0;
  RequestPtr ours[2];
  // A failed ASSERT ends the test with the application's requests pending;
  // the MPI job fails then anyway.
  // NOLINTBEGIN(clang-analyzer-optin.mpi.MPI-Checker)
  ASSERT_EQ(t->recv(prev, rawTag(1, 0), &in, sizeof(in), &ours[0]), Status::kOk);
  ASSERT_EQ(t->send(next, rawTag(1, 0), &out, sizeof(out), &ours[1]), Status::kOk);
  ASSERT_EQ(t->waitAll(ours, soon()), Status::kOk) << lastError();
  // NOLINTEND(clang-analyzer-optin.mpi.MPI-Checker)
  MPI_Waitall(2, app, MPI_STATUSES_IGNORE);
  EXPECT_EQ(in, 7u + prev);
  EXPECT_EQ(appIn, 1000 + prev);
}

TEST(MpiTransport, ManyConcurrentRequestsReceivedInReverseOrder) {
  constexpr int kMessages = 200;
  auto t = makeMpi();
  ASSERT_NE(t, nullptr);
  const int n = t->size(), me = t->rank();
  const size_t total = static_cast<size_t>(n) * kMessages;
  std::vector<uint64_t> out(total), in(total, 0);
  std::vector<RequestPtr> requests(2 * total);
  for (int p = 0; p < n; ++p)
    for (int m = kMessages - 1; m >= 0; --m)
      ASSERT_EQ(t->recv(p, rawTag(7, m), &in[p * kMessages + m], sizeof(uint64_t),
                        &requests[p * kMessages + m]),
                Status::kOk);
  for (int p = 0; p < n; ++p)
    for (int m = 0; m < kMessages; ++m) {
      out[p * kMessages + m] = (uint64_t(me) << 32) | (uint64_t(p) << 16) | m;
      ASSERT_EQ(t->send(p, rawTag(7, m), &out[p * kMessages + m], sizeof(uint64_t),
                        &requests[(n + p) * kMessages + m]),
                Status::kOk);
    }
  ASSERT_EQ(t->waitAll(requests, soon(20s)), Status::kOk) << lastError();
  for (int p = 0; p < n; ++p)
    for (int m = 0; m < kMessages; ++m)
      EXPECT_EQ(in[p * kMessages + m], (uint64_t(p) << 32) | (uint64_t(me) << 16) | m);
}

TEST(MpiTransport, MismatchesNameBothSides) {
  auto t = makeMpi();
  ASSERT_NE(t, nullptr);
  Tag sent = rawTag(12, 0), wanted = rawTag(12, 0);
  sent.descriptor.kind = CollKind::kAllReduce;
  sent.descriptor.count = 16;
  wanted.descriptor.kind = CollKind::kAllGather;
  wanted.descriptor.count = 16;
  std::vector<float> data(16, 1.0f), big(64, 0.0f);
  if (t->rank() == 0) {
    RequestPtr s[3];
    ASSERT_EQ(t->send(1, sent, data.data(), 64, &s[0]), Status::kOk);
    ASSERT_EQ(t->send(1, rawTag(13, 1), data.data(), 64, &s[1]), Status::kOk);
    ASSERT_EQ(t->send(1, rawTag(13, 2), data.data(), 64, &s[2]), Status::kOk);
    EXPECT_EQ(t->waitAll(s, soon()), Status::kOk) << lastError();
  } else if (t->rank() == 1) {
    RequestPtr r;
    ASSERT_EQ(t->recv(0, wanted, data.data(), 64, &r), Status::kOk);
    EXPECT_EQ(t->waitAll({&r, 1}, soon()), Status::kInvalidUsage);
    EXPECT_NE(lastError().find("allgather"), std::string::npos) << lastError();
    EXPECT_NE(lastError().find("allreduce"), std::string::npos) << lastError();
    for (auto [step, bytes] : {std::pair<uint32_t, size_t>{1, 32}, {2, 256}}) {
      ASSERT_EQ(t->recv(0, rawTag(13, step), big.data(), bytes, &r), Status::kOk);
      EXPECT_EQ(t->waitAll({&r, 1}, soon()), Status::kInvalidUsage);
      EXPECT_NE(lastError().find(std::to_string(bytes) + " bytes"), std::string::npos)
          << lastError();
      EXPECT_NE(lastError().find("64 bytes"), std::string::npos) << lastError();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiTransport, CancelledReceiveDoesNotTakeTheMessage) {
  auto t = makeMpi();
  ASSERT_NE(t, nullptr);
  const int n = t->size(), me = t->rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
  uint64_t dropped = 0;
  {
    RequestPtr r;
    ASSERT_EQ(t->recv(prev, rawTag(4, 0), &dropped, sizeof(dropped), &r), Status::kOk);
    t->progress();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  uint64_t out = 40 + me, in = 0;
  RequestPtr both[2];
  ASSERT_EQ(t->send(next, rawTag(4, 0), &out, sizeof(out), &both[0]), Status::kOk);
  ASSERT_EQ(t->recv(prev, rawTag(4, 0), &in, sizeof(in), &both[1]), Status::kOk);
  ASSERT_EQ(t->waitAll(both, soon()), Status::kOk) << lastError();
  EXPECT_EQ(in, 40u + prev);
  EXPECT_EQ(dropped, 0u);
}

TEST(MpiTransport, TimeoutNamesThePeer) {
  auto t = makeMpi();
  ASSERT_NE(t, nullptr);
  if (t->rank() == 0) {
    uint64_t value;
    RequestPtr r;
    ASSERT_EQ(t->recv(t->size() - 1, rawTag(99, 0), &value, sizeof(value), &r), Status::kOk);
    EXPECT_EQ(t->waitAll({&r, 1}, soon(300ms)), Status::kTimeout);
    EXPECT_NE(lastError().find("rank(s) " + std::to_string(t->size() - 1)), std::string::npos)
        << lastError();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace squall::transport

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // One rank's report is enough when all pass; failures print everywhere.
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = RUN_ALL_TESTS();
  MPI_Finalize();
  return result;
}
