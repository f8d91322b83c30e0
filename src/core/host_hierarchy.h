// Finds the host structure of a communicator built from a bootstrap and
// sets up the shared-memory segment of its hierarchical compressed
// allreduce (coll/hierarchy.h), or decides on the flat algorithm.
#pragma once

#include <memory>
#include <string>

#include "src/bootstrap/bootstrap.h"
#include "src/coll/hierarchy.h"

namespace squall::core {

// This process's host key: "id:" + SQUALL_HOSTID when set, else the boot id
// and the inode of the network namespace (ranks in separate network
// namespaces of one machine are separate hosts here, as perf/links.sh
// emulates them).
std::string hostKey();

// Collective over `bootstrap` (three all-gathers, every rank alike). Sets
// *out to the hierarchy, or to null for the flat algorithm, with one INFO
// line saying why (SQUALL_HIERARCHY=off, one host, irregular hosts) or a WARN
// when shared memory could not be set up on some rank. Fails only when the
// bootstrap does.
Status discoverHierarchy(bootstrap::Bootstrap& bootstrap, std::unique_ptr<coll::Hierarchy>* out);

}  // namespace squall::core
