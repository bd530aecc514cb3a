// ShapedLink: a private network namespace joined to this one by a veth pair
// whose two ends are both shaped by tc (tbf) to one rate, so that a benchmark's
// server runs behind a wire of known speed instead of loopback, where the
// link's cost is CPU time shared with everything else.
//
// Creating one needs root (CAP_SYS_ADMIN for the namespace, CAP_NET_ADMIN for
// the link); callers fall back to loopback when Create fails. Everything
// created is removed by Teardown (also from the destructor), and Create
// removes what it made before it fails. Namespaces left by a depot-bench that
// was killed (SIGKILL) are removed by the next Create.
//
// Also here: one raw TCP stream between two endpoints (each in this namespace
// or in a named one), the link's measured rate.
#ifndef DEPOT_TESTS_BENCH_NETNS_H_
#define DEPOT_TESTS_BENCH_NETNS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace depot::bench {

// A tc rate such as "10gbit", "500mbit" or "2.5gbit" in bits/s.
// INVALID_ARGUMENT for anything else (a number, then bit, kbit, mbit, gbit or
// tbit) or a rate outside [1kbit, 10tbit].
absl::StatusOr<double> ParseLinkRate(const std::string& rate);

class ShapedLink {
 public:
  // Creates namespace "depot-bench-PID", a veth pair with a private /30
  // (10.213.a.b+1 here, +2 inside, a subnet no interface here uses), brings
  // both ends and the namespace's lo up, and puts a tbf qdisc of `rate` on
  // each end. FAILED_PRECONDITION when not root; INTERNAL with the failing
  // command's output otherwise.
  static absl::StatusOr<std::unique_ptr<ShapedLink>> Create(
      const std::string& rate);

  ShapedLink(const ShapedLink&) = delete;
  ShapedLink& operator=(const ShapedLink&) = delete;
  ~ShapedLink();

  // Deletes the veth pair and the namespace; idempotent. Processes still in
  // the namespace lose the link but are not killed.
  void Teardown();

  const std::string& netns() const { return netns_; }
  // This namespace's end and the namespace's end, dotted IPv4.
  const std::string& outer_address() const { return outer_address_; }
  const std::string& inner_address() const { return inner_address_; }
  // argv that runs a command inside the namespace: append the command.
  std::vector<std::string> ExecPrefix() const;

 private:
  ShapedLink() = default;
  absl::Status Build(const std::string& rate, double bits_per_s);

  std::string netns_;
  std::string outer_veth_;
  std::string inner_veth_;
  std::string outer_address_;
  std::string inner_address_;
  bool netns_created_ = false;
  bool veth_created_ = false;
};

// One end of a TCP stream: `address` (IPv4) inside namespace `netns` (empty:
// the caller's namespace).
struct TcpEndpoint {
  std::string netns;
  std::string address;
};

// Streams bytes over one TCP connection from `from` to `to` (which listens
// on a free port) for about `duration` and returns the rate the receiver saw,
// in bits/s, timed from its first byte to its last.
absl::StatusOr<double> MeasureTcpStream(const TcpEndpoint& from,
                                        const TcpEndpoint& to,
                                        absl::Duration duration);

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_NETNS_H_
