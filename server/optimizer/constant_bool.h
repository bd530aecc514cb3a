// Turns a run-time flag into a compile-time one, so that a kernel's inner loop
// is compiled once per flag value with no branch inside it (and vectorises).
#ifndef DEPOT_SERVER_OPTIMIZER_CONSTANT_BOOL_H_
#define DEPOT_SERVER_OPTIMIZER_CONSTANT_BOOL_H_

#include <type_traits>
#include <utility>

namespace depot {

// Calls f(std::true_type{}) or f(std::false_type{}) as `value` says. Nest calls
// to specialise on several flags.
template <typename F>
decltype(auto) WithConstantBool(bool value, F&& f) {
  if (value) return std::forward<F>(f)(std::true_type{});
  return std::forward<F>(f)(std::false_type{});
}

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_CONSTANT_BOOL_H_
