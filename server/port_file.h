// The port file: how a process that started depot-server with port 0 learns the
// ports it bound. Written once the server is serving, atomically (a temporary
// file renamed into place), so a reader that sees the file sees all of it.
#ifndef DEPOT_SERVER_PORT_FILE_H_
#define DEPOT_SERVER_PORT_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace depot {

// Writes `grpc_address` on line 1 and, when not empty, `metrics_address` on
// line 2. INTERNAL (with the OS error) when the file cannot be written.
absl::Status WritePortFile(const std::string& path,
                           const std::string& grpc_address,
                           const std::string& metrics_address);

}  // namespace depot

#endif  // DEPOT_SERVER_PORT_FILE_H_
