// JSON text for the programs that print or serve JSON by hand (the status
// endpoint, depotctl): a string literal and a number.
#ifndef DEPOT_JSON_TEXT_H_
#define DEPOT_JSON_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace depot {

// `text` as a JSON string literal, quotes included; control characters,
// quotes and backslashes escaped. Bytes >= 0x80 pass through (the callers'
// strings are UTF-8 or ASCII).
std::string JsonString(absl::string_view text);

// `value` as a JSON number, exact for doubles (%.17g); a NaN or an infinity
// (which JSON cannot say) as null.
std::string JsonNumber(double value);

}  // namespace depot

#endif  // DEPOT_JSON_TEXT_H_
