// A guard against a gRPC 1.51 bug that fails a fresh connection with a wrong
// error, seen as a first RPC failing with
//   UNAVAILABLE: failed to connect to all addresses; last error:
//   UNKNOWN: ipv4:127.0.0.1:PORT: No such file or directory
// right after the server reported SERVING.
//
// gRPC's grpc_tcp_client_create_from_prepared_fd (iomgr/tcp_client_posix.cc)
// calls connect() on a non-blocking socket, then grpc_sockaddr_to_uri and
// grpc_fd_create, and only then reads errno to tell EINPROGRESS (fine) from a
// real failure. grpc_fd_create locks absl mutexes. The first time in a process
// that a thread queues on an absl::Mutex behind another waiter, absl reads the
// CPU frequency once (absl::base_internal::NominalCPUFrequency), opening
// /sys/devices/system/cpu/cpu0/tsc_freq_khz, which many VMs lack: errno is
// left ENOENT. When that once-per-process moment falls between the connect()
// and the errno check (several channels connecting at once under CPU load),
// gRPC takes the connection for failed with ENOENT. Fixed upstream by reading
// errno right after connect() (grpc/grpc#35064); Debian bookworm ships 1.51.
#ifndef DEPOT_COMMON_WIRE_CONNECT_ERRNO_H_
#define DEPOT_COMMON_WIRE_CONNECT_ERRNO_H_

namespace depot {

// Runs absl's one-time CPU frequency probe now, in the calling thread and
// with errno preserved, so that it can no longer happen inside gRPC's connect
// path. Call before creating a gRPC client channel; cheap after the first
// call.
void GuardGrpcConnectErrno();

}  // namespace depot

#endif  // DEPOT_COMMON_WIRE_CONNECT_ERRNO_H_
