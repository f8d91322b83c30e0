// How Squall finds MPI at run time (src/transport/mpi/mpi_table.h), in a
// process that links no libmpi. Each suite runs in a process of its own
// (tests/meson.build), since a table resolved once stays resolved:
//   MpiTableRefused  nothing usable: a missing library, one that is not MPI,
//                    MPICH's ABI named or loaded; never a crash;
//   MpiTableLoaded   the process loaded Open MPI itself (as mpi4py does):
//                    that copy is used, whatever SQUALL_MPI_LIBRARY says;
//   MpiTableDefault  none loaded: libmpi.so.40 from the loader's path.
#include "src/transport/mpi/mpi_table.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "src/common/log.h"
#include "src/transport/mpi/mpi_transport.h"

namespace squall::transport::mpi {
namespace {

bool openMpiLoaded() {
  void* lib = dlopen("libmpi.so.40", RTLD_NOW | RTLD_NOLOAD);
  if (lib != nullptr) dlclose(lib);
  return lib != nullptr;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A communicator value that must never be dereferenced: every case here
// fails before MPI would see it.
MPI_Comm unusedComm() {
  return reinterpret_cast<MPI_Comm>(uintptr_t{0x10});  // NOLINT(performance-no-int-to-ptr)
}

class MpiTableRefused : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(openMpiLoaded()) << "this test links no libmpi"; }
  void TearDown() override { unsetenv("SQUALL_MPI_LIBRARY"); }
};

TEST_F(MpiTableRefused, MissingLibrarySaysWhatToSet) {
  setenv("SQUALL_MPI_LIBRARY", "/nonexistent/libmpi.so.40", 1);
  const Table* table = nullptr;
  EXPECT_EQ(mpiTable(&table), Status::kUnsupported);
  EXPECT_EQ(table, nullptr);
  const std::string& error = lastError();
  EXPECT_TRUE(contains(error, "/nonexistent/libmpi.so.40")) << error;
  EXPECT_TRUE(contains(error, "point SQUALL_MPI_LIBRARY at Open MPI's libmpi.so.40")) << error;
  // The transport, and so Comm::fromMpi, fails the same way.
  std::unique_ptr<Transport> transport;
  EXPECT_EQ(createMpiTransport(unusedComm(), &transport), Status::kUnsupported);
  EXPECT_EQ(transport, nullptr);
  EXPECT_FALSE(openMpiLoaded());
}

TEST_F(MpiTableRefused, LibraryWithoutMpiIsNamed) {
  setenv("SQUALL_MPI_LIBRARY", "libm.so.6", 1);
  const Table* table = nullptr;
  EXPECT_EQ(mpiTable(&table), Status::kUnsupported);
  EXPECT_TRUE(contains(lastError(), "is not an MPI library")) << lastError();
}

TEST_F(MpiTableRefused, MpichNamedIsRefusedWithItsVersion) {
  const char* mpich = getenv("SQUALL_TEST_MPICH_DOUBLE");
  ASSERT_NE(mpich, nullptr) << "tests/meson.build sets SQUALL_TEST_MPICH_DOUBLE";
  setenv("SQUALL_MPI_LIBRARY", mpich, 1);
  const Table* table = nullptr;
  EXPECT_EQ(mpiTable(&table), Status::kUnsupported);
  const std::string& error = lastError();
  EXPECT_TRUE(contains(error, "MPICH Version")) << error;
  EXPECT_TRUE(contains(error, "speaks Open MPI's ABI")) << error;
}

// Last of the suite: it leaves the MPICH stand-in loaded.
TEST_F(MpiTableRefused, MpichLoadedByTheProcessIsRefused) {
  const char* mpich = getenv("SQUALL_TEST_MPICH_DOUBLE");
  ASSERT_NE(mpich, nullptr);
  ASSERT_NE(dlopen(mpich, RTLD_NOW | RTLD_LOCAL), nullptr) << dlerror();
  const Table* table = nullptr;
  EXPECT_EQ(mpiTable(&table), Status::kUnsupported);
  const std::string& error = lastError();
  EXPECT_TRUE(contains(error, "MPICH's ABI")) << error;
  EXPECT_TRUE(contains(error, "squallCommInitFromEnv")) << error;
}

std::vector<std::string>& infoLines() {
  static std::vector<std::string> lines;
  return lines;
}

void keepInfo(LogLevel level, Subsys, const char*, int, const char* message) {
  if (level == LogLevel::kInfo) infoLines().emplace_back(message);
}

TEST(MpiTableLoaded, TheProcessCopyIsUsed) {
  // As mpi4py's extension module brings it: local to its own handle.
  void* own = dlopen("libmpi.so.40", RTLD_NOW | RTLD_LOCAL);
  if (own == nullptr) GTEST_SKIP() << "Open MPI's libmpi.so.40 is not installed: " << dlerror();
  // Consulted only when the process has no Open MPI: a name that cannot be
  // opened proves the table came from the copy already loaded.
  setenv("SQUALL_MPI_LIBRARY", "/nonexistent/libmpi.so.40", 1);
  setenv("SQUALL_DEBUG", "INFO", 1);
  reloadLogConfig();
  setLogSink(keepInfo);
  const Table* table = nullptr;
  ASSERT_EQ(mpiTable(&table), Status::kOk) << lastError();
  const Table* again = nullptr;
  ASSERT_EQ(mpiTable(&again), Status::kOk);
  setLogSink(nullptr);
  EXPECT_EQ(again, table);
  EXPECT_EQ(reinterpret_cast<void*>(table->Isend), dlsym(own, "MPI_Isend"));
  EXPECT_EQ(reinterpret_cast<void*>(table->Improbe), dlsym(own, "MPI_Improbe"));
  EXPECT_EQ(reinterpret_cast<void*>(table->byte), dlsym(own, "ompi_mpi_byte"));
  EXPECT_EQ(reinterpret_cast<void*>(table->requestNull), dlsym(own, "ompi_request_null"));
  EXPECT_TRUE(contains(table->origin, "(already loaded)")) << table->origin;
  EXPECT_TRUE(contains(table->version, "Open MPI")) << table->version;
  int found = 0;
  for (const std::string& line : infoLines())
    found += contains(line, table->origin) && contains(line, table->version);
  EXPECT_EQ(found, 1) << "the library and its version are logged once at INFO";
  // MPI_Initialized is callable before MPI_Init: the transport says what to do.
  std::unique_ptr<Transport> transport;
  EXPECT_EQ(createMpiTransport(unusedComm(), &transport), Status::kInvalidUsage);
  EXPECT_TRUE(contains(lastError(), "MPI_Init_thread")) << lastError();
}

TEST(MpiTableDefault, OpenMpiFromTheLoaderPath) {
  ASSERT_FALSE(openMpiLoaded()) << "this test links no libmpi";
  unsetenv("SQUALL_MPI_LIBRARY");
  const Table* table = nullptr;
  Status status = mpiTable(&table);
  if (status == Status::kUnsupported && contains(lastError(), "could not be loaded"))
    GTEST_SKIP() << "Open MPI's libmpi.so.40 is not installed: " << lastError();
  ASSERT_EQ(status, Status::kOk) << lastError();
  EXPECT_TRUE(openMpiLoaded());
  EXPECT_TRUE(contains(table->origin, "libmpi.so.40")) << table->origin;
  EXPECT_FALSE(contains(table->origin, "(already loaded)")) << table->origin;
  EXPECT_NE(table->commNull, nullptr);
  std::unique_ptr<Transport> transport;
  EXPECT_EQ(createMpiTransport(unusedComm(), &transport), Status::kInvalidUsage);
}

}  // namespace
}  // namespace squall::transport::mpi
