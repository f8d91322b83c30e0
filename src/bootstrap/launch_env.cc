// The launchers' variables, read once per communicator created from the
// environment. Every failure names the variable and says what to set.
#include "src/bootstrap/launch_env.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "src/common/params.h"

namespace squall::bootstrap {
namespace {

constexpr const char* kNeeds =
    "a job started without a unique id needs MASTER_ADDR, MASTER_PORT (or SQUALL_PORT), RANK "
    "and WORLD_SIZE (as torchrun sets them), or runs under srun or mpirun";

const char* getVar(const char* name) {
  const char* text = std::getenv(name);
  return text != nullptr && text[0] != '\0' ? text : nullptr;
}

Status parseInt(const char* name, const char* text, long long* value) {
  errno = 0;
  char* end = nullptr;
  *value = std::strtoll(text, &end, 10);
  SQUALL_REQUIRE(errno == 0 && end != text && *end == '\0', Status::kInvalidArgument,
                 Subsys::kBootstrap, "%s=\"%s\" is not an integer", name, text);
  return Status::kOk;
}

// `required`: fail naming the variable when it is unset; else *present says.
Status envInt(const char* name, bool required, long long* value, bool* present) {
  const char* text = getVar(name);
  *present = text != nullptr;
  if (text == nullptr) {
    SQUALL_REQUIRE(!required, Status::kInvalidArgument, Subsys::kBootstrap, "%s is not set; %s",
                   name, kNeeds);
    return Status::kOk;
  }
  return parseInt(name, text, value);
}

// A SQUALL_* integer read through the parameter table, but strictly: a value
// that does not parse is an error here, since a wrong port would hang the job.
Status paramIntStrict(Param param, long long* value, bool* present) {
  const std::string text = paramString(param);
  *present = !text.empty();
  if (!*present) return Status::kOk;
  return parseInt(paramInfo(param).name, text.c_str(), value);
}

uint64_t fnv1a(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

struct Names {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* localRank;
};
constexpr Names kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
constexpr Names kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                         "OMPI_COMM_WORLD_LOCAL_RANK"};
constexpr Names kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};

const Names& detect() {
  if (getVar("RANK") != nullptr || getVar("WORLD_SIZE") != nullptr) return kTorchrun;
  if (getVar("OMPI_COMM_WORLD_RANK") != nullptr) return kOpenMpi;
  if (getVar("SLURM_PROCID") != nullptr) return kSlurm;
  return kTorchrun;  // its messages name what is missing
}

// The job's identity where the launcher gives one: it seeds the default port
// and the secret, so two jobs sharing a host neither collide nor mix.
std::string jobId(const Names& names) {
  if (&names == &kSlurm) {
    const char* job = getVar("SLURM_JOB_ID");
    const char* step = getVar("SLURM_STEP_ID");
    if (job == nullptr) return "";
    return std::string("slurm:") + job + "." + (step != nullptr ? step : "");
  }
  if (&names == &kOpenMpi) {
    const char* job = getVar("OMPI_MCA_ess_base_jobid");
    if (job == nullptr) job = getVar("OMPI_MCA_orte_ess_jobid");
    return job != nullptr ? std::string("openmpi:") + job : "";
  }
  return "";
}

// What the job secret is derived from when SQUALL_JOB_SECRET is unset: the
// launcher's id of this run, which only the job's processes are handed.
// torchrun's run id is "none" unless --rdzv-id or --standalone gave one; it
// is combined with the rendezvous address so that one id reused for
// another job still differs.
std::string runId(const Names& names, const LaunchEnv& env) {
  if (&names != &kTorchrun) return jobId(names);
  const char* run = getVar("TORCHELASTIC_RUN_ID");
  if (run == nullptr || *run == '\0' || std::string_view(run) == "none") return "";
  const char* port = getVar("MASTER_PORT");
  return std::string("torchrun:") + run + "@" + env.host + ":" + (port != nullptr ? port : "");
}

Status readHost(const Names& names, long long nranks, LaunchEnv* out) {
  if (const char* master = getVar("MASTER_ADDR")) {
    out->host = master;
    out->hostSource = "MASTER_ADDR";
    return Status::kOk;
  }
  if (&names == &kSlurm) {
    for (const char* list : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
      if (const char* text = getVar(list)) {
        out->host = firstSlurmHost(text);
        out->hostSource = std::string("the first host of ") + list;
        SQUALL_REQUIRE(!out->host.empty(), Status::kInvalidArgument, Subsys::kBootstrap,
                       "%s=\"%s\" names no host; set MASTER_ADDR to rank 0's host", list, text);
        return Status::kOk;
      }
    }
    return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kBootstrap,
                       "SLURM_PROCID is set but neither SLURM_STEP_NODELIST nor "
                       "SLURM_JOB_NODELIST is; set MASTER_ADDR to rank 0's host");
  }
  if (&names == &kOpenMpi) {
    long long local = 0;
    bool present = false;
    SQUALL_TRY(envInt("OMPI_COMM_WORLD_LOCAL_SIZE", false, &local, &present));
    SQUALL_REQUIRE(present && local == nranks, Status::kInvalidArgument, Subsys::kBootstrap,
                   "MASTER_ADDR is not set and the %lld ranks of this mpirun job span several "
                   "hosts; Open MPI does not say where rank 0 runs, so pass it: mpirun -x "
                   "MASTER_ADDR=<rank 0's host> ...",
                   nranks);
    out->host = "127.0.0.1";
    out->hostSource = "Open MPI (every rank on this host)";
    return Status::kOk;
  }
  return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kBootstrap, "MASTER_ADDR is not set; %s",
                     kNeeds);
}

Status readPort(const std::string& job, LaunchEnv* out) {
  long long port = 0, masterPort = 0, offset = 0;
  bool present = false;
  SQUALL_TRY(paramIntStrict(Param::kPort, &port, &present));
  if (present) {
    SQUALL_REQUIRE(port >= 1 && port <= 65535, Status::kInvalidArgument, Subsys::kBootstrap,
                   "SQUALL_PORT=%lld is not a TCP port (1..65535)", port);
    out->port = static_cast<int>(port);
    return Status::kOk;
  }
  SQUALL_TRY(envInt("MASTER_PORT", job.empty(), &masterPort, &present));
  if (!present) {
    // Outside the ephemeral range (32768..60999 on Linux), the same on every rank.
    out->port = static_cast<int>(10000 + fnv1a(job) % 20000);
    return Status::kOk;
  }
  SQUALL_REQUIRE(masterPort >= 1 && masterPort <= 65535, Status::kInvalidArgument,
                 Subsys::kBootstrap, "MASTER_PORT=%lld is not a TCP port (1..65535)", masterPort);
  SQUALL_TRY(paramIntStrict(Param::kPortOffset, &offset, &present));
  port = masterPort + offset;
  SQUALL_REQUIRE(port >= 1 && port <= 65535, Status::kInvalidArgument, Subsys::kBootstrap,
                 "MASTER_PORT=%lld plus SQUALL_PORT_OFFSET=%lld gives %lld, which is not a "
                 "TCP port; choose a smaller offset or set SQUALL_PORT",
                 masterPort, offset, port);
  out->port = static_cast<int>(port);
  return Status::kOk;
}

}  // namespace

std::string firstSlurmHost(std::string_view nodelist) {
  std::string host;
  bool inBracket = false, tookRange = false;
  for (char c : nodelist) {
    if (inBracket) {
      if (c == ']') {
        inBracket = false;
      } else if (!tookRange) {
        if (c == '-' || c == ',') {
          tookRange = true;  // the rest of the bracket lists further hosts
        } else {
          host.push_back(c);
        }
      }
    } else if (c == '[') {
      inBracket = true;
    } else if (c == ',') {
      break;
    } else {
      host.push_back(c);
    }
  }
  return host;
}

Status readLaunchEnv(LaunchEnv* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kBootstrap,
                 "readLaunchEnv was given a null pointer");
  const Names& names = detect();
  LaunchEnv env;
  env.launcher = names.launcher;
  long long nranks = 0, rank = 0, localRank = 0;
  bool present = false;
  SQUALL_TRY(envInt(names.size, true, &nranks, &present));
  SQUALL_REQUIRE(nranks >= 1 && nranks <= (1 << 24), Status::kInvalidArgument, Subsys::kBootstrap,
                 "%s=%lld must be a positive number of ranks", names.size, nranks);
  SQUALL_TRY(envInt(names.rank, true, &rank, &present));
  SQUALL_REQUIRE(rank >= 0 && rank < nranks, Status::kInvalidArgument, Subsys::kBootstrap,
                 "%s=%lld must be between 0 and %s-1 (%lld)", names.rank, rank, names.size,
                 nranks - 1);
  SQUALL_TRY(envInt(names.localRank, false, &localRank, &present));
  env.localRank = present ? static_cast<int>(localRank) : -1;
  env.rank = static_cast<int>(rank);
  env.nranks = static_cast<int>(nranks);
  SQUALL_TRY(readHost(names, nranks, &env));
  const std::string job = jobId(names);
  SQUALL_TRY(readPort(job, &env));
  const std::string secret = paramString(Param::kJobSecret);
  if (!secret.empty()) {
    env.secret = secret;
    env.secretSource = "SQUALL_JOB_SECRET";
  } else if (const std::string run = runId(names, env); !run.empty()) {
    env.secret = run;
    env.secretSource = &names == &kTorchrun ? "TORCHELASTIC_RUN_ID"
                       : &names == &kSlurm  ? "SLURM_JOB_ID.SLURM_STEP_ID"
                                            : "the Open MPI job id";
  } else {
    env.secret = "squall: no job secret";
  }
  *out = std::move(env);
  return Status::kOk;
}

}  // namespace squall::bootstrap
