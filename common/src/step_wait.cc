#include "depot/step_wait.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace depot {
namespace {

// Items printed before the rest is only counted: a message stays one line
// even when half of a thousand workers are missing.
constexpr size_t kMaxRankItems = 16;

// Server addresses a message lists before it only counts the rest.
constexpr size_t kMaxListedServers = 4;

// What one server says about the step, as the predicate of a sentence whose
// subject is one server (`singular`: "is waiting ...") or several
// (`plural`: "are waiting ...").
struct Finding {
  std::string singular;
  std::string plural;
  double waiting_seconds = -1;  // -1: no wait to report
  bool names_workers = false;
  std::vector<std::string> servers;
};

Finding Say(std::string singular, std::string plural) {
  Finding finding;
  finding.singular = std::move(singular);
  finding.plural = std::move(plural);
  return finding;
}

Finding FindingOf(const ServerStepWait& wait, uint64_t step,
                  uint32_t num_workers) {
  if (!wait.status.ok()) {
    const std::string text = absl::StrCat(
        "did not say what it waits for (GetJob: ", wait.status.ToString(), ")");
    return Say(text, text);
  }
  if (wait.pending_step == 0) {
    if (wait.completed_step >= step) {
      const std::string text = absl::StrCat(" completed step ", step);
      return Say("has" + text, "have" + text);
    }
    const std::string text =
        absl::StrCat(" no gradients of step ", step,
                     " (last completed step: ", wait.completed_step, ")");
    return Say("holds" + text, "hold" + text);
  }
  const std::string of_step =
      wait.pending_step == step ? ""
                                : absl::StrCat(" of step ", wait.pending_step);
  Finding finding;
  if (wait.missing_workers.empty()) {
    const std::string text = absl::StrCat(" every worker's gradients", of_step,
                                          " for the chunks sent so far");
    finding = Say(absl::StrCat("has", text, " and is still working on them"),
                  absl::StrCat("have", text, " and are still working on them"));
  } else {
    const std::string text = absl::StrCat(
        " waiting for ", DescribeWorkerRanks(wait.missing_workers, num_workers),
        " to send their gradients", of_step);
    finding = Say("is" + text, "are" + text);
    finding.names_workers = true;
  }
  finding.waiting_seconds = wait.waiting_seconds;
  return finding;
}

// "server A is ... (for 1.9 s)", "servers A, B are ... (for up to 1.9 s)".
std::string DescribeFinding(const Finding& finding) {
  const size_t count = finding.servers.size();
  const size_t listed = std::min(count, kMaxListedServers);
  std::string text =
      absl::StrCat(count == 1 ? "server " : "servers ",
                   absl::StrJoin(finding.servers.begin(),
                                 finding.servers.begin() + listed, ", "));
  if (count > listed) absl::StrAppend(&text, " and ", count - listed, " more");
  absl::StrAppend(&text, " ", count == 1 ? finding.singular : finding.plural);
  if (finding.waiting_seconds >= 0) {
    absl::StrAppend(
        &text, absl::StrFormat(" (for %s%.1f s)", count == 1 ? "" : "up to ",
                               finding.waiting_seconds));
  }
  return text;
}

}  // namespace

std::string DescribeWorkerRanks(const std::vector<uint32_t>& ranks,
                                uint32_t num_workers) {
  if (ranks.empty()) return "no worker rank";
  std::vector<std::string> items;
  size_t ranks_left = 0;  // ranks not in the printed items
  for (size_t i = 0; i < ranks.size();) {
    size_t end = i + 1;
    while (end < ranks.size() && ranks[end] == ranks[end - 1] + 1) ++end;
    if (items.size() == kMaxRankItems) {
      ranks_left += end - i;
    } else if (end - i >= 3) {
      items.push_back(absl::StrCat(ranks[i], "-", ranks[end - 1]));
    } else {
      // One or two consecutive ranks read better listed than as a range.
      items.push_back(absl::StrCat(ranks[i]));
      if (end - i == 2) {
        if (items.size() == kMaxRankItems) {
          ranks_left += 1;
        } else {
          items.push_back(absl::StrCat(ranks[i + 1]));
        }
      }
    }
    i = end;
  }
  std::string text =
      absl::StrCat(ranks.size() == 1 ? "worker rank " : "worker ranks ",
                   absl::StrJoin(items, ", "));
  if (ranks_left > 0) absl::StrAppend(&text, ", and ", ranks_left, " more");
  absl::StrAppend(&text, " (of ", num_workers, ")");
  return text;
}

std::string DescribeStepDeadline(uint64_t step, absl::Duration timeout,
                                 uint32_t num_workers,
                                 const std::vector<ServerStepWait>& servers,
                                 std::string_view first_error) {
  std::vector<Finding> findings;
  for (const ServerStepWait& wait : servers) {
    Finding finding = FindingOf(wait, step, num_workers);
    auto same = std::find_if(
        findings.begin(), findings.end(),
        [&](const Finding& f) { return f.singular == finding.singular; });
    if (same == findings.end()) {
      findings.push_back(std::move(finding));
      same = findings.end() - 1;
    } else {
      same->waiting_seconds =
          std::max(same->waiting_seconds, finding.waiting_seconds);
    }
    same->servers.push_back(wait.server);
  }
  std::vector<std::string> parts;
  bool names_workers = false;
  for (const Finding& finding : findings) {
    parts.push_back(DescribeFinding(finding));
    names_workers = names_workers || finding.names_workers;
  }
  std::string message = absl::StrCat("step ", step, " did not complete within ",
                                     absl::FormatDuration(timeout),
                                     " (ClientOptions::step_timeout)");
  if (!parts.empty())
    absl::StrAppend(&message, ": ", absl::StrJoin(parts, "; "));
  if (names_workers) {
    absl::StrAppend(&message,
                    ". Is every worker running, each with its own rank?");
  }
  absl::StrAppend(&message, " [first error: ",
                  absl::string_view(first_error.data(), first_error.size()),
                  "]");
  return message;
}

}  // namespace depot
