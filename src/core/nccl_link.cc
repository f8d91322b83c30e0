// Built into libsquall.so only (not the core library the plugins link):
// NCCL's version query, named once so that the linker keeps libnccl.so.2
// among libsquall's dependencies. The Python binding reaches NCCL through
// libsquall's handle, and the NCCL table (src/transport/nccl) then finds that
// copy by its soname. It is never called.
extern "C" int ncclGetVersion(int* version);
[[gnu::used]] static int (*const kLinkedNccl)(int*) = &ncclGetVersion;
