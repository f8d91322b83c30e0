// Jobs started by srun and mpirun: the launchers' own variables, set as those
// launchers set them, are enough for squallCommInitFromEnv (no torch, no
// MASTER_ADDR). Ranks are forked processes on loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "squall/squall.h"
#include "src/bootstrap/launch_env.h"
#include "src/common/status.h"

namespace {

using squall::Status;
using squall::bootstrap::firstSlurmHost;
using squall::bootstrap::LaunchEnv;
using squall::bootstrap::readLaunchEnv;
using Vars = std::map<std::string, std::string>;

const char* const kLauncherVars[] = {"MASTER_ADDR",
                                     "MASTER_PORT",
                                     "RANK",
                                     "WORLD_SIZE",
                                     "LOCAL_RANK",
                                     "SQUALL_PORT",
                                     "SQUALL_PORT_OFFSET",
                                     "SQUALL_JOB_SECRET",
                                     "TORCHELASTIC_RUN_ID",
                                     "OMPI_COMM_WORLD_RANK",
                                     "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "OMPI_COMM_WORLD_LOCAL_SIZE",
                                     "OMPI_MCA_ess_base_jobid",
                                     "OMPI_MCA_orte_hnp_uri",
                                     "SLURM_PROCID",
                                     "SLURM_NTASKS",
                                     "SLURM_NPROCS",
                                     "SLURM_LOCALID",
                                     "SLURM_NODEID",
                                     "SLURM_JOB_ID",
                                     "SLURM_STEP_ID",
                                     "SLURM_JOB_NODELIST",
                                     "SLURM_STEP_NODELIST",
                                     "SLURM_NNODES"};

void setVars(const Vars& vars) {
  for (const char* name : kLauncherVars) unsetenv(name);
  for (const auto& [name, value] : vars) setenv(name.c_str(), value.c_str(), 1);
}

// What srun sets in task `rank` of a one-node step (the subset Squall could read).
Vars srunVars(int rank, int n, const std::string& nodelist, const std::string& jobid = "81723") {
  return {{"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_NTASKS", std::to_string(n)},
          {"SLURM_NPROCS", std::to_string(n)},
          {"SLURM_LOCALID", std::to_string(rank)},
          {"SLURM_NODEID", "0"},
          {"SLURM_JOB_ID", jobid},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_NODELIST", nodelist},
          {"SLURM_STEP_NODELIST", nodelist},
          {"SLURM_NNODES", "1"}};
}

// What Open MPI 4.1's mpirun sets in rank `rank` of a one-host job.
Vars mpirunVars(int rank, int n, int localSize, const std::string& jobid) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(n)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(localSize)},
          {"OMPI_MCA_ess_base_jobid", jobid},
          {"OMPI_MCA_orte_hnp_uri", jobid + ".0;tcp://192.0.2.2:40801"}};
}

class LaunchEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("SQUALL_SOCKET_IFNAME", "lo", 1);
    setVars({});
  }
  void TearDown() override { setVars({}); }
};

TEST(SlurmHostList, FirstHost) {
  EXPECT_EQ(firstSlurmHost("node07"), "node07");
  EXPECT_EQ(firstSlurmHost("node[07-09,12],gpu1"), "node07");
  EXPECT_EQ(firstSlurmHost("gpu1,node[07-09]"), "gpu1");
  EXPECT_EQ(firstSlurmHost("rack[3]-n[001-004]"), "rack3-n001");
  EXPECT_EQ(firstSlurmHost("a[1,5]-ib"), "a1-ib");
  EXPECT_EQ(firstSlurmHost(""), "");
}

TEST_F(LaunchEnvTest, SlurmVariables) {
  setVars(srunVars(2, 4, "node[03-04]"));
  LaunchEnv env;
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk) << squall::lastError();
  EXPECT_STREQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.nranks, 4);
  EXPECT_EQ(env.localRank, 2);
  EXPECT_EQ(env.host, "node03");
  EXPECT_GE(env.port, 10000);
  EXPECT_LT(env.port, 30000);
  EXPECT_EQ(env.secret, "slurm:81723.0");
  const int port = env.port;
  setenv("SLURM_STEP_ID", "1", 1);  // the next step of the job gets another port
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk);
  EXPECT_NE(env.port, port);
  setenv("MASTER_ADDR", "10.1.2.3", 1);  // set by hand: it wins
  setenv("SQUALL_PORT", "23456", 1);
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk);
  EXPECT_EQ(env.host, "10.1.2.3");
  EXPECT_EQ(env.port, 23456);
  setenv("SLURM_NTASKS", "two", 1);
  EXPECT_EQ(readLaunchEnv(&env), Status::kInvalidArgument);
  EXPECT_NE(squall::lastError().find("SLURM_NTASKS=\"two\""), std::string::npos);
}

TEST_F(LaunchEnvTest, OpenMpiVariables) {
  setVars(mpirunVars(1, 2, 2, "1108738049"));
  LaunchEnv env;
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk) << squall::lastError();
  EXPECT_STREQ(env.launcher, "openmpi");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.nranks, 2);
  EXPECT_EQ(env.host, "127.0.0.1");
  EXPECT_EQ(env.secret, "openmpi:1108738049");
  // Ranks on several hosts: Open MPI does not say where rank 0 is.
  setVars(mpirunVars(1, 4, 2, "1108738049"));
  EXPECT_EQ(readLaunchEnv(&env), Status::kInvalidArgument);
  EXPECT_NE(squall::lastError().find("mpirun -x MASTER_ADDR="), std::string::npos)
      << squall::lastError();
  setenv("SQUALL_PORT", "http", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  EXPECT_EQ(readLaunchEnv(&env), Status::kInvalidArgument);
  EXPECT_NE(squall::lastError().find("SQUALL_PORT=\"http\" is not an integer"), std::string::npos)
      << squall::lastError();
}

TEST_F(LaunchEnvTest, TorchrunVariablesWin) {
  Vars vars = srunVars(0, 2, "localhost");
  vars.insert(
      {{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  setVars(vars);
  LaunchEnv env;
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk) << squall::lastError();
  EXPECT_STREQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.nranks, 3);
  EXPECT_EQ(env.port, 29517);
}

// Where the secret comes from when SQUALL_JOB_SECRET is unset: the launcher's
// run id, else nothing (the fixed public value, which init warns about).
TEST_F(LaunchEnvTest, SecretSources) {
  const Vars torchrun = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  setVars(torchrun);
  LaunchEnv env;
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk) << squall::lastError();
  EXPECT_EQ(env.secretSource, "");
  const std::string publicSecret = env.secret;
  setenv("TORCHELASTIC_RUN_ID", "none", 1);  // torchrun without --rdzv-id
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk);
  EXPECT_EQ(env.secretSource, "");
  EXPECT_EQ(env.secret, publicSecret);
  setenv("TORCHELASTIC_RUN_ID", "5f0c8a2e-run", 1);
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk);
  EXPECT_EQ(env.secretSource, "TORCHELASTIC_RUN_ID");
  EXPECT_NE(env.secret, publicSecret);
  const std::string first = env.secret;
  setenv("TORCHELASTIC_RUN_ID", "another-run", 1);
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk);
  EXPECT_NE(env.secret, first);
  setenv("MASTER_PORT", "29600", 1);  // the same id at another rendezvous differs too
  setenv("TORCHELASTIC_RUN_ID", "5f0c8a2e-run", 1);
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk);
  EXPECT_NE(env.secret, first);
  setenv("SQUALL_JOB_SECRET", "s3cret", 1);
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk);
  EXPECT_EQ(env.secretSource, "SQUALL_JOB_SECRET");
  EXPECT_EQ(env.secret, "s3cret");
  setVars(srunVars(0, 2, "localhost"));
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk);
  EXPECT_EQ(env.secretSource, "SLURM_JOB_ID.SLURM_STEP_ID");
  setVars(mpirunVars(0, 2, 2, "1108738049"));
  ASSERT_EQ(readLaunchEnv(&env), Status::kOk);
  EXPECT_EQ(env.secretSource, "the Open MPI job id");
}

bool portIsFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(static_cast<uint16_t>(port));
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&in), sizeof(in)) == 0;
  close(fd);
  return ok;
}

// Forks n ranks, each with vars(rank) as its whole launcher environment; each
// creates its communicator from the environment and allreduces rank + 1.
// Ranks stay alive until every rank has reported (the parent closes
// `release`), so that no rank's exit can cut a peer's collective short.
void runJob(int n, const std::function<Vars(int)>& vars) {
  std::vector<pid_t> pids;
  int release[2];
  ASSERT_EQ(pipe(release), 0);
  std::vector<std::array<int, 2>> reports(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(pipe(reports[r].data()), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(release[1]);
      setVars(vars(r));
      squallConfig_t c = SQUALL_CONFIG_INIT;
      c.transport = squallTransportTcp;
      c.timeoutSeconds = 20;
      squallComm_t comm = nullptr;
      if (squallCommInitFromEnv(&comm, &c) != squallSuccess) {
        std::fprintf(stderr, "rank %d: %s\n", r, squallGetLastError());
        _exit(2);
      }
      int rank = -1, size = -1;
      squallCommRank(comm, &rank);
      squallCommSize(comm, &size);
      double x = rank + 1;
      const squallResult_t result = squallAllReduce(&x, &x, 1, squallFloat64, squallSum, comm);
      const bool ok = result == squallSuccess && rank == r && size == n && x == n * (n + 1) / 2.0;
      // The byte counters see this allreduce's messages: the direct algorithm
      // sends the 8 bytes to each of the n-1 peers and receives theirs.
      squallCommStats_t stats{};
      const bool counted = squallCommGetStats(comm, &stats) == squallSuccess &&
                           stats.operations == 1 &&
                           stats.bytesSent == 8u * static_cast<uint64_t>(n - 1) &&
                           stats.bytesReceived == 8u * static_cast<uint64_t>(n - 1);
      if (!counted)
        std::fprintf(stderr, "rank %d: stats %llu ops, %llu sent, %llu received\n", r,
                     static_cast<unsigned long long>(stats.operations),
                     static_cast<unsigned long long>(stats.bytesSent),
                     static_cast<unsigned long long>(stats.bytesReceived));
      if (!ok)
        std::fprintf(stderr, "rank %d (rank %d of %d): %s: %s (sum %g)\n", r, rank, size,
                     squallGetErrorString(result), squallGetLastError(), x);
      const char status = ok ? (counted ? '0' : '4') : '3';
      if (write(reports[r][1], &status, 1) != 1) _exit(5);
      char byte;
      while (read(release[0], &byte, 1) > 0) {
      }
      squallCommDestroy(comm);
      _exit(status - '0');
    }
    close(reports[r][1]);
    pids.push_back(pid);
  }
  close(release[0]);
  for (int r = 0; r < n; ++r) {
    char status = '?';
    EXPECT_EQ(read(reports[r][0], &status, 1), 1) << "rank " << r << " reported nothing";
    close(reports[r][0]);
  }
  close(release[1]);  // lets the ranks exit
  for (int r = 0; r < n; ++r) {
    int status = -1;
    ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " " << status;
  }
}

// A job id whose derived rendezvous port is free here (the port comes from
// the id, as it would in a real job).
std::string jobIdWithFreePort(const std::function<Vars(const std::string&)>& vars) {
  for (int i = 0; i < 100; ++i) {
    std::string candidate = std::to_string(1108738049 + i * 7919 + getpid() % 1000);
    setVars(vars(candidate));
    LaunchEnv env;
    if (readLaunchEnv(&env) == Status::kOk && portIsFree(env.port)) return candidate;
  }
  return "";
}

// A three-rank torchrun-style job: without a secret or a run id, rank 0
// warns once for the whole job (each rank initialises twice), in one line
// that says what is at risk, what to set and where to read more; the other
// ranks say nothing at WARN. With a run id nobody warns.
TEST_F(LaunchEnvTest, NoSecretIsWarnedOnceByRankZero) {
  constexpr int kRanks = 3;
  for (bool withRunId : {false, true}) {
    char path[] = "/tmp/squall_secret_warn_XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    int port = 0;
    for (int p = 20000 + getpid() % 5000; port == 0 && p < 30000; p += 7)
      if (portIsFree(p)) port = p;
    ASSERT_NE(port, 0);
    std::vector<pid_t> pids;
    for (int r = 0; r < kRanks; ++r) {
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        if (std::freopen(path, "a", stderr) == nullptr) _exit(4);
        Vars vars = {{"RANK", std::to_string(r)},
                     {"WORLD_SIZE", std::to_string(kRanks)},
                     {"MASTER_ADDR", "127.0.0.1"},
                     {"MASTER_PORT", std::to_string(port)},
                     {"SQUALL_PORT_OFFSET", "0"}};
        if (withRunId) vars["TORCHELASTIC_RUN_ID"] = "run-" + std::to_string(port);
        setVars(vars);
        for (int i = 0; i < 2; ++i) {
          squallConfig_t c = SQUALL_CONFIG_INIT;
          c.transport = squallTransportTcp;
          c.timeoutSeconds = 20;
          squallComm_t comm = nullptr;
          if (squallCommInitFromEnv(&comm, &c) != squallSuccess) {
            std::fprintf(stderr, "rank %d init: %s\n", r, squallGetLastError());
            _exit(2);
          }
          double x = 1;
          if (squallAllReduce(&x, &x, 1, squallFloat64, squallSum, comm) != squallSuccess) _exit(3);
          squallCommDestroy(comm);
        }
        std::fflush(stderr);
        _exit(0);
      }
      pids.push_back(pid);
    }
    for (int r = 0; r < kRanks; ++r) {
      int status = -1;
      ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " " << status;
    }
    std::vector<std::string> lines;
    if (FILE* f = std::fopen(path, "r")) {
      char line[8192];
      while (std::fgets(line, sizeof(line), f) != nullptr) lines.emplace_back(line);
      std::fclose(f);
    }
    std::remove(path);
    std::string log;
    std::vector<std::string> warnings;
    size_t warnLines = 0;
    for (const std::string& line : lines) {
      log += line;
      if (line.find("NO JOB SECRET") != std::string::npos) warnings.push_back(line);
      if (line.find("[squall] WARN") != std::string::npos) ++warnLines;
    }
    ASSERT_EQ(warnings.size(), withRunId ? 0u : 1u) << log;
    EXPECT_EQ(warnLines, warnings.size()) << "nothing else is said at WARN:\n" << log;
    if (withRunId) continue;
    const std::string& warning = warnings[0];
    // One line, from rank 0 (the log prefix is host:pid:tid).
    char pid0[32];
    std::snprintf(pid0, sizeof(pid0), ":%d:", static_cast<int>(pids[0]));
    EXPECT_NE(warning.find(pid0), std::string::npos) << warning;
    EXPECT_LT(warning.size(), 400u) << warning;
    EXPECT_NE(warning.find("can join"), std::string::npos) << warning;
    EXPECT_NE(warning.find("SQUALL_JOB_SECRET=$(openssl rand -hex 16)"), std::string::npos)
        << warning;
    EXPECT_NE(warning.find("docs/usage.md"), std::string::npos) << warning;
  }
}

TEST_F(LaunchEnvTest, SrunJobRuns) {
  const std::string jobid =
      jobIdWithFreePort([](const std::string& id) { return srunVars(0, 3, "localhost", id); });
  ASSERT_FALSE(jobid.empty());
  runJob(3, [&](int r) { return srunVars(r, 3, "localhost", jobid); });
}

TEST_F(LaunchEnvTest, MpirunJobRuns) {
  const std::string jobid =
      jobIdWithFreePort([](const std::string& id) { return mpirunVars(0, 3, 3, id); });
  ASSERT_FALSE(jobid.empty());
  runJob(3, [&](int r) { return mpirunVars(r, 3, 3, jobid); });
}

}  // namespace
