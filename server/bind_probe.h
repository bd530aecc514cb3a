// ProbeBind: can this process listen on an address right now? Asked before
// the gRPC server and the metrics endpoint bind theirs, so that an address in
// use is reported in one line of our own words instead of gRPC's log dump or
// prometheus-cpp's "null context when constructing CivetServer".
#ifndef DEPOT_SERVER_BIND_PROBE_H_
#define DEPOT_SERVER_BIND_PROBE_H_

#include "absl/status/status.h"
#include "server/server_options.h"

namespace depot {

// Binds (and closes) a TCP socket on each address `address.host` resolves to,
// with SO_REUSEADDR as gRPC's and civetweb's listeners set it. OK when one of
// them binds (the address may still be taken before the server binds it).
// Otherwise the first failure, its message the reason alone:
// UNAVAILABLE "address in use"; PERMISSION_DENIED "permission denied (ports
// below 1024 need privileges)"; INVALID_ARGUMENT "not an address of this
// machine" or "cannot resolve host ..."; INTERNAL for anything else, with
// the system's words.
absl::Status ProbeBind(const HostPort& address);

}  // namespace depot

#endif  // DEPOT_SERVER_BIND_PROBE_H_
